"""The invariants the chaos suite checks after every kill, as pure functions over plain
data, so that each can be shown to catch a planted violation (test_invariants.py).

Each function returns the violations it found (empty when the invariant holds) and adds
how many items it looked at to a `Tally`, which the suite prints.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

EPSILON = 1e-6
# Events after which a workload's status is settled; the last of them tells what it is.
SETTLING = ("bound", "preempted", "retrying", "succeeded", "failed")


@dataclass
class Tally:
    """How many times each invariant was evaluated and how many items it covered."""

    evaluations: Counter[str] = field(default_factory=Counter)
    items: Counter[str] = field(default_factory=Counter)

    def count(self, invariant: str, items: int) -> None:
        self.evaluations[invariant] += 1
        self.items[invariant] += items

    def summary(self) -> str:
        return ", ".join(
            f"{name} {self.evaluations[name]}x ({self.items[name]} items)"
            for name in sorted(self.evaluations)
        )


@dataclass(frozen=True)
class TaskProcess:
    """A task's command as found in /proc: its process, its group (the launcher's pid,
    which the agent records), and what its environment says it is."""

    pid: int
    group: int
    workload: str
    task: int
    devices: tuple[int, ...]
    share: float  # of each of its devices


@dataclass(frozen=True)
class Binding:
    """What the server says of one bound task: its devices and its launcher's pid (None
    until the agent reported the start)."""

    devices: tuple[int, ...]
    share: float
    launcher: int | None


@dataclass(frozen=True)
class StoredWorkload:
    """One workload as the store holds it."""

    name: str
    tag: str | None  # the submitter's sequence tag, from its environment
    status: str
    placements: int
    last_settling_event: str | None
    reason: str | None = None


def submissions(
    acknowledged: Mapping[str, str], sent: set[str], stored: Sequence[StoredWorkload], tally: Tally
) -> list[str]:
    """Every acknowledged submission (tag -> name) is stored exactly once under its name;
    nothing is stored that was never sent."""
    tally.count("submissions", len(acknowledged))
    problems = []
    tags = Counter(workload.tag for workload in stored)
    problems += [f"{tag} is stored {n} times" for tag, n in sorted(tags.items()) if n > 1]
    problems += [f"{tag} was never sent" for tag in sorted(set(tags) - sent, key=str)]
    # Stored under its key, PROJECT/NAME; acknowledged by its name.
    names = {workload.tag: workload.name.rpartition("/")[2] for workload in stored}
    for tag, name in sorted(acknowledged.items()):
        if names.get(tag) != name:
            problems.append(f"acknowledged {tag} ({name}) is lost")
    return problems


def requeued(stored: Sequence[StoredWorkload], tally: Tally) -> list[str]:
    """A workload whose last settling event is a preemption is pending again, or still
    running on the tasks it kept (an elastic workload that shrank)."""
    preempted = [w for w in stored if w.last_settling_event == "preempted"]
    tally.count("preempted-requeued", len(preempted))
    return [
        f"{w.name} was preempted but is {w.status} with {w.placements} placements"
        for w in preempted
        if not (
            (w.status == "pending" and w.placements == 0)
            or (w.status == "running" and w.placements > 0)
        )
    ]


def overcommit(uses: Iterable[tuple[str, int, float]], what: str, tally: Tally) -> list[str]:
    """No device holds more than one whole GPU of work: `uses` are (node, device, share)."""
    held: dict[tuple[str, int], float] = defaultdict(float)
    for node, device, share in uses:
        held[(node, device)] += share
    tally.count(f"devices-{what}", len(held))
    return [
        f"{what}: {node} device {device} is committed {used:.2f} times"
        for (node, device), used in sorted(held.items())
        if used > 1 + EPSILON
    ]


def processes(
    found: Sequence[TaskProcess], bound: Mapping[tuple[str, int], Binding], tally: Tally
) -> list[str]:
    """Every task process runs a task the server binds, on the devices (and the share of
    each) it was given, is the very process the server recorded, and no task runs in two
    process groups."""
    tally.count("processes-known", len(found))
    problems = []
    groups: dict[tuple[str, int], set[int]] = defaultdict(set)
    for process in found:
        key = (process.workload, process.task)
        groups[key].add(process.group)
        binding = bound.get(key)
        label = f"{process.workload}/{process.task} (pid {process.pid})"
        if binding is None:
            problems.append(f"{label} runs but is not bound")
            continue
        if binding.devices != process.devices or abs(binding.share - process.share) > EPSILON:
            problems.append(
                f"{label} runs on {process.devices} x {process.share:g}, "
                f"bound to {binding.devices} x {binding.share:g}"
            )
        if binding.launcher is not None and binding.launcher != process.group:
            problems.append(f"{label} is not the process the server knows ({binding.launcher})")
    tally.count("no-task-twice", len(groups))
    problems += [
        f"{workload}/{task} runs {len(launchers)} times: groups {sorted(launchers)}"
        for (workload, task), launchers in sorted(groups.items())
        if len(launchers) > 1
    ]
    return problems
