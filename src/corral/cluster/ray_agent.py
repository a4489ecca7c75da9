"""The corral agent of one Ray node, as the body of a detached Ray actor.

It is the local agent (`corral.agent.Agent`) with three differences that Ray makes
necessary:

- Reports are buffered and collected by the server, which keeps one `drain(wait)` call
  outstanding per node: it answers as soon as there is a report, or after `wait` seconds
  with what runs. Each call is also the heartbeat, and it renews the node's lease. The
  actor is threaded, so that starts, stops and port requests do not queue behind a
  waiting drain.
- Task launchers are detached from the actor's process tree (a Ray worker kills its own
  children when its raylet dies, while their children live on) and fenced: a launcher
  kills its own process group when the lease is older than the fence timeout, so a node
  cut off from the control plane stops its tasks before the server, after its longer loss
  timeout, places them anywhere else.
- The server may not see this node's disk, so the log of every task is shipped back in
  `drain()`, from where the previous call stopped.

This module does not import Ray: `corral.cluster.ray` turns `NodeAgent` into an actor.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.agent import Agent, discover
from corral.agent.process import TaskProcess
from corral.cluster.exec_relay import SessionRelay, open_relayed
from corral.messages import TaskLaunch, TaskStop
from corral.model import GIB
from corral.model.telemetry import Sample

# What this agent understands (see `hello`).
PROTOCOL = 2
# At most this much of one task's log per drain; the rest follows in the next ones.
LOG_CHUNK = 1 << 20


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
    ) -> None:
        with self.lock:
            known = self.attempts.get((workload, task), -1)
            attempt = known if attempt is None else attempt
            if known == attempt:
                # Only its own: the task may be started again already, for a later attempt
                # (its end reported after the agent let go of it).
                self.attempts.pop((workload, task), None)
            self.items.append(("ended", workload, task, attempt, exit_code, reason, launch))
            self.added.notify_all()

    def task_ports(self, node: str, workload: str, task: int, ports: Mapping[str, int]) -> None:
        with self.lock:
            attempt = self.attempts.get((workload, task), -1)
            self.items.append(("ports", workload, task, attempt, dict(ports)))

    def heartbeat(self, node: str) -> None:
        """Nothing to do: the server's drain is the heartbeat."""

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
    ) -> TaskProcess:
        options = ("--lease", str(self.lease), "--fence", f"{self.fence_timeout:g}")
        return TaskProcess.spawn_detached(command, env, workdir, log, exit, options, user=user)


class NodeAgent:
    """The actor's body: one per Ray node, named after its node id, in namespace corral."""

    def __init__(
        self,
        name: str,
        agent_root: str,
        fence_timeout: float,
        virtual_gpus: int = 0,
        workloads_root: str | None = None,
        virtual_model: str = "virtual",
        virtual_memory: int = 80 * GIB,
        address: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.data_dir = Path(os.path.expanduser(agent_root)) / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.lease = self.data_dir / "lease"
        self._renew()
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
        )
        self.agent.lease = self.lease
        self.agent.fence_timeout = fence_timeout
        self.agent.start_thread()
        # The actor is threaded (see corral.cluster.ray): this guards what follows.
        self._lock = threading.Lock()
        # Log shipping: how far each task's log was sent, and tasks whose log is final.
        self._offsets: dict[tuple[str, int], int] = {}
        self._ended: set[tuple[str, int]] = set()
        self._ports: dict[int, float] = {}
        self._relay: SessionRelay | None = None

    def _renew(self) -> None:
        """The server was heard from: renew the lease the launchers watch."""
        self.lease.touch()

    def hello(self) -> dict[str, Any]:
        """What the server registers: this node's devices and resources."""
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
            # 2: `drain(wait)` and a threaded actor. An agent started by an older server
            # (detached actors outlive it) says nothing, and is drained without waiting.
            "protocol": PROTOCOL,
        }

    def start(self, launches: list[TaskLaunch]) -> None:
        """Start (or adopt) tasks, as the local agent does."""
        self._renew()
        running = self.agent.running()
        fresh = []
        for launch in launches:
            if launch.key in running:
                continue
            env = dict(launch.env)
            # The telemetry file is the agent's, on this node's disk.
            env["CORRAL_TELEMETRY_FILE"] = str(
                self.data_dir / "run" / launch.workload / f"task-{launch.task}.util"
            )
            if env.get("WORLD_SIZE") == "1":
                # The server asks no agent for a single task's port: it is this node's.
                env["MASTER_PORT"] = str(self.free_port())
            fresh.append(dataclasses.replace(launch, env=env))
            with self.buffer.lock:
                self.buffer.attempts[launch.key] = launch.attempt
            log = self.agent.log_path(launch.workload, launch.task)
            with self._lock:
                # What the log held before (an earlier attempt here) was shipped already.
                self._offsets[launch.key] = log.stat().st_size if log.exists() else 0
                self._ended.discard(launch.key)
        self.agent.start(fresh)

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

    def drain(self, wait: float = 0.0) -> dict[str, Any]:
        """Everything since the last call: reports, what runs, new log output, the latest
        telemetry and checkpoint times. With `wait`, the answer waits up to that many
        seconds for a report (the agent's own loop notices a task's start or end within
        its poll interval). Being called renews the lease."""
        self._renew()
        self.agent.tick()
        with self.buffer.added:
            if not self.buffer.items and wait > 0:
                self.buffer.added.wait(wait)
            items, self.buffer.items = self.buffer.items, []
            samples, self.buffer.latest = self.buffer.latest, []
            checkpoints, self.buffer.checkpoint_times = self.buffer.checkpoint_times, {}
        with self._lock:
            for item in items:
                if item[0] == "ended":
                    self._ended.add((item[1], item[2]))
            logs = self._ship_logs()
        return {
            "reports": items,
            "running": sorted(self.agent.running()),
            "strays": sorted(self.agent.strays()),
            "logs": logs,
            "samples": samples,
            # Newer than the server knows: an older server ignores the key.
            "checkpoints": checkpoints,
        }

    def _ship_logs(self) -> list[tuple[str, int, bytes]]:
        chunks = []
        for key, offset in list(self._offsets.items()):
            path = self.agent.log_path(*key)
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read(LOG_CHUNK)
            except OSError:
                data = b""
            if data:
                self._offsets[key] = offset + len(data)
                chunks.append((key[0], key[1], data))
            elif key in self._ended:
                # Ended and sent to the last byte.
                del self._offsets[key]
                self._ended.discard(key)
        return chunks

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
        if self._relay is not None:
            self._relay.close()
        self.agent.close()
