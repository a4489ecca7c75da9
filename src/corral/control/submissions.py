"""Submissions from the event loop to the store, in batches (`GroupWriter`): the writer
thread writes every queued submission in one transaction (`Store.submit_many`), with the
Idempotency-Keys and the audit records they came with, and wakes the scheduler once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from corral.control.group_commit import GroupWriter
from corral.model.spec import WorkloadSpec
from corral.store import Store, WorkloadRecord
from corral.store.audit import AuditRecord
from corral.store.idempotency import Idempotency

log = logging.getLogger("corral.submissions")
Outcome = WorkloadRecord | Exception
# A submission: its spec, the request's Idempotency-Key and audit record.
Item = tuple[WorkloadSpec, Idempotency | None, AuditRecord | None]


class Submissions:
    def __init__(self, store: Store, written: Callable[[], None]) -> None:
        self.store = store
        # Called after each batch that was written (the scheduler's trigger).
        self.written = written
        self._writer: GroupWriter[Item, WorkloadRecord] = GroupWriter(
            "corral-submissions", self._write, self._written
        )

    async def submit(
        self, spec: WorkloadSpec, key: Idempotency | None = None, audit: AuditRecord | None = None
    ) -> WorkloadRecord:
        """Write `spec` as a pending workload, with the request's Idempotency-Key `key`
        and its audit record `audit` in the same transaction; returns it once committed,
        or raises what `Store.submit_many` gives (`Replayed` for a key used before)."""
        return await self._writer.put((spec, key, audit))

    def stop(self) -> None:
        """Write what is queued, then end the writer."""
        self._writer.stop()

    def _write(self, batch: list[Item]) -> list[Outcome]:
        outcomes: list[Outcome]
        try:
            outcomes = self.store.submit_many(
                [spec for spec, _, _ in batch],
                [key for _, key, _ in batch],
                [audit for _, _, audit in batch],
            )
        except Exception as error:  # the store failed as a whole: every one gets it
            log.exception("writing %d submissions failed", len(batch))
            outcomes = [error] * len(batch)
        return outcomes

    def _written(self, outcomes: Sequence[Outcome]) -> None:
        # The scheduler is woken once the callers have their answers: its cycle would
        # otherwise take the interpreter from the answers on their way out.
        if any(not isinstance(outcome, Exception) for outcome in outcomes):
            self.written()
