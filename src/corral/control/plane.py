"""The server's work beside its requests, in one place: the scheduler loop, the writer of
submissions, and with a cluster the dispatcher, its reconciler and the monitor's upkeep.
Built once and handed to the API; the application starts and stops it with its lifespan
(`corral.server.app`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from pathlib import Path

from corral.cluster import Cluster
from corral.control.admission import Admission
from corral.control.dispatch import Dispatcher
from corral.control.scheduler import SchedulerLoop
from corral.control.scheduler_process import SchedulerProcess
from corral.control.snapshots import CodeStore
from corral.control.submissions import Submissions
from corral.control.upkeep import Upkeep
from corral.control.watch import Changes
from corral.model import Decisions, SchedulerConfig
from corral.store import Store, WorkloadRecord
from corral.store.records import Release

# The scheduler loop, in this process or in a child of its own.
Loop = SchedulerLoop | SchedulerProcess


class ControlPlane:
    """The loop, the submissions and (with a cluster) the dispatcher of one server."""

    def __init__(
        self,
        store: Store,
        *,
        config: SchedulerConfig | None = None,
        cluster: Cluster | None = None,
        interval: float = 1.0,
        run_scheduler: bool = True,
        data_dir: Path | None = None,
        node_timeout: float = 30.0,
        scheduler_process: bool = False,
    ) -> None:
        self.cluster = cluster
        self.data_dir = data_dir
        # Projects' code snapshots, kept beside the logs (none without a data directory).
        self.code = CodeStore(data_dir / "code") if data_dir is not None else None
        self.run_scheduler = run_scheduler
        # In a process of its own, the scheduler takes no time from the API's
        # interpreter (corral.control.scheduler_process).
        self.loop: Loop = (
            SchedulerProcess(store.url, config, interval)
            if scheduler_process
            else SchedulerLoop(store, config, interval)
        )
        self.submissions = Submissions(store, self.loop.trigger)
        self.admission = Admission(store, self.loop.shape)
        # Requests waiting for workloads to change (GET /workloads/NAME?until=...).
        self.changes = Changes()
        self.loop.on_changes = self._changed
        self.dispatcher: Dispatcher | None = None
        if cluster is not None:
            if data_dir is None:
                raise ValueError("a cluster needs the data directory for logs and checkpoints")
            self.dispatcher = Dispatcher(
                store, cluster, data_dir, self.loop.trigger, node_timeout, code=self.code
            )
            self.dispatcher.ended = self.changes.changed
            self.dispatcher.upkeep.append(
                Upkeep(store, self.dispatcher.release, self.loop.trigger, self.loop.metrics)
            )

    def _changed(self, decisions: Decisions, releases: list[Release]) -> None:
        """After a cycle that changed something: wake the requests waiting on its
        workloads, stop what it released, start what it bound."""
        self.changes.changed(
            chain(
                decisions.bindings,
                (e.workload for e in decisions.evictions),
                (r.workload for r in releases),
            )
        )
        if self.dispatcher is not None:
            self.dispatcher.release(releases)
            self.dispatcher.started(set(decisions.bindings))

    def released(self, records: Sequence[WorkloadRecord], releases: list[Release]) -> None:
        """Stop the tasks named by the store's `releases` (stamped in its transaction), each
        workload's after its grace period, as `records` (the workloads before the change)
        give it."""
        if self.dispatcher is None:
            return
        grace = {record.name: record.spec.grace_period for record in records}
        by_workload: dict[str, list[Release]] = {}
        for release in releases:
            by_workload.setdefault(release.workload, []).append(release)
        for workload, stopped in by_workload.items():
            self.dispatcher.release(stopped, grace.get(workload))

    def forget(self, deleted: WorkloadRecord) -> None:
        """A deleted workload's files go: its logs on the server, and what its agents keep
        (run files, its own directory with its checkpoints) once its tasks have gone, on
        one machine and on every node whose agent can (see Cluster.forget). Its events
        stay in the store."""
        forget = getattr(self.cluster, "forget", None)
        if forget is not None:
            forget(deleted.directory)

    def start(self) -> None:
        """Connect the cluster, adopt what survived a restart and start what was decided
        but not started; start the monitor and the scheduler loop."""
        if self.dispatcher is not None and self.cluster is not None:
            self.cluster.connect(self.dispatcher)
            self.dispatcher.reconcile()
            self.dispatcher.start_monitor()
        if self.run_scheduler:
            self.loop.start()
            self.loop.trigger()

    def stop(self) -> None:
        """Write the submissions queued, then stop the loop, the monitor and the cluster."""
        self.submissions.stop()
        self.loop.stop()
        if self.dispatcher is not None:
            self.dispatcher.stop_monitor()
        if self.cluster is not None:
            self.cluster.close()
