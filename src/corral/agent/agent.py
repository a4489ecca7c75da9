"""The node agent: starts, watches and stops this node's tasks, and reports what happens.

A task is started only when the devices it was given are free on this node: a victim of
preemption may still be checkpointing on them during its grace period, and the task that
replaces it waits until it has gone. Stopping is SIGTERM to the task's process group, a
grace period, then SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from corral.agent.process import TaskProcess
from corral.agent.telemetry import Holder, Sampler, interval_from_env
from corral.messages import Reports, TaskLaunch, TaskStop
from corral.model.spec import Device

log = logging.getLogger("corral.agent")


@dataclass(slots=True)
class _Task:
    launch: TaskLaunch
    process: TaskProcess | None = None
    stop_reason: str | None = None
    kill_at: float | None = None
    deadline: float | None = None  # max runtime


class Agent:
    """One node's agent. Thread-safe; `tick()` does the work, `run()` calls it in a loop."""

    def __init__(
        self,
        node: str,
        data_dir: Path,
        reports: Reports | None = None,
        heartbeat_interval: float = 5.0,
        poll_interval: float = 0.2,
        devices: tuple[Device, ...] = (),
        sample_interval: float | None = None,
    ) -> None:
        self.node = node
        self.data_dir = data_dir
        self.reports = reports
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self._tasks: dict[tuple[str, int], _Task] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_heartbeat = 0.0
        # Telemetry of the node's devices (none without devices: nothing to sample).
        interval = sample_interval if sample_interval is not None else interval_from_env()
        self.sampler = Sampler(node, devices, interval) if devices else None

    # -- paths ---------------------------------------------------------------------------

    def log_path(self, workload: str, task: int) -> Path:
        return self.data_dir / "logs" / workload / f"task-{task}.log"

    def exit_path(self, workload: str, task: int) -> Path:
        return self.data_dir / "run" / workload / f"task-{task}.exit"

    # -- orders from the server ----------------------------------------------------------

    def start(self, launches: list[TaskLaunch]) -> None:
        with self._lock:
            for launch in launches:
                if launch.key in self._tasks:
                    continue
                task = _Task(launch)
                if launch.pid is not None and launch.proc_start is not None:
                    task.process = TaskProcess.adopt(
                        launch.pid,
                        launch.proc_start,
                        self.exit_path(launch.workload, launch.task),
                    )
                    if launch.max_runtime is not None:
                        # Counted from when the process started, not from the adoption.
                        task.deadline = task.process.started_at + launch.max_runtime
                self._tasks[launch.key] = task
        self.tick()

    def stop(self, stops: list[TaskStop]) -> None:
        with self._lock:
            for stop in stops:
                for number in stop.tasks:
                    task = self._tasks.get((stop.workload, number))
                    if task is None:
                        continue
                    if task.process is None:
                        # Never started: nothing to signal.
                        del self._tasks[(stop.workload, number)]
                        continue
                    if task.stop_reason is None:
                        task.stop_reason = stop.reason
                        task.kill_at = time.time() + stop.grace
                        task.process.signal(signal.SIGTERM)
        self.tick()

    def running(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._tasks)

    # -- the loop ------------------------------------------------------------------------

    def tick(self) -> None:
        """Start tasks whose devices are free, notice ended ones, kill overdue ones."""
        ended: list[tuple[_Task, int | None, str]] = []
        started: list[_Task] = []
        with self._lock:
            now = time.time()
            # How much of each device the live processes hold: a fractional task may
            # start beside others on a device as long as the fractions fit.
            busy: dict[int, float] = {}
            for held in self._tasks.values():
                if held.process is not None:
                    for device, share in _shares(held.launch):
                        busy[device] = busy.get(device, 0.0) + share
            for key, task in list(self._tasks.items()):
                process = task.process
                if process is None:
                    shares = _shares(task.launch)
                    free = all(busy.get(d, 0.0) + s <= 1.0 + 1e-9 for d, s in shares)
                    if task.stop_reason is None and free:
                        problem = self._spawn(task)
                        if problem is not None:
                            del self._tasks[key]
                            ended.append((task, None, problem))
                            continue
                        for device, share in shares:
                            busy[device] = busy.get(device, 0.0) + share
                        started.append(task)
                    continue
                outcome = process.ended()
                if outcome is not None:
                    code, why = outcome
                    del self._tasks[key]
                    ended.append((task, code, task.stop_reason or why or _exit_reason(code)))
                    continue
                if task.kill_at is not None and now >= task.kill_at:
                    process.signal(signal.SIGKILL)
                elif task.deadline is not None and now >= task.deadline and not task.stop_reason:
                    task.stop_reason = "exceeded its maximum runtime"
                    task.kill_at = now + task.launch.grace
                    process.signal(signal.SIGTERM)
        reports = self.reports
        if reports is None:
            return
        for task in started:
            assert task.process is not None
            reports.task_started(
                self.node,
                task.launch.workload,
                task.launch.task,
                task.process.pid,
                task.process.proc_start,
            )
        for task, exit_code, reason in ended:
            reports.task_ended(self.node, task.launch.workload, task.launch.task, exit_code, reason)
        if time.time() - self._last_heartbeat >= self.heartbeat_interval:
            self._last_heartbeat = time.time()
            reports.heartbeat(self.node)
        if self.sampler is not None and self.sampler.due(time.time()):
            samples = self.sampler.sample(time.time(), self._holders())
            if samples:
                reports.samples(self.node, samples)

    def _holders(self) -> list[Holder]:
        """The tasks whose processes run, as telemetry attributes samples to them."""
        with self._lock:
            return [
                Holder(
                    task.launch.workload,
                    task.launch.task,
                    task.launch.devices,
                    task.launch.gpu,
                    task.process.pid,
                    task.process.started_at,
                    task.launch.env.get("CORRAL_TELEMETRY_FILE"),
                )
                for task in self._tasks.values()
                if task.process is not None
            ]

    def _spawn(self, task: _Task) -> str | None:
        """Start the task's process; why not, when it cannot start at all."""
        launch = task.launch
        if not launch.command:
            return "the workload has no command to run"
        env = dict(os.environ)
        env.update(launch.env)
        try:
            task.process = self.spawn_process(
                list(launch.command),
                env,
                launch.workdir,
                self.log_path(launch.workload, launch.task),
                self.exit_path(launch.workload, launch.task),
            )
        except OSError as error:
            # The launcher itself could not start (a missing working directory, say).
            log.warning("cannot start %s/%s: %s", launch.workload, launch.task, error)
            return f"could not start: {error.strerror or error}"
        if launch.max_runtime is not None:
            task.deadline = time.time() + launch.max_runtime
        return None

    def spawn_process(
        self, command: list[str], env: dict[str, str], workdir: str | None, log: Path, exit: Path
    ) -> TaskProcess:
        """Start one task's process group (agents under Ray start it detached and fenced)."""
        return TaskProcess.spawn(command, env, workdir, log, exit)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("agent tick failed")
            self._stop.wait(self.poll_interval)

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"agent-{self.node}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching; the tasks keep running and are adopted by the next agent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.sampler is not None:
            self.sampler.close()


def _shares(launch: TaskLaunch) -> list[tuple[int, float]]:
    """The share of each of its devices a task holds."""
    if not launch.devices:
        return []
    share = launch.gpu / len(launch.devices) if launch.gpu > 0 else 1.0
    return [(device, share) for device in launch.devices]


def _exit_reason(code: int) -> str:
    if code == 0:
        return "exited with code 0"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"killed by {name}"
    return f"exited with code {code}"
