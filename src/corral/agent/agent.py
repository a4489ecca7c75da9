"""The node agent: starts, watches and stops this node's tasks, and reports what happens.

A task is started only when the devices it was given are free on this node: a victim of
preemption may still be checkpointing on them during its grace period, and the task that
replaces it waits until it has gone. Stopping is SIGTERM to the task's process group, a
grace period, then SIGKILL to its process group and its cgroup (corral.agent.walls). A
task has gone, and its devices are free, once its launcher has ended and nothing is left
in its cgroup: what it left behind is killed then.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from corral.agent import cgroups, reporting
from corral.agent.cgroups import TaskCgroup, cleared
from corral.agent.checkpoints import last_checkpoint
from corral.agent.containers import Containers, container_name, probe, remove, task_argv
from corral.agent.enter import entered
from corral.agent.exec import ExecSession, Sessions, spawn
from corral.agent.identity import (
    SAFE_PATH,
    Identity,
    default_workloads_dir,
    identity_of,
    own_identity,
    switches_users,
    task_environment,
    unfit,
    workload_directory,
)
from corral.agent.launch import FENCE_REASON
from corral.agent.leftovers import remove_leftovers
from corral.agent.logcap import write_note
from corral.agent.ports import allocate, port_variables
from corral.agent.prepare import Failed, Fetch, NodeIndex, Preparations, Ready, brings
from corral.agent.process import TaskProcess
from corral.agent.strays import Stray, find_strays
from corral.agent.strays import stop as stop_stray
from corral.agent.telemetry import Holder, Sampler, interval_from_env
from corral.agent.walls import WallOptions, Walls, out_of_memory
from corral.messages import FENCED, STOPPED, Reports, TaskLaunch, TaskStop
from corral.model.spec import Device, PythonEnv

log = logging.getLogger("corral.agent")

# Deleted workloads an agent remembers, so that a late launch of one starts nothing.
DELETED_KEPT = 10_000


@dataclass(slots=True)
class _Task:
    launch: TaskLaunch
    process: TaskProcess | None = None
    stop_reason: str | None = None
    # Why corral stopped it (corral.messages.CAUSES); None when it ends by itself.
    cause: str | None = None
    kill_at: float | None = None
    deadline: float | None = None  # max runtime
    # Why the agent gave up on it (it could not be adopted, say); reported as its end.
    failure: str | None = None
    # The numbers of its declared ports on this node, reported once it has started.
    ports: dict[str, int] = field(default_factory=dict)
    # Its cgroup (None: limits are off); it has gone once this is empty.
    cgroup: TaskCgroup | None = None
    # What it brings, made ready (corral.agent.prepare); None when it brings nothing.
    ready: Ready | None = None
    # The name of its container, when it runs in an image (corral.agent.containers).
    container: str | None = None


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
        workloads_dir: Path | None = None,
        run_as_submitter: bool | None = None,
        address: str = "127.0.0.1",
        walls: WallOptions | Walls | None = None,
        containers: Containers | None = None,
        index: NodeIndex | None = None,
    ) -> None:
        self.node = node
        # Where tasks listen for the server's proxy (the node's address in the store).
        self.address = address
        # `corral exec` and `corral shell` processes, stopped with their workload's task.
        self.sessions = Sessions()
        self.data_dir = data_dir
        self.workloads_dir = workloads_dir or default_workloads_dir(data_dir)
        # As root, each task runs as its submitter's account (see corral.agent.identity).
        self.run_as_submitter = switches_users() if run_as_submitter is None else run_as_submitter
        self.reports = reports
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self._tasks: dict[tuple[str, int], _Task] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_heartbeat = 0.0
        # The newest checkpoint time reported for each workload that runs here.
        self._checkpoints: dict[str, float] = {}
        # Telemetry of the node's devices (none without devices: nothing to sample).
        interval = sample_interval if sample_interval is not None else interval_from_env()
        self.sampler = Sampler(node, devices, interval) if devices else None
        # Each task's cgroup, process namespace and log cap (see corral.agent.walls).
        self.walls = walls if isinstance(walls, Walls) else Walls(data_dir, devices, walls)
        # Launchers of this data directory that run from before this agent, by pid: the
        # store adopts them, or they are stopped (see corral.agent.strays).
        self._strays: dict[int, Stray] = find_strays(self.data_dir / "run", self.walls.hierarchy)
        # Cgroups of tasks whose launchers have ended, where something was left behind.
        self._leftovers = self.walls.leftovers(s.cgroup for s in self._strays.values())
        # Deleted workloads, by the name of their directories, whose files go once none of
        # their tasks runs here (`forget`); and the latest of them, whose launches (sent
        # before the deletion, delivered after it) start nothing.
        self._forgotten: set[str] = set()
        # Held while they are removed: a tick that returns has left none of them behind,
        # though another thread's tick took them.
        self._removing = threading.Lock()
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # The server's code snapshots, for a transport whose reports cannot answer (Ray's
        # sends them with its launches); else the reports' `code`.
        self.code_source: Fetch | None = None
        # What runs containers here (None: found at the first task in an image).
        self._containers = containers
        self._probing = threading.Lock()
        self.preparations = Preparations(
            data_dir, self._code_source, self._preparing, self.containers, self._environments, index
        )

    def containers(self) -> Containers:
        """What runs containers on this node (corral.agent.containers.probe), found once."""
        with self._probing:
            if self._containers is None:
                self._containers = probe()
            return self._containers

    def _environments(self) -> list[PythonEnv]:
        """The Python environments of the tasks this agent has."""
        with self._lock:
            return [t.launch.python for t in self._tasks.values() if t.launch.python is not None]

    def _code_source(self) -> Fetch | None:
        if self.code_source is not None:
            return self.code_source
        return getattr(self.reports, "code", None)

    def _preparing(self, launch: TaskLaunch, what: str) -> None:
        """Tell the server how far a task's preparation is (from a preparing thread), and
        say it in the task's log, where `corral logs` shows it before the task's output."""
        with contextlib.suppress(OSError):
            write_note(self.log_path(launch.directory, launch.task), what)
        reports = self.reports
        if reports is None:
            return
        try:
            reports.task_preparing(self.node, launch.workload, launch.task, what)
        except Exception:
            log.exception("reporting the preparation of %s/%s failed", *launch.key)

    # -- paths ---------------------------------------------------------------------------

    # Each takes the name of the workload's directories (TaskLaunch.directory), not its
    # name: a later workload of the same name never finds a deleted one's files.

    def log_path(self, directory: str, task: int) -> Path:
        return self.data_dir / "logs" / directory / f"task-{task}.log"

    def exit_path(self, directory: str, task: int) -> Path:
        return self.data_dir / "run" / directory / f"task-{task}.exit"

    def telemetry_path(self, directory: str, task: int) -> Path:
        """Where a task declares its utilisation: in its workload's own directory."""
        return self.workloads_dir / directory / f"task-{task}.util"

    # -- orders from the server ----------------------------------------------------------

    def start(self, launches: list[TaskLaunch]) -> None:
        with self._lock:
            for launch in launches:
                if launch.key in self._tasks or launch.directory in self._deleted:
                    continue
                task = _Task(launch)
                self._claim_strays(launch)
                if launch.pid is not None and launch.proc_start is not None:
                    try:
                        self._adopt(task, launch.pid, launch.proc_start)
                    except Exception as error:
                        # That task's failure, reported by the next tick; never the others'.
                        log.exception("cannot adopt %s/%s", launch.workload, launch.task)
                        task.failure = f"could not be adopted: {error}"
                self._tasks[launch.key] = task
        self.tick()

    def _claim_strays(self, launch: TaskLaunch) -> None:
        """A stray that is the launch's own process is adopted with it; any other stray of
        the same task is of an older launch (or its start never reached the store): it is
        stopped, and the task starts once it has gone."""
        for pid, stray in list(self._strays.items()):
            if stray.key != launch.key:
                continue
            own = stray.directory == launch.directory
            if own and pid == launch.pid and stray.proc_start == launch.proc_start:
                del self._strays[pid]
            else:
                stop_stray(stray, time.time(), launch.grace, "its task is started again")

    def _adopt(self, task: _Task, pid: int, proc_start: int) -> None:
        launch = task.launch
        task.process = TaskProcess.adopt(
            pid, proc_start, self.exit_path(launch.directory, launch.task)
        )
        task.cgroup = self.walls.cgroup(launch)
        task.ready = self.preparations.existing(launch)
        if launch.image is not None:
            task.container = self._container_name(launch)
        if launch.max_runtime is not None:
            # Counted from when the process started, not from the adoption.
            task.deadline = task.process.started_at + launch.max_runtime

    def stop(self, stops: list[TaskStop]) -> None:
        with self._lock:
            for stop in stops:
                for number in stop.tasks:
                    task = self._tasks.get((stop.workload, number))
                    for stray in self._strays.values():
                        if stray.key == (stop.workload, number):
                            stop_stray(stray, time.time(), stop.grace, stop.reason)
                    if task is None:
                        continue
                    if stop.spares(task.launch):
                        # Decided before this launch: delivered late, about an earlier one.
                        log.info(
                            "a stop of %s/%s decided at %.6f is older than its launch (%.6f)",
                            stop.workload,
                            number,
                            stop.decided_at,
                            task.launch.decided_at,
                        )
                        continue
                    if task.process is None:
                        # Never started: nothing to signal.
                        del self._tasks[(stop.workload, number)]
                        continue
                    self.sessions.stop_workload(stop.workload)
                    if task.stop_reason is None:
                        task.stop_reason = stop.reason
                        task.cause = STOPPED
                        task.kill_at = time.time() + stop.grace
                        task.process.signal(signal.SIGTERM)
        self.tick()

    def fence(self, before: float, reason: str) -> int:
        """Kill at once every task launched before `before` (by the server's clock; all
        whose launch time is unknown), and every process found running from before this
        agent: the server declared this node lost then, and may start its work anywhere
        else. Their ends are reported as fenced. Returns how many were killed."""
        killed = 0
        with self._lock:
            for task in self._tasks.values():
                decided = task.launch.decided_at
                if task.process is None or (decided is not None and decided >= before):
                    continue
                if task.cause != FENCED:
                    task.stop_reason, task.cause = reason, FENCED
                    killed += 1
                task.kill_at = time.time()
                _kill(task)
            for stray in self._strays.values():
                stray.signal(signal.SIGKILL)
        if killed:
            log.warning("%s: %d tasks killed", reason, killed)
            self.tick()
        return killed

    def forget(self, directory: str) -> None:
        """The workload whose directories are named `directory` was deleted: its files on
        this node (logs, run files, its own directory) go once none of its tasks runs here
        (a task it had may still be in its grace period), at once when none does."""
        with self._lock:
            self._forgotten.add(directory)
            self._deleted[directory] = None
            while len(self._deleted) > DELETED_KEPT:
                self._deleted.popitem(last=False)
        self.tick()

    def running(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._tasks)

    def strays(self) -> set[tuple[str, int]]:
        """The tasks of processes found running from before this agent that the store has
        not adopted (the reconciler stops those it does not bind)."""
        with self._lock:
            return {stray.key for stray in self._strays.values()}

    # -- the loop ------------------------------------------------------------------------

    def tick(self) -> None:
        """Start tasks whose devices are free, notice ended ones, kill overdue ones.

        A task the agent cannot handle (start, watch, stop) is that task's failure,
        reported as its end; it never stops the other tasks, the reports or the heartbeat,
        so `tick` does not raise because of one task."""
        ended: list[tuple[_Task, int | None, str, str | None]] = []
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
            waiting = self._watch_strays(now, busy)
            for key, task in list(self._tasks.items()):
                if task.process is None and (
                    key in waiting or (None in waiting and task.launch.devices)
                ):
                    continue  # a process found running holds its devices or its files
                try:
                    outcome = self._advance(task, now, busy, started)
                except Exception as error:
                    log.exception("cannot handle %s/%s", task.launch.workload, task.launch.task)
                    outcome = (None, f"the agent could not handle it: {error}", None)
                    # Given up on: it must not hold its devices unseen.
                    with contextlib.suppress(Exception):
                        _kill(task)
                    if task.cgroup is not None:
                        self._leftovers.append(task.cgroup)
                if outcome is not None:
                    del self._tasks[key]
                    ended.append((task, *outcome))
                    self.sessions.stop_workload(task.launch.workload)
        # Outside the lock (nft runs as a command): a port given to a task started since
        # is walled under that task's name, which opening this one's leaves alone.
        for task, *_ in ended:
            self.walls.open_ports(task.launch)
        self._report(started, ended)
        self._remove_forgotten()

    def _remove_forgotten(self) -> None:
        """Remove the files of deleted workloads none of whose tasks runs here any more."""
        with self._removing:
            with self._lock:
                if not self._forgotten:
                    return
                busy = {task.launch.directory for task in self._tasks.values()}
                busy |= {stray.directory for stray in self._strays.values()}
                gone = self._forgotten - busy
                self._forgotten -= gone
            for directory in sorted(gone):
                try:
                    remove_leftovers(self.data_dir, self.workloads_dir, directory)
                except ValueError as error:
                    log.warning("nothing removed: %s", error)

    def _watch_strays(self, now: float, busy: dict[int, float]) -> set[tuple[str, int] | None]:
        """Forget strays that have gone, kill those overdue, and count the devices of the
        rest as held. The tasks that must wait: those with a stray of their own (it would
        write their exit file), and every task with devices (None) while a stray whose
        devices are unknown lives."""
        waiting: set[tuple[str, int] | None] = set()
        self._leftovers = [left for left in self._leftovers if not cleared(left)]
        if self._leftovers:
            waiting.add(None)  # what they hold is not known
        for pid, stray in list(self._strays.items()):
            if not stray.alive():
                log.info("task %s/%s found running (pid %d) has ended", *stray.key, pid)
                del self._strays[pid]
                continue
            if stray.kill_at is not None and now >= stray.kill_at:
                stray.signal(signal.SIGKILL)
            waiting.add(stray.key)
            if stray.shares is None:
                waiting.add(None)
            for device, share in stray.shares or []:
                busy[device] = busy.get(device, 0.0) + share
        return waiting

    def _advance(
        self, task: _Task, now: float, busy: dict[int, float], started: list[_Task]
    ) -> tuple[int | None, str, str | None] | None:
        """One task's step: start it, notice its end, or stop it when overdue. Its exit code,
        why it ended and the cause corral had (None: its own end), when it did."""
        if task.failure is not None:
            return None, task.failure, None
        process = task.process
        if process is None:
            if task.stop_reason is None and task.ready is None and brings(task.launch):
                # Prepared before its devices are free: it starts as soon as both are.
                prepared = self._prepared(task.launch)
                if prepared is None:
                    return None
                if isinstance(prepared, str):
                    return None, prepared, None
                task.ready = prepared
            shares = _shares(task.launch)
            free = all(busy.get(d, 0.0) + s <= 1.0 + 1e-9 for d, s in shares)
            if task.stop_reason is None and free:
                problem = self._spawn(task)
                if problem is not None:
                    return None, problem, None
                for device, share in shares:
                    busy[device] = busy.get(device, 0.0) + share
                started.append(task)
            return None
        outcome = process.ended()
        if outcome is not None:
            # Read before the cgroup goes.
            oom = out_of_memory(task.cgroup) if task.cgroup is not None else None
            if task.container is not None:
                self._remove_container(task)
            if not cleared(task.cgroup):
                return None  # what it left behind dies first
            code, why = outcome
            if why is not None and why.startswith(FENCE_REASON) and task.cause is None:
                # Its launcher fenced it: the lease was not renewed in time.
                task.stop_reason, task.cause = why, FENCED
            if code != 0:
                why = oom or why
            return code, task.stop_reason or why or reporting.exit_reason(code), task.cause
        if task.kill_at is not None and now >= task.kill_at:
            _kill(task)
        elif task.deadline is not None and now >= task.deadline and not task.stop_reason:
            task.stop_reason = "exceeded its maximum runtime"
            task.kill_at = now + task.launch.grace
            process.signal(signal.SIGTERM)
        return None

    def _report(
        self, started: list[_Task], ended: list[tuple[_Task, int | None, str, str | None]]
    ) -> None:
        """Tell the server; one report that fails (a busy store) loses neither the others
        nor the heartbeat, and the reconciler resends what went missing."""
        reports = self.reports
        if reports is None:
            return
        calls: list[reporting.Call] = []
        for task in started:
            assert task.process is not None
            calls += reporting.started(reports, self.node, task.launch, task.process, task.ports)
        for task, exit_code, reason, cause in ended:
            calls.append(reporting.ended(reports, self.node, task.launch, exit_code, reason, cause))
        beat = time.time() - self._last_heartbeat >= self.heartbeat_interval
        if beat:
            self._last_heartbeat = time.time()
            calls.append(("heartbeat", partial(reports.heartbeat, self.node)))
        if beat or ended:
            # A look at each running workload's checkpoints as often as the heartbeat, and a
            # last one when a task ends (it may have checkpointed when asked to stop).
            found = self._new_checkpoints([task.launch for task, *_ in ended])
            if found:
                calls.append(("checkpoints", partial(reports.checkpoints, self.node, found)))
        if self.sampler is not None and self.sampler.due(time.time()):
            calls.append(("telemetry", self._send_samples))
        for what, call in calls:
            try:
                call()
            except Exception:
                log.exception("reporting %s failed", what)

    def _new_checkpoints(self, ended: list[TaskLaunch]) -> dict[str, float]:
        """The workloads running here, or whose task here has just `ended`, whose last
        checkpoint is newer than the one reported (see corral.agent.checkpoints), with its
        time; forgets the workloads that left."""
        with self._lock:
            running = [t.launch for t in self._tasks.values() if t.process is not None]
        workloads = {launch.workload for launch in running}
        directories = {launch.workload: launch.directory for launch in ended + running}
        now = time.time()
        found: dict[str, float] = {}
        for workload, directory in sorted(directories.items()):
            at = last_checkpoint(self.workloads_dir / directory, now)
            if at is not None and at > self._checkpoints.get(workload, float("-inf")):
                found[workload] = at
        self._checkpoints = {
            name: at for name, at in (self._checkpoints | found).items() if name in workloads
        }
        return found

    def _send_samples(self) -> None:
        assert self.sampler is not None and self.reports is not None
        samples = self.sampler.sample(time.time(), self._holders())
        if samples:
            self.reports.samples(self.node, samples)

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
                    str(self.telemetry_path(task.launch.directory, task.launch.task)),
                )
                for task in self._tasks.values()
                if task.process is not None
            ]

    def _prepared(self, launch: TaskLaunch) -> Ready | str | None:
        """What the task brings, once ready; why not, when it cannot be; None meanwhile."""
        try:
            identity = self._identity(launch)
        except LookupError as error:
            return f"cannot run as its submitter: {error}"
        state = self.preparations.poll(launch, identity)
        return state.reason if isinstance(state, Failed) else state

    def _spawn(self, task: _Task) -> str | None:
        """Start the task's process; why not, when it cannot start at all."""
        launch = task.launch
        if not launch.command and launch.image is None:
            return "the workload has no command to run"
        problem = unfit(launch.command, launch.env, launch.workdir)
        if problem is not None:
            return f"could not start: {problem}"
        try:
            identity = self._identity(launch)
        except LookupError as error:
            return f"cannot run as its submitter: {error}"
        try:
            folder = workload_directory(self.workloads_dir, launch.directory, identity)
            variables = brought(launch.env, task.ready)
            variables["CORRAL_CHECKPOINT_DIR"] = str(folder / "checkpoints")
            variables["CORRAL_TELEMETRY_FILE"] = str(
                self.telemetry_path(launch.directory, launch.task)
            )
            if launch.ports:
                task.ports = allocate(launch.ports, self.address)
                variables.update(port_variables(launch.workload, self.address, task.ports))
                self.walls.wall_ports(launch, task.ports.values(), identity.uid)
            task.cgroup = self.walls.cgroup(launch)
            if task.cgroup is not None:
                task.cgroup.create(self.walls.limits(launch))
            if launch.image is not None:
                task.process = self._spawn_container(task, identity, folder, variables)
            else:
                task.process = self.spawn_process(
                    list(launch.command),
                    task_environment(variables, identity),
                    working_directory(launch, folder, task.ready),
                    self.log_path(launch.directory, launch.task),
                    self.exit_path(launch.directory, launch.task),
                    user=identity.name if self.run_as_submitter else None,
                    walls=self.walls.launcher_options(task.cgroup),
                )
        except Exception as error:
            # Whatever it is (a launcher that cannot start, a value the kernel refuses),
            # it is this task's failure, not the agent's.
            log.warning("cannot start %s/%s: %s", launch.workload, launch.task, error)
            if task.cgroup is not None:
                with contextlib.suppress(OSError):
                    task.cgroup.remove()
            self.walls.open_ports(launch)
            detail = error.strerror if isinstance(error, OSError) and error.strerror else error
            return f"could not start: {detail}"
        if launch.max_runtime is not None:
            task.deadline = time.time() + launch.max_runtime
        return None

    def _container_name(self, launch: TaskLaunch) -> str:
        return container_name(
            cgroups.agent_key(self.data_dir),
            cgroups.task_name(launch.directory, launch.task, launch.launch, launch.attempt),
        )

    def _spawn_container(
        self, task: _Task, identity: Identity, folder: Path, variables: dict[str, str]
    ) -> TaskProcess:
        """Start the task in its image: podman, kept root by the launcher, runs its command
        as its account, in its cgroup, with its workload's directory and its code's copy
        mounted at their own paths (corral.agent.containers)."""
        launch = task.launch
        assert launch.image is not None
        found = self.containers()
        # The image's own PATH and HOME hold, but for a HOME it could write (the image is
        # read-only): its workload's directory.
        env = {**variables, "HOME": str(folder), "USER": identity.name, "LOGNAME": identity.name}
        mounts = [str(folder)]
        if task.ready is not None and task.ready.workdir is not None:
            mounts.append(str(task.ready.workdir))
        devices = [
            f"nvidia.com/gpu={device.index}"
            for device in self.walls.devices
            if device.index in launch.devices and not device.virtual
        ]
        task.container = self._container_name(launch)
        argv, given = task_argv(
            found,
            launch.image,
            launch.command,
            task.container,
            identity,
            working_directory(launch, folder, task.ready),
            mounts,
            env,
            task.cgroup,
            self.walls.limits(launch),
            devices,
        )
        return self.spawn_process(
            argv,
            given,
            None,
            self.log_path(launch.directory, launch.task),
            self.exit_path(launch.directory, launch.task),
            user=None,
            walls=(*self.walls.launcher_options(task.cgroup), "--container", found.podman),
        )

    def _remove_container(self, task: _Task) -> None:
        """The container of an ended task is gone (podman removes it as it ends, but not
        when its launcher was killed), and so are the cgroups podman made below its own."""
        assert task.container is not None
        failed = remove(self.containers(), task.container, task.cgroup)
        if failed is not None:
            log.warning("cannot remove the container %s: %s", task.container, failed)

    def _identity(self, launch: TaskLaunch) -> Identity:
        """The account the task runs as: its submitter's on a root agent, else ours."""
        if not self.run_as_submitter:
            return own_identity()
        if launch.unix_user is None:
            raise LookupError(
                "its submitter has no Unix account, and tasks on this node run as their "
                "submitter (`corral user create NAME --unix-user ACCOUNT`)"
            )
        return identity_of(launch.unix_user)

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
        """Start one task's process group (agents under Ray start it detached and fenced);
        `walls` are the launcher's options that build its walls."""
        return TaskProcess.spawn(command, env, workdir, log, exit, user, walls)

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

    def open_session(self, workload: str, task: int, command: list[str], tty: bool) -> ExecSession:
        """Run `command` beside a running task, in its environment (variables, devices,
        ports, working directory, Unix account) and inside its walls (its cgroup and
        namespaces), as this agent's child; stopped with the task. LookupError when the
        task does not run here; OSError or ValueError when the command cannot start."""
        with self._lock:
            found = self._tasks.get((workload, task))
            if found is None or found.process is None or found.stop_reason is not None:
                raise LookupError(f"task {task} of {workload} is not running on {self.node}")
            if found.container is not None:
                raise ValueError(
                    f"task {task} of {workload} runs in an image: exec and shell do not "
                    "enter containers yet"
                )
            launch, ports = found.launch, dict(found.ports)
            process, cgroup, ready = found.process, found.cgroup, found.ready
        identity = self._identity(launch)
        folder = workload_directory(self.workloads_dir, launch.directory, identity)
        variables = brought(launch.env, ready)
        variables["CORRAL_CHECKPOINT_DIR"] = str(folder / "checkpoints")
        if ports:
            variables.update(port_variables(launch.workload, self.address, ports))
        try:
            with entered(process.pid, process.proc_start, cgroup) as inside:
                session = spawn(
                    workload,
                    command,
                    task_environment(variables, identity),
                    working_directory(launch, folder, ready),
                    identity if self.run_as_submitter else None,
                    tty,
                    inside,
                )
        except LookupError as error:
            raise LookupError(f"task {task} of {workload} on {self.node}: {error}") from None
        self.sessions.add(session)
        return session

    def close(self) -> None:
        """Stop watching; the tasks keep running and are adopted by the next agent. Exec
        sessions, the agent's own children, end with it."""
        self.sessions.stop_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.sampler is not None:
            self.sampler.close()
        self.preparations.close()
        self.walls.close()


