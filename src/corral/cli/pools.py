"""Node pools on the command line: a project's quotas by pool (`--pool-deserved a100=8
--pool-limit a100=16`) and how `corral project` shows them.

A pool quota given on `project set` changes that pool only: the project's other pools,
and the CPU and memory of this one, stay as they are.
"""

from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import InvalidInput, parse_number, parse_pairs
from corral.model import DEFAULT_POOL, format_gpus
from corral.sdk.types import QueueOut, QueuePoolOut

# What the user typed for `--pool-limit a100=none`: no limit in that pool.
NONE = "none"

PoolDeserved = Annotated[
    list[str] | None,
    typer.Option(
        "--pool-deserved",
        metavar="POOL=GPUS",
        help="GPUs it is guaranteed in one node pool (repeat for more pools).",
        show_default=False,
    ),
]
PoolLimit = Annotated[
    list[str] | None,
    typer.Option(
        "--pool-limit",
        metavar="POOL=GPUS",
        help="At most this many GPUs in one node pool (none: no limit there).",
        show_default=False,
    ),
]


def pool_quotas(
    deserved: list[str] | None,
    limits: list[str] | None,
    current: dict[str, QueuePoolOut] | None = None,
) -> dict[str, Any] | None:
    """The `pools` of a queue's body with the options given merged into `current` (the
    queue's pools as the API shows them); None when no pool option was given."""
    if not deserved and not limits:
        return None
    pools: dict[str, Any] = {}
    for pool, shown in (current or {}).items():
        if shown["own_quota"]:
            pools[pool] = {"deserved": dict(shown["deserved"]), "limit": dict(shown["limit"])}
    for pool, text in _pairs("--pool-deserved", deserved):
        entry = pools.setdefault(pool, {"deserved": {}, "limit": {}})
        entry["deserved"]["gpu"] = parse_number("--pool-deserved", text, "a number of GPUs")
    for pool, text in _pairs("--pool-limit", limits):
        entry = pools.setdefault(pool, {"deserved": {}, "limit": {}})
        gpus = None if text.strip().lower() == NONE else parse_number("--pool-limit", text, "GPUs")
        entry["limit"]["gpu"] = gpus
    return pools


def _pairs(flag: str, items: list[str] | None) -> list[tuple[str, str]]:
    pairs = parse_pairs(flag, items or [])
    for pool, _ in pairs:
        if pool == DEFAULT_POOL:
            raise InvalidInput(
                f"{flag}: the default pool's quota is the project's own --deserved and --limit"
            )
    return pairs


def pools_sentence(queue: QueueOut) -> str:
    """ " Pools: a100 deserved 8, limit 16; v100 deserved 2." for the pools it sets."""
    parts = []
    for pool, shown in queue.get("pools", {}).items():
        if not shown["own_quota"]:
            continue
        text = f"{pool} deserved {format_gpus(shown['deserved']['gpu'] or 0.0)}"
        limit = shown["limit"]["gpu"]
        if limit is not None:
            text += f", limit {format_gpus(limit)}"
        parts.append(text)
    return f" Pools: {'; '.join(parts)}." if parts else ""


def pool_tables(queues: list[QueueOut]) -> list[Table]:
    """One table per node pool the latest cycle divided (none while pools are not in
    use): each queue's deserved quota, fair share, allocation and limit there."""
    names = sorted({pool for queue in queues for pool in queue.get("pools", {})})
    tables = []
    for pool in names:
        table = Table(title=f"Queues in pool {pool} (GPUs)", title_justify="left")
        table.add_column("queue")
        for column in ("deserved", "fair share", "allocated", "limit"):
            table.add_column(column, justify="right")
        for queue in sorted(queues, key=lambda q: q["name"]):
            shown = queue.get("pools", {}).get(pool)
            if shown is None:
                continue
            table.add_row(
                queue["name"],
                _gpus(shown["deserved"]["gpu"], "0"),
                _gpus(shown["fair_share"]["gpu"] if shown["fair_share"] else None, "-"),
                _gpus(shown["allocated"]["gpu"] if shown["allocated"] else None, "-"),
                _gpus(shown["limit"]["gpu"], "none"),
            )
        tables.append(table)
    return tables


def _gpus(amount: float | None, empty: str) -> str:
    return empty if amount is None else format_gpus(amount)
