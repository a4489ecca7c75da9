"""Time-decayed usage on the simulation's virtual clock, kept as the server keeps it in
its store: one `model.usage.DecayedUsage` per queue where the policy is on, advanced with
`model.usage.advance` at every change of what the queues hold, so the history is exact
for the allocations the simulation makes."""

from __future__ import annotations

from collections.abc import Sequence

from corral.model import Queue
from corral.model.usage import DecayedUsage, advance, decay_settings


class UsageHistory:
    """Each queue's GPUs held (its subtree's) and decayed usage, on a virtual clock."""

    def __init__(self, queues: Sequence[Queue]) -> None:
        self.settings = decay_settings(queues)
        parents = {queue.name: queue.parent for queue in queues}
        # Each queue and its ancestors, as far as they are known.
        self.paths: dict[str, list[str]] = {}
        for queue in queues:
            path = [queue.name]
            parent = queue.parent
            while parent is not None and parent in parents and parent not in path:
                path.append(parent)
                parent = parents[parent]
            self.paths[queue.name] = path
        self.held = dict.fromkeys(parents, 0.0)
        self.total = 0.0
        self.records = {name: DecayedUsage() for name in self.settings}
        self.at = 0.0

    @property
    def on(self) -> bool:
        """Whether any queue has time-decayed fair share on."""
        return bool(self.settings)

    def change(self, queue: str, gpus: float, now: float) -> None:
        """`queue` holds `gpus` more (fewer, when negative) from `now` on."""
        if not self.on:
            return
        self.advance(now)
        for level in self.paths[queue]:
            self.held[level] += gpus
        self.total += gpus

    def advance(self, now: float) -> None:
        """Bring every record up to `now`."""
        elapsed = now - self.at
        if elapsed <= 0:
            return
        for name, setting in self.settings.items():
            self.records[name] = advance(
                self.records[name], self.held[name], self.total, elapsed, setting.half_life
            )
        self.at = now

    def shares(self, now: float) -> dict[str, float]:
        """Each tracked queue's usage share at `now`, as the snapshot carries it."""
        self.advance(now)
        return {name: record.share for name, record in self.records.items()}
