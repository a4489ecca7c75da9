"""Queue rules in the API (their enforcement is the monitor's: corral.control.upkeep).

A queue's `rules` (see corral.store.rules) are given per workload class:

    "rules": {"interactive": {"idle_timeout": "30m"}, "train": {"max_runtime": "2d"}}

Durations are seconds or strings such as "90s", "30m", "4h", "2d".
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.model.durations import parse_duration
from corral.store.rules import RuleSet

Duration = float | str


class RuleIn(BaseModel):
    """Limits for one workload class; a limit left out or null is no limit."""

    model_config = ConfigDict(extra="forbid")

    idle_timeout: Duration | None = Field(
        None, description="suspend when every GPU of the workload has been at 0% this long"
    )
    max_runtime: Duration | None = Field(
        None, description="stop as failed when it has run this long since it was last bound"
    )

    @field_validator("idle_timeout", "max_runtime")
    @classmethod
    def _duration(cls, value: Duration | None) -> Duration | None:
        if value is not None:
            parse_duration(value)
        return value

    def seconds(self) -> dict[str, float | None]:
        return {
            "idle_timeout": _or_none(self.idle_timeout),
            "max_runtime": _or_none(self.max_runtime),
        }


def _or_none(value: Duration | None) -> float | None:
    return None if value is None else parse_duration(value)


class RulesIn(BaseModel):
    """Rules by workload class; "interactive" is another name for "build"."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    train: RuleIn | None = None
    build_preemptible: RuleIn | None = Field(None, alias="build-preemptible")
    build: RuleIn | None = None
    interactive: RuleIn | None = None
    interactive_preemptible: RuleIn | None = Field(None, alias="interactive-preemptible")
    inference: RuleIn | None = None

    @model_validator(mode="after")
    def _one_name_per_class(self) -> RulesIn:
        if self.build is not None and self.interactive is not None:
            raise ValueError("give build or interactive (the same class), not both")
        if self.build_preemptible is not None and self.interactive_preemptible is not None:
            raise ValueError(
                "give build-preemptible or interactive-preemptible (the same class), not both"
            )
        return self

    def by_class(self) -> dict[str, dict[str, float | None]]:
        """The rules given, by class name as the store keeps them, in seconds."""
        given = {
            "train": self.train,
            "build-preemptible": self.build_preemptible or self.interactive_preemptible,
            "build": self.build or self.interactive,
            "inference": self.inference,
        }
        return {name: rule.seconds() for name, rule in given.items() if rule is not None}


class RuleOut(BaseModel):
    idle_timeout: float | None = Field(description="seconds; null: no limit")
    max_runtime: float | None = Field(description="seconds; null: no limit")


def rules_out(rules: RuleSet) -> dict[str, RuleOut]:
    """The rules a queue sets itself (`corral.store.rules.queue_rules`), by class (train,
    build-preemptible, build, inference), as the API answers them."""
    return {
        name: RuleOut(
            idle_timeout=limits.get("idle_timeout"), max_runtime=limits.get("max_runtime")
        )
        for name, limits in sorted(rules.items())
    }


def rules_payload(body: Any) -> dict[str, dict[str, float | None]] | None:
    """The rules of a QueueIn or QueuePatch body, for corral.store.rules.set_rules."""
    rules = getattr(body, "rules", None)
    return rules.by_class() if isinstance(rules, RulesIn) else None
