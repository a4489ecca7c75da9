"""The corral agent of one Ray node, as the body of a detached Ray actor.

It is the local agent (`corral.agent.Agent`) with three differences that Ray makes
necessary:

- Reports are buffered and collected by the server, which keeps one `drain(wait)` call
  outstanding per node: it answers as soon as there is a report, or after `wait` seconds
  with what runs. Each call is also the heartbeat, and carries the server's current
  settings (`AgentSettings`). The actor is threaded, so that starts, stops and port
  requests do not queue behind a waiting drain.
- Task launchers are detached from the actor's process tree (a Ray worker kills its own
  children when its raylet dies, while their children live on) and fenced: a launcher
  kills its own process group when the node's lease is older than the fence timeout. The
  lease is renewed while the node is part of the cluster: by every call of the server,
  and every second by a watchdog while the agent reaches Ray's control store (GCS), for
  up to `server_absence` without a word from the server. A server that is down or
  restarting therefore stops nothing; a node cut off from the cluster (its raylet dead,
  its network gone) stops its tasks before the server, after its longer loss timeout,
  places them anywhere else. The watchdog also reads whether the server declared this
  node lost (`probe`), and then kills the tasks launched before that at once.
- The server may not see this node's disk, so the log of every task is shipped back in
  `drain()`, from where the server last said it stored it (corral.cluster.log_shipping),
  and the reports and checkpoint times of an answer are sent again until a call of the
  server acknowledges that answer: a server killed with an answer in hand loses nothing.

This module does not import Ray: `corral.cluster.ray` turns `NodeAgent` into an actor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from corral.agent import Agent, discover
from corral.agent.containers import look
from corral.agent.prepare import NodeIndex
from corral.agent.process import TaskProcess
from corral.agent.walls import WallOptions
from corral.cluster.exec_relay import SessionRelay, open_relayed
from corral.cluster.log_shipping import Outbox
from corral.messages import AgentSettings, TaskLaunch, TaskStop
from corral.model import GIB
from corral.model.spec import CONTAINERS_LABEL, CONTAINERS_VALUE, NodeSpec
from corral.model.telemetry import Sample

log = logging.getLogger("corral.agent")

# What this agent understands (see `hello`).
PROTOCOL = 6
# Snapshot refs an agent keeps (each is small; the bytes stay in the object store), and
# how long it waits for one's bytes.
SNAPSHOT_REFS = 64
SNAPSHOT_TIMEOUT = 300.0
# How often the watchdog asks the cluster whether this node is still part of it.
WATCH_EVERY = 1.0


class _Buffer:
    """The agent's `Reports`: kept until the server drains them, each with its attempt."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Notified whenever a report is added: a waiting drain answers at once.
        self.added = threading.Condition(self.lock)
        self.attempts: dict[tuple[str, int], int] = {}
        self.items: list[tuple[Any, ...]] = []
        self.latest: list[Sample] = []
        # The newest checkpoint time of each workload, until drained.
        self.checkpoint_times: dict[str, float] = {}

    def task_started(self, node: str, workload: str, task: int, pid: int, proc_start: int) -> None:
        with self.lock:
            attempt = self.attempts.get((workload, task), -1)
            self.items.append(("started", workload, task, attempt, pid, proc_start))
            self.added.notify_all()

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
        with self.lock:
            known = self.attempts.get((workload, task), -1)
            attempt = known if attempt is None else attempt
            if known == attempt:
                # Only its own: the task may be started again already, for a later attempt
                # (its end reported after the agent let go of it).
                self.attempts.pop((workload, task), None)
            item = ("ended", workload, task, attempt, exit_code, reason, launch, cause, directory)
            self.items.append(item)
            self.added.notify_all()

    def task_ports(self, node: str, workload: str, task: int, ports: Mapping[str, int]) -> None:
        with self.lock:
            attempt = self.attempts.get((workload, task), -1)
            self.items.append(("ports", workload, task, attempt, dict(ports)))

    def task_preparing(self, node: str, workload: str, task: int, what: str) -> None:
        with self.lock:
            attempt = self.attempts.get((workload, task), -1)
            self.items.append(("preparing", workload, task, attempt, what))
            self.added.notify_all()

    def code(self, project: str, digest: str) -> bytes:
        """Never asked: the agent takes snapshots from the refs its launches bring."""
        raise LookupError(f"the code snapshot {digest} of {project} came with no launch")

    def heartbeat(self, node: str) -> None:
        """Nothing to do: the server's drain is the heartbeat."""

    def node_joined(self, spec: NodeSpec) -> None:
        """Nothing to do: the server registers this node from `hello`."""

    def samples(self, node: str, samples: list[Sample]) -> None:
        with self.lock:
            self.latest = samples

    def checkpoints(self, node: str, times: Mapping[str, float]) -> None:
        with self.lock:
            self.checkpoint_times.update(times)


