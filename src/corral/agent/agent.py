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
from corral.cluster import Reports, TaskLaunch, TaskStop

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
                        task.deadline = time.time() + launch.max_runtime
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
            busy = {
                device
                for task in self._tasks.values()
                if task.process is not None
                for device in task.launch.devices
            }
            for key, task in list(self._tasks.items()):
                process = task.process
                if process is None:
                    if task.stop_reason is None and not (set(task.launch.devices) & busy):
                        problem = self._spawn(task)
                        if problem is not None:
                            del self._tasks[key]
                            ended.append((task, None, problem))
                            continue
                        busy.update(task.launch.devices)
                        started.append(task)
                    continue
                code = process.exit_code()
                if code is not None:
                    del self._tasks[key]
                    ended.append((task, code, task.stop_reason or _exit_reason(code)))
                    continue
                if task.kill_at is not None and now >= task.kill_at:
                    process.signal(signal.SIGKILL)
                elif task.deadline is not None and now >= task.deadline and not task.stop_reason:
                    task.stop_reason = "exceeded its maximum runtime"
                    task.kill_at = now + 30.0
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
        for task, code, reason in ended:
            reports.task_ended(self.node, task.launch.workload, task.launch.task, code, reason)
        if time.time() - self._last_heartbeat >= self.heartbeat_interval:
            self._last_heartbeat = time.time()
            reports.heartbeat(self.node)

    def _spawn(self, task: _Task) -> str | None:
        """Start the task's process; why not, when it cannot start at all."""
        launch = task.launch
        env = dict(os.environ)
        env.update(launch.env)
        try:
            task.process = TaskProcess.spawn(
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