def brought(env: Mapping[str, str], ready: Ready | None) -> dict[str, str]:
    """The task's variables with its environment's: VIRTUAL_ENV, and its bin first on PATH."""
    variables = dict(env)
    if ready is not None and ready.venv is not None:
        variables["VIRTUAL_ENV"] = str(ready.venv)
        variables["PATH"] = f"{ready.venv / 'bin'}:{variables.get('PATH', SAFE_PATH)}"
    return variables


def working_directory(launch: TaskLaunch, folder: Path, ready: Ready | None) -> str:
    """Where the task starts: a relative `workdir` is taken from its copy of its code when
    it brings code, else from its workload's own directory (`folder`)."""
    base = ready.workdir if ready is not None and ready.workdir is not None else folder
    return str(base / launch.workdir) if launch.workdir else str(base)


def _kill(task: _Task) -> None:
    """SIGKILL its process group and everything in its cgroup."""
    if task.process is not None:
        task.process.signal(signal.SIGKILL)
    if task.cgroup is not None:
        task.cgroup.kill()


def _shares(launch: TaskLaunch) -> list[tuple[int, float]]:
    """The share of each of its devices a task holds."""
    if not launch.devices:
        return []
    share = launch.gpu / len(launch.devices) if launch.gpu > 0 else 1.0
    return [(device, share) for device in launch.devices]