class _FencedAgent(Agent):
    """The local agent whose launchers are detached and watch the node's lease."""

    lease: Path
    fence_timeout: float

    def spawn_process(
        self,
        command: list[str],
        env: dict[str, str],
        workdir: str | None,
        log: Path,
        exit: Path,
        user: str | None = None,
        walls: tuple[str, ...] = (),
    ) -> TaskProcess:
        options = ("--lease", str(self.lease), "--fence", f"{self.fence_timeout:g}", *walls)
        return TaskProcess.spawn_detached(command, env, workdir, log, exit, options, user=user)


def _walls(settings: AgentSettings) -> WallOptions:
    return WallOptions(settings.log_cap, settings.task_pids, settings.task_limits)


def _index(settings: AgentSettings) -> NodeIndex:
    return NodeIndex(settings.index_url, settings.find_links)


class NodeAgent:
    """The actor's body: one per Ray node, named after its node id, in namespace corral."""

    def __init__(
        self,
        name: str,
        agent_root: str,
        settings: AgentSettings,
        virtual_gpus: int = 0,
        workloads_root: str | None = None,
        virtual_model: str = "virtual",
        virtual_memory: int = 80 * GIB,
        address: str = "127.0.0.1",
        probe: Callable[[], float | None] | None = None,
    ) -> None:
        """`probe` asks the cluster when the server declared this node lost (None: it did
        not) and raises when the cluster cannot be reached; without one, only the server's
        calls renew the lease."""
        self.name = name
        self.settings = settings
        self.data_dir = Path(os.path.expanduser(agent_root)) / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lease = self.data_dir / "lease"
        self._write_lease(settings.fence_timeout)
        self._heard = time.monotonic()
        found = discover(virtual_gpus or None, virtual_model, virtual_memory, default_virtual=0)
        # Virtual devices are named after the host; several nodes share one in tests.
        devices = tuple(
            dataclasses.replace(d, uuid=f"virtual-{name}-{d.index}") if d.virtual else d
            for d in found.devices
        )
        self.found = dataclasses.replace(found, devices=devices)
        self.buffer = _Buffer()
        # Each workload's own directory (its checkpoints among them) under storage every
        # node sees when the server names one, so that a moved workload finds it.
        workloads = Path(workloads_root) if workloads_root else None
        # `address` is the node's as the server registers it: tasks' ports and the exec
        # relay listen there.
        self.agent = _FencedAgent(
            name,
            self.data_dir,
            self.buffer,
            devices=devices,
            workloads_dir=workloads,
            address=address,
            walls=_walls(settings),
            index=_index(settings),
        )
        self.agent.lease = self.lease
        self.agent.fence_timeout = settings.fence_timeout
        self.agent.walls.servers(settings.server_addresses)
        # The actor is threaded (see corral.cluster.ray): this guards what follows.
        self._lock = threading.Lock()
        # Refs of the code snapshots launches brought, newest last (see `start`).
        self._snapshots: dict[str, Any] = {}
        self.agent.code_source = self._snapshot
        # Whether this node may run tasks in images, told with `hello` (the agent makes
        # sure by starting one before its first such task).
        self._containers = look()
        self.agent.start_thread()
        # Log shipping: how far the server stored each task's log, by the name of its
        # workload's directories and its number.
        self._outbox = Outbox(self.data_dir / "log-offsets.json", self.agent.log_path)
        # The newest answer, with what it sent again, until the server acknowledges it:
        # (its number, reports, checkpoint times).
        self._instance = secrets.token_hex(8)
        self._answers = 0
        self._unacknowledged: tuple[int, list[tuple[Any, ...]], dict[str, float]] | None = None
        self._ports: dict[int, float] = {}
        self._relay: SessionRelay | None = None
        # The newest declaration of this node's loss that was acted on (server's clock).
        self._declared = -float("inf")
        self._probe = probe
        self._stopping = threading.Event()
        if probe is not None:
            threading.Thread(target=self._watch, name="corral-watchdog", daemon=True).start()

    # -- the lease -----------------------------------------------------------------------

    def _write_lease(self, fence_timeout: float) -> None:
        """Renew the lease, and write the fence timeout the launchers count with."""
        temporary = self.lease.with_name("lease.tmp")
        temporary.write_text(f"{fence_timeout:g}\n")
        os.replace(temporary, self.lease)

    def _renew(self) -> None:
        """The server was heard from: renew the lease the launchers watch."""
        self._heard = time.monotonic()
        self.lease.touch()

    def configure(self, settings: AgentSettings | None) -> None:
        """Take the server's current settings (sent with each call of a server that has
        any): the fence timeout reaches the launchers of running tasks too."""
        if settings is None or settings == self.settings:
            return
        if settings.fence_timeout != self.settings.fence_timeout:
            self._write_lease(settings.fence_timeout)
            self.agent.fence_timeout = settings.fence_timeout
        self.agent.walls.options = _walls(settings)
        self.agent.preparations.use_index(_index(settings))
        self.agent.walls.servers(settings.server_addresses)
        log.info("node %s takes the server's settings: %s", self.name, settings)
        self.settings = settings

    def _watch(self) -> None:
        """Every WATCH_EVERY seconds: renew the lease while the cluster answers (and the
        server was heard from within `server_absence`), and fence the tasks launched
        before the server declared this node lost."""
        while not self._stopping.wait(WATCH_EVERY):
            assert self._probe is not None
            try:
                declared = self._probe()
            except Exception as error:
                log.debug("the cluster did not answer: %s", error)
                continue
            if time.monotonic() - self._heard < self.settings.server_absence:
                self.lease.touch()
            if declared is not None and declared > self._declared:
                self._declared = declared
                self.agent.fence(declared, f"fenced: the server declared node {self.name} lost")

    def hello(self) -> dict[str, Any]:
        """What the server registers: this node's devices and resources. (Its settings come
        with the first drain: an agent of any corral answers this call alike.)"""
        self._renew()
        return {
            "devices": self.found.devices,
            "model": self.found.model,
            "memory": self.found.memory,
            "source": self.found.source,
            "note": self.found.note,
            "cpu": float(os.cpu_count() or 1),
            "ram": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "pid": os.getpid(),
            "data_dir": str(self.data_dir),
            # 2: `drain(wait)` and a threaded actor; 3: the server's settings with every
            # call; 4: files by the name of the workload's directories (NAME.ID), which
            # log chunks and task ends carry, and `forget`. An agent started by an older
            # corral (detached actors outlive it) says less, and is replaced once it runs
            # no task. 5: the server's addresses in its settings, let through the walls
            # of task ports. 6: launches that bring code (`start`'s snapshots) and say how
            # far their preparation is ("preparing" reports).
            "protocol": PROTOCOL,
            "labels": self._labels(),
        }

    def _labels(self) -> dict[str, str]:
        """The labels this node's agent gives it: whether it may run tasks in images."""
        return {CONTAINERS_LABEL: CONTAINERS_VALUE} if self._containers.available else {}

    def start(self, launches: list[TaskLaunch], snapshots: dict[str, Any] | None = None) -> None:
        """Start (or adopt) tasks, as the local agent does. `snapshots`: the object refs of
        the code snapshots they bring, by project and digest ("PROJECT DIGEST"), fetched
        from the driver's object store only by a node that has not unpacked them yet."""
        self._renew()
        if snapshots:
            with self._lock:
                self._snapshots.update(snapshots)
                while len(self._snapshots) > SNAPSHOT_REFS:
                    self._snapshots.pop(next(iter(self._snapshots)))
        running = self.agent.running()
        fresh = []
        for launch in launches:
            if launch.key in running:
                continue
            env = dict(launch.env)
            # The telemetry file is the agent's, on this node's disk.
            env["CORRAL_TELEMETRY_FILE"] = str(
                self.data_dir / "run" / launch.directory / f"task-{launch.task}.util"
            )
            if env.get("WORLD_SIZE") == "1":
                # The server asks no agent for a single task's port: it is this node's.
                env["MASTER_PORT"] = str(self.free_port())
            fresh.append(dataclasses.replace(launch, env=env))
            with self.buffer.lock:
                self.buffer.attempts[launch.key] = launch.attempt
            with self._lock:
                self._outbox.watch((launch.directory, launch.task))
        self.agent.start(fresh)

    def _snapshot(self, project: str, digest: str) -> bytes:
        """A code snapshot's bytes, from the ref its launch brought."""
        with self._lock:
            ref = self._snapshots.get(f"{project} {digest}")
        if ref is None:
            raise LookupError(f"no launch brought the code snapshot {digest} of {project}")
        import ray  # in the actor's process, where Ray runs already

        data = ray.get(ref, timeout=SNAPSHOT_TIMEOUT)
        if not isinstance(data, bytes):
            raise LookupError(f"the code snapshot {digest} of {project} came as no bytes")
        return data

    def stop(self, stops: list[TaskStop]) -> None:
        """Stop tasks: SIGTERM, the grace period, SIGKILL."""
        self._renew()
        self.agent.stop(stops)

    def free_port(self) -> int:
        """A port that is free on this node now and was not handed out in the last minute
        (two gangs whose rank 0 is here must not get the same one)."""
        now = time.time()
        with self._lock:
            self._ports = {p: t for p, t in self._ports.items() if now - t < 60}
            for _ in range(100):
                with socket.socket() as sock:
                    sock.bind(("", 0))
                    port: int = sock.getsockname()[1]
                if port not in self._ports:
                    break
            self._ports[port] = now
        return port

    def drain(
        self,
        wait: float = 0.0,
        settings: AgentSettings | None = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Everything since the last call: reports, what runs, new log output, the latest
        telemetry and checkpoint times. With `wait`, the answer waits up to that many
        seconds for a report (the agent's own loop notices a task's start or end within
        its poll interval). Being called renews the lease.

        `receipt` is what the server stored of the answers before: the number of the
        newest answer whose reports it took in, and how far it stored each log. Reports
        and checkpoint times of answers it does not acknowledge are sent again, logs from
        where it stored them. A server that sends no settings (an older corral) sends
        no receipt either, and nothing is sent twice."""
        self._renew()
        self.configure(settings)
        self.agent.tick()
        with self._lock:
            if settings is None:
                self._unacknowledged = None  # an older server, which acknowledges nothing
            again = self._not_acknowledged(receipt)
        with self.buffer.added:
            if not self.buffer.items and not again and wait > 0:
                self.buffer.added.wait(wait)
            items, self.buffer.items = self.buffer.items, []
            samples, self.buffer.latest = self.buffer.latest, []
            checkpoints, self.buffer.checkpoint_times = self.buffer.checkpoint_times, {}
        with self._lock:
            for item in items:
                if item[0] == "ended":
                    # By the directories' name the task was launched with.
                    self._outbox.finish((item[8] or item[1], item[2]))
            reports, times = items, checkpoints
            if again is not None:
                reports, times = again[1] + items, again[2] | checkpoints
            self._answers += 1
            if settings is not None:
                self._unacknowledged = (self._answers, reports, times)
            logs = self._outbox.chunks()
        return {
            "reports": reports,
            "running": sorted(self.agent.running()),
            "strays": sorted(self.agent.strays()),
            "logs": logs,
            "samples": samples,
            # Newer than the server knows: an older server ignores the key.
            "checkpoints": times,
            "answer": [self._instance, self._answers],
        }

    def _not_acknowledged(
        self, receipt: Mapping[str, Any] | None
    ) -> tuple[int, list[tuple[Any, ...]], dict[str, float]] | None:
        """Forget what `receipt` acknowledges; the last answer if it does not, to send its
        reports and checkpoint times again."""
        unacknowledged = self._unacknowledged
        if receipt is not None:
            self._outbox.acknowledge(receipt.get("logs") or {})
            if (
                unacknowledged is not None
                and receipt.get("instance") == self._instance
                and int(receipt.get("answer", 0)) >= unacknowledged[0]
            ):
                self._unacknowledged = unacknowledged = None
        return unacknowledged

    def forget(self, directory: str) -> None:
        """The workload whose directories are named `directory` was deleted: its log is
        shipped no more, and its files on this node go once its tasks here have gone."""
        with self._lock:
            self._outbox.forget(directory)
        self.agent.forget(directory)

    def open_session(
        self, workload: str, task: int, command: list[str], tty: bool
    ) -> dict[str, Any]:
        """`corral exec` beside a task of this node: where and with which one-time secret
        the server connects to its streams (see corral.cluster.exec_relay)."""
        with self._lock:
            if self._relay is None:
                self._relay = SessionRelay(self.agent.address, self.agent.sessions.forget)
            relay = self._relay
        return open_relayed(self.agent, relay, workload, task, command, tty)

    def close(self) -> None:
        """Stop watching; the tasks keep running (and keep their lease only while a new
        agent renews it)."""
        self._stopping.set()
        if self._relay is not None:
            self._relay.close()
        self.agent.close()
