"""The upkeep the dispatcher's monitor runs every few seconds: telemetry rollups and the
enforcement of queue rules (idle timeouts, maximum runtimes; see corral.store.rules)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from corral.control.metrics import SchedulerMetrics
from corral.store import Store
from corral.store.records import Release
from corral.store.rules import enforce_rules
from corral.store.telemetry import rollup

log = logging.getLogger("corral.rules")


class Upkeep:
    """Called by the dispatcher's monitor every few seconds: rolls telemetry up once a
    minute, and enforces queue rules, stopping the processes of what a rule stopped."""

    def __init__(
        self,
        store: Store,
        release: Callable[[list[Release]], None],
        wake: Callable[[], None],
        metrics: SchedulerMetrics,
        rollup_interval: float = 60.0,
    ) -> None:
        self.store = store
        self.release = release
        self.wake = wake
        self.metrics = metrics
        self.rollup_interval = rollup_interval
        self._last_rollup: float | None = None

    def __call__(self) -> None:
        now = time.time()
        if self._last_rollup is None or now - self._last_rollup >= self.rollup_interval:
            self._last_rollup = now
            result = rollup(self.store, now)
            if result.raw_deleted or result.minutes_deleted:
                log.info(
                    "telemetry: %d raw samples and %d minutes past retention deleted",
                    result.raw_deleted,
                    result.minutes_deleted,
                )
        enforced = enforce_rules(self.store, now)
        for item in enforced:
            log.info("%s %s: %s", item.rule.field, item.record.name, item.reason)
            self.metrics.rule_applied(item.rule.field)
            self.release(item.releases)
        if enforced:
            self.wake()
