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
import math
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from corral.cluster import Cluster
from corral.control.accounts import unix_users
from corral.control.reports import ReportWriter
from corral.control.snapshots import CodeStore
from corral.messages import TaskLaunch, TaskStop
from corral.model import DEFAULT_GRACE_PERIOD
from corral.model.spec import NodeSpec, short_name
from corral.model.telemetry import Sample
from corral.model.types import group_of
from corral.store import NotFound, Store
from corral.store.records import BoundWork, NodeState, Release
from corral.store.reports import Beat, Checkpointed, Ended, Outcome, Started
from corral.store.telemetry import record_samples

# The longest note of a task's preparation kept (what an agent says is not trusted).
PREPARING_MAX = 200

log = logging.getLogger("corral.dispatch")


Rendezvous = Callable[[str, int, str], tuple[str, int]]


def local_rendezvous(workload: str, attempt: int, node: str) -> tuple[str, int]:
    """A port free on this machine, for a cluster whose agents run here."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
    return "", port


def launches(
    work: BoundWork,
    node: str | None = None,
    rendezvous: Rendezvous = local_rendezvous,
    accounts: Mapping[str, str | None] | None = None,
    secrets: Mapping[str, str] | None = None,
    decided_at: float | None = None,
) -> list[TaskLaunch]:
    """The launches of a workload's bound tasks (on `node` only, when given), with the
    environment each task sees: its own variables and `secrets` (variable -> value, see
    Store.secret_env), then its devices, its place in the gang. The agent adds the
    paths of the workload's own directory (checkpoints, telemetry), which it creates.
    `rendezvous(workload, attempt, node)` gives the address and a free port of rank 0's
    node ("" for the address the store knows); `accounts` gives the Unix account of each
    corral user (the submitter's is carried)."""
    spec = work.workload.spec
    ordered = sorted(work.tasks, key=lambda t: t.task)
    nodes_in_order = list(dict.fromkeys(t.node for t in ordered))
    master = ordered[0]
    # Only a gang needs its rank 0's agent asked; a single task's agent (or this machine,
    # for local agents) finds its own port.
    ask = rendezvous if len(ordered) > 1 else local_rendezvous
    address, port = ask(spec.name, work.workload.attempts, master.node)
    result = []
    for state in ordered:
        if state.state == "exited" or (node is not None and state.node != node):
            continue
        local = [t.task for t in ordered if t.node == state.node]
        devices = ",".join(str(device) for device in state.devices)
        env = dict(spec.env)
        env.update(secrets or {})
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": devices,
                "NVIDIA_VISIBLE_DEVICES": devices if devices else "void",
                # Its name within its project (a key's "/" would make a path of it).
                "CORRAL_WORKLOAD": short_name(spec.name),
                "CORRAL_PROJECT": spec.project,
                "CORRAL_TASK_INDEX": str(state.task),
                "CORRAL_ATTEMPT": str(work.workload.attempts),
                "MASTER_ADDR": address or master.address,
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(len(ordered)),
                "RANK": str(state.task),
                "LOCAL_RANK": str(local.index(state.task)),
                "NODE_RANK": str(nodes_in_order.index(state.node)),
            }
        )
        if spec.array is not None:
            env["CORRAL_ARRAY_NAME"] = short_name(spec.array.name)
            env["CORRAL_ARRAY_INDEX"] = str(spec.array.index)
        group = group_of(spec.task_groups, state.task)
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
                launch=state.launch,
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
                ports=tuple(port.name for port in spec.ports),
                decided_at=decided_at,
                directory=work.workload.directory,
                cpu=group.cpu,
                memory=group.memory,
                code=spec.code,
                python=spec.python,
                image=spec.image,
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
        code: CodeStore | None = None,
    ) -> None:
        self.store = store
        self.cluster = cluster
        self.data_dir = data_dir
        # The projects' code snapshots, which agents ask for (`code`): the control plane's.
        self.code_store = code or CodeStore(data_dir / "code")
        self.wake_scheduler = wake_scheduler
        self.node_timeout = node_timeout
        self.reconcile_interval = reconcile_interval
        # No node is declared lost before a node timeout has passed since this start.
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # An optional capability of a cluster (corral.cluster): where rank 0's agent finds
        # a free port.
        self._rendezvous: Rendezvous = getattr(cluster, "rendezvous", local_rendezvous)
        # The port of each gang's attempt, so that every launch of it (the reconciler's
        # too) names the same one; old attempts fall out.
        self._ports: OrderedDict[tuple[str, int], tuple[str, int]] = OrderedDict()
        self._ports_lock = threading.Lock()
        # Jobs the monitor runs after each reconciliation (telemetry rollups, rules).
        self.upkeep: list[Callable[[], None]] = []
        # Told the workloads whose task ends were taken in.
        self.ended: Callable[[Collection[str]], None] | None = None
        self.reports = ReportWriter(store, self._reported)

    # -- after a cycle, a deletion or a suspension ---------------------------------------

    def launches(
        self,
        work: BoundWork,
        node: str | None,
        accounts: Mapping[str, str | None],
        decided_at: float,
    ) -> list[TaskLaunch]:
        """The launches of a bound workload (on `node` only, when given); `accounts` as
        `unix_users` gives them, read once by the caller for all its workloads;
        `decided_at`: the time after `work` was read (see corral.messages). Its
        secrets are decrypted only here, at the last moment, and never logged."""
        secrets = self.store.secret_env(work.workload.spec)
        return launches(work, node, self.rendezvous, accounts, secrets, decided_at)

    def rendezvous(self, workload: str, attempt: int, node: str) -> tuple[str, int]:
        """Rank 0's address and port for this attempt of the workload, asked once."""
        key = (workload, attempt)
        with self._ports_lock:
            found = self._ports.get(key)
        if found is None:
            try:
                found = self._rendezvous(workload, attempt, node)
            except Exception as error:
                # Rank 0's agent cannot answer (its node is being lost): one launch with
                # a port of no use rather than a failed cycle or reconciliation; the next
                # launch asks again.
                log.warning("no rendezvous for %s on %s: %s", workload, node, error)
                return local_rendezvous(workload, attempt, node)
            with self._ports_lock:
                found = self._ports.setdefault(key, found)
                while len(self._ports) > 100_000:
                    self._ports.popitem(last=False)
        return found

    def started(self, names: set[str]) -> None:
        if names:
            work = self.store.bound_work(names=names)
            read = time.time()
            accounts = unix_users(self.store)
            self.cluster.start(
                [launch for w in work for launch in self.launches(w, None, accounts, read)]
            )

    def release(self, releases: list[Release], grace_period: float | None = None) -> None:
        """Stop released tasks, each after its workload's grace period (or the one given,
        for a workload that is already deleted)."""
        if not releases:
            return
        grace: dict[str, float] = {}
        stops: list[TaskStop] = []
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
                    release.decided_at,
                )
            )
        self.cluster.stop(stops)

    def _grace(self, workload: str) -> float:
        try:
            return self.store.get_workload(workload).spec.grace_period
        except NotFound:
            # Deleted meanwhile: stop with the default grace period.
            return DEFAULT_GRACE_PERIOD

    # -- what agents report (corral.cluster.Reports) -------------------------------------

    # Queued, and written many in one transaction (see corral.control.reports).

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        self.reports.put(Started(node, workload, task, pid, proc_start))

    def task_ports(self, node: str, workload: str, task: int, ports: Mapping[str, int]) -> None:
        self.store.task_ports(workload, task, ports, node)

    def code(self, project: str, digest: str) -> bytes:
        return self.code_store.read(project, digest)

    def task_preparing(self, node: str, workload: str, task: int, what: str) -> None:
        # What the transport carried is checked here: a line of text, kept short.
        if isinstance(what, str) and what:
            self.store.task_preparing(workload, task, node, what.splitlines()[0][:PREPARING_MAX])

    def task_ended(
        self,
        node: str,
        workload: str,
        task: int,
        exit_code: int | None,
        reason: str,
        attempt: int | None = None,
        launch: int | None = None,
        cause: str | None = None,
        directory: str | None = None,
    ) -> None:
        self.reports.put(
            Ended(node, workload, task, exit_code, reason, attempt, launch, cause, directory)
        )

    def heartbeat(self, node: str) -> None:
        self.reports.put(Beat(node))

    def flush(self) -> None:
        """Wait until the reports handed on so far are in the store."""
        self.reports.flush()

    def node_joined(self, spec: NodeSpec) -> None:
        """Register the node (again), with the devices its agent found; its work is kept."""
        self.store.register_node(spec, replace_existing=True)

    def checkpoints(self, node: str, times: Mapping[str, float]) -> None:
        # What the transport carried is checked here: a name and a finite time each.
        for workload, at in times.items():
            if isinstance(workload, str) and _is_time(at):
                self.reports.put(Checkpointed(node, workload, float(at)))

    def _reported(self, outcome: Outcome) -> None:
        """After a batch of reports is written: stop what runs unbound and the rest of
        failed gangs, and wake the scheduler for the work that ended."""
        if outcome.unbound:
            self.cluster.stop(
                [
                    TaskStop(
                        r.workload, r.node, (r.task,), "no longer bound", 0.0, outcome.decided_at
                    )
                    for r in outcome.unbound
                ]
            )
        self.release(outcome.releases)
        if outcome.ended and self.ended is not None:
            self.ended(outcome.ended)
        if outcome.ended or outcome.revived:
            self.wake_scheduler()

    def samples(self, node: str, samples: list[Sample]) -> None:
        record_samples(self.store, samples)

    # -- reconciling -------------------------------------------------------------------

    def reconcile(self, nodes: list[NodeState] | None = None) -> None:
        """Make every node's agent run exactly what the store binds to it (`nodes`: the
        store's nodes, when the caller has just read them)."""
        # What the agents run first, then what the store binds: a task bound and started
        # in between is then missing (started again, which changes nothing), never extra.
        agents = {}
        for record in self.store.node_states() if nodes is None else nodes:
            running = self.cluster.running(record.name)
            if running is not None:
                # Processes found running from before the agent count as run by it: they
                # are stopped unless bound, and adopted (or replaced) when bound.
                agents[record.name] = (running, self.cluster.strays(record.name))
        # Reports sent before those answers are in the store before it is read.
        self.reports.flush()
        # The stops decided here are of the store as it is now, the launches of what is
        # bound when it has been read (see corral.messages).
        decided = time.time()
        # All bound work in one read, grouped by node: reading it node by node cost a read
        # of every running workload per node (1,000 nodes: minutes per pass).
        by_node: dict[str, list[BoundWork]] = {}
        bound = self.store.bound_work()
        read = time.time()
        for work in bound:
            for node in dict.fromkeys(task.node for task in work.tasks):
                by_node.setdefault(node, []).append(work)
        accounts = unix_users(self.store)
        for node, (running, strays) in agents.items():
            keys: set[tuple[str, int]] = set()
            missing: list[TaskLaunch] = []
            for work in by_node.get(node, []):
                # The keys of the launches the node should run, without building them:
                # most of the work runs already.
                wanted = {
                    (work.workload.name, task.task)
                    for task in work.tasks
                    if task.node == node and task.state != "exited"
                }
                keys.update(wanted)
                if not wanted <= running:
                    # Decrypt secrets only for the work that must be started.
                    missing.extend(
                        launch
                        for launch in self.launches(work, node, accounts, read)
                        if launch.key not in running
                    )
            if missing:
                self.cluster.start(missing)
            extra: dict[str, list[int]] = {}
            for workload, task in (running | strays) - keys:
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
                            decided,
                        )
                        for workload, tasks in sorted(extra.items())
                    ]
                )

    def expire(self, nodes: list[NodeState] | None = None) -> list[str]:
        """Declare lost the nodes whose agent has not answered for the node timeout, counted
        from this server's start at the earliest: a restarted server has heard nobody yet,
        and a node is lost only when its agent could have answered and did not. Their
        workloads go back to pending, and the tasks a requeued gang still has on other
        nodes are stopped before the scheduler may place it again (else a task of the old
        attempt could be taken for the new one where both land on the same node)."""
        now = time.time()
        limit = now - self.node_timeout
        if self.started_at > limit:
            return []
        answered = getattr(self.cluster, "last_answer", None)
        silent: dict[str, float] = {}
        for record in self.store.node_states() if nodes is None else nodes:
            if record.state != "ready":
                continue
            last = max(record.heartbeat_at or 0.0, (answered and answered(record.name)) or 0.0)
            if last < limit:
                silent[record.name] = now - max(last, self.started_at)
        if not silent:
            return []
        lost, stopped = self.store.expire_nodes(silent, limit)
        if not lost:
            return []
        declare = getattr(self.cluster, "declare_lost", None)
        if declare is not None:
            declare(sorted(lost), now)
        for node, requeued in sorted(lost.items()):
            log.warning(
                "node %s is lost: no answer for %.1f s; requeued: %s",
                node,
                silent[node],
                ", ".join(requeued) or "nothing",
            )
        self.release(stopped)
        self.wake_scheduler()
        return sorted(lost)

    def settle(self) -> None:
        """Decide the failures that waited to learn whether a node was lost."""
        stopped = self.store.settle_failing(self.node_timeout + self.reconcile_interval)
        if stopped:
            self.release(stopped)
            self.wake_scheduler()

    def start_monitor(self) -> None:
        self._thread = threading.Thread(target=self._monitor, name="corral-monitor", daemon=True)
        self._thread.start()

    def stop_monitor(self) -> None:
        """Stop the monitor, and write the reports still queued."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.reports.stop()

    def _monitor(self) -> None:
        while not self._stop.wait(self.reconcile_interval):
            try:
                # Heartbeats already received count before nodes are judged.
                self.reports.flush()
                # One read of the nodes for both.
                nodes = self.store.node_states()
                if self.expire(nodes):
                    nodes = self.store.node_states()
                self.settle()
                self.reconcile(nodes)
            except Exception:
                log.exception("reconciling failed")
            for job in self.upkeep:
                try:
                    job()
                except Exception:
                    log.exception("upkeep failed")


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
