"""Between the store and the agents: what to start and stop, and what the agents report.

Decisions are in the store before any agent hears of them. After each cycle the
dispatcher tells the agents at once; a reconciler also compares, every few seconds, what
the store binds to each node with what its agent runs, so that a lost message, a crash
between commit and dispatch, or a restart of the server heals by itself: bound tasks that
do not run are started (or adopted, when their process survived a restart), and tasks
that run but are no longer bound are stopped.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from corral.cluster import Cluster
from corral.messages import TaskLaunch, TaskStop
from corral.model import Placement
from corral.model.telemetry import Sample
from corral.server.accounts import unix_users
from corral.store import NotFound, Store
from corral.store.records import BoundWork, Release
from corral.store.telemetry import record_samples

log = logging.getLogger("corral.dispatch")


def releases_of(workload: str, placements: Sequence[Placement], why: str) -> list[Release]:
    """The releases that stop all of a workload's placed tasks, one per node, by node name."""
    return [
        Release(workload, node, tuple(p.task for p in placements if p.node == node), why)
        for node in sorted({p.node for p in placements})
    ]


def launches(
    work: BoundWork, node: str | None = None, accounts: Mapping[str, str | None] | None = None
) -> list[TaskLaunch]:
    """The launches of a workload's bound tasks (on `node` only, when given), with the
    environment each task sees: its devices, its place in the gang. The agent adds the
    paths of the workload's own directory (checkpoints, telemetry), which it creates.
    `accounts` gives the Unix account of each corral user (the submitter's is carried)."""
    spec = work.workload.spec
    ordered = sorted(work.tasks, key=lambda t: t.task)
    nodes_in_order = list(dict.fromkeys(t.node for t in ordered))
    master = ordered[0]
    port = 20000 + zlib.crc32(spec.name.encode()) % 20000
    result = []
    for state in ordered:
        if state.state == "exited" or (node is not None and state.node != node):
            continue
        local = [t.task for t in ordered if t.node == state.node]
        devices = ",".join(str(device) for device in state.devices)
        env = dict(spec.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": devices,
                "NVIDIA_VISIBLE_DEVICES": devices if devices else "void",
                "CORRAL_WORKLOAD": spec.name,
                "CORRAL_PROJECT": spec.project,
                "CORRAL_TASK_INDEX": str(state.task),
                "CORRAL_ATTEMPT": str(work.workload.attempts),
                "MASTER_ADDR": master.address,
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(len(ordered)),
                "RANK": str(state.task),
                "LOCAL_RANK": str(local.index(state.task)),
                "NODE_RANK": str(nodes_in_order.index(state.node)),
            }
        )
        if 0 < state.gpu < 1:
            env["CORRAL_GPU_FRACTION"] = f"{state.gpu:g}"
            env["CORRAL_GPU_MEMORY_LIMIT"] = str(int(state.gpu * state.device_memory))
            # TensorFlow would otherwise take the whole device at start.
            env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        result.append(
            TaskLaunch(
                workload=spec.name,
                project=spec.project,
                task=state.task,
                attempt=work.workload.attempts,
                node=state.node,
                devices=state.devices,
                gpu=state.gpu,
                command=spec.command,
                env=env,
                workdir=spec.workdir,
                max_runtime=spec.max_runtime,
                grace=spec.grace_period,
                pid=state.pid if state.state == "running" else None,
                proc_start=state.proc_start if state.state == "running" else None,
                unix_user=(accounts or {}).get(spec.user) if spec.user else None,
            )
        )
    return result


class Dispatcher:
    """Tells the cluster what the store decided, and the store what the agents report."""

    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        data_dir: Path,
        wake_scheduler: Callable[[], None],
        node_timeout: float = 30.0,
        reconcile_interval: float = 2.0,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.data_dir = data_dir
        self.wake_scheduler = wake_scheduler
        self.node_timeout = node_timeout
        self.reconcile_interval = reconcile_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Jobs the monitor runs after each reconciliation (telemetry rollups, rules).
        self.upkeep: list[Callable[[], None]] = []

    # -- after a cycle, a deletion or a suspension ---------------------------------------

    def started(self, names: set[str]) -> None:
        if names:
            work = self.store.bound_work(names=names)
            accounts = unix_users(self.store)
            self.cluster.start([launch for w in work for launch in launches(w, None, accounts)])

    def release(self, releases: list[Release], grace_period: float | None = None) -> None:
        """Stop released tasks, each after its workload's grace period (or the one given,
        for a workload that is already deleted)."""
        if not releases:
            return
        grace: dict[str, float] = {}
        stops = []
        for release in releases:
            if release.workload not in grace:
                grace[release.workload] = (
                    grace_period if grace_period is not None else self._grace(release.workload)
                )
            stops.append(
                TaskStop(
                    release.workload,
                    release.node,
                    release.tasks,
                    release.reason,
                    grace[release.workload],
                )
            )
        self.cluster.stop(stops)

    def _grace(self, workload: str) -> float:
        try:
            return self.store.get_workload(workload).spec.grace_period
        except NotFound:
            # Deleted meanwhile: stop with the default grace period.
            return 30.0

    # -- what agents report (corral.cluster.Reports) -------------------------------------

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        if not self.store.task_started(workload, task, pid, proc_start):
            self.cluster.stop([TaskStop(workload, node, (task,), "no longer bound", 0.0)])

    def task_ended(
        self, node: str, workload: str, task: int, exit_code: int | None, reason: str
    ) -> None:
        self.release(self.store.task_ended(workload, task, exit_code, reason))
        self.wake_scheduler()

    def heartbeat(self, node: str) -> None:
        self.store.heartbeat(node)

    def samples(self, node: str, samples: list[Sample]) -> None:
        record_samples(self.store, samples)

    # -- reconciling -------------------------------------------------------------------

    def reconcile(self) -> None:
        """Make every node's agent run exactly what the store binds to it."""
        accounts = unix_users(self.store)
        for record in self.store.list_nodes():
            node = record.node.name
            running = self.cluster.running(node)
            if running is None:
                continue
            wanted = []
            for work in self.store.bound_work(node=node):
                wanted.extend(launches(work, node, accounts))
            keys = {launch.key for launch in wanted}
            missing = [launch for launch in wanted if launch.key not in running]
            if missing:
                self.cluster.start(missing)
            extra: dict[str, list[int]] = {}
            for workload, task in running - keys:
                extra.setdefault(workload, []).append(task)
            if extra:
                self.cluster.stop(
                    [
                        TaskStop(
                            workload,
                            node,
                            tuple(sorted(tasks)),
                            "no longer bound here",
                            self._grace(workload),
                        )
                        for workload, tasks in sorted(extra.items())
                    ]
                )

    def start_monitor(self) -> None:
        self._thread = threading.Thread(target=self._monitor, name="corral-monitor", daemon=True)
        self._thread.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _monitor(self) -> None:
        while not self._stop.wait(self.reconcile_interval):
            try:
                if self.store.expire_nodes(self.node_timeout):
                    self.wake_scheduler()
                self.reconcile()
            except Exception:
                log.exception("reconciling failed")
            for job in self.upkeep:
                try:
                    job()
                except Exception:
                    log.exception("upkeep failed")
