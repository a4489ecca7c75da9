"""Submissions from the event loop to the store, in batches (`GroupWriter`): the writer
thread writes every queued submission in one transaction (`Store.submit_many`), with the
Idempotency-Keys they came with, and wakes the scheduler once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from corral.model.spec import WorkloadSpec
from corral.server.group_commit import GroupWriter
from corral.store import Store, WorkloadRecord
from corral.store.idempotency import Idempotency

log = logging.getLogger("corral.submissions")
Outcome = WorkloadRecord | Exception


class Submissions:
    def __init__(self, store: Store, written: Callable[[], None]) -> None:
        self.store = store
        # Called after each batch that was written (the scheduler's trigger).
        self.written = written
        self._writer: GroupWriter[tuple[WorkloadSpec, Idempotency | None], WorkloadRecord] = (
            GroupWriter("corral-submissions", self._write)
        )

    async def submit(self, spec: WorkloadSpec, key: Idempotency | None = None) -> WorkloadRecord:
        """Write `spec` as a pending workload, with the request's Idempotency-Key `key`
        in the same transaction; returns it once committed, or raises what
        `Store.submit_many` gives (`Replayed` for a key used before)."""
        return await self._writer.put((spec, key))

    def stop(self) -> None:
        """Write what is queued, then end the writer."""
        self._writer.stop()

    def _write(self, batch: list[tuple[WorkloadSpec, Idempotency | None]]) -> list[Outcome]:
        outcomes: list[Outcome]
        try:
            outcomes = self.store.submit_many(
                [spec for spec, _ in batch], [key for _, key in batch]
            )
        except Exception as error:  # the store failed as a whole: every one gets it
            log.exception("writing %d submissions failed", len(batch))
            outcomes = [error] * len(batch)
        if any(not isinstance(outcome, Exception) for outcome in outcomes):
            self.written()
        return outcomes
