"""What a task brings, made ready on its node before it starts (docs/workloads.md): its
workload's code snapshot, unpacked once per node and copied for the task; its Python
environment, built once per node with uv; its image, pulled once per node (podman keeps
it).

This takes seconds to minutes, so it runs in threads of its own, never under the agent's
lock: the agent asks at each tick how far a task's preparation is (`Preparations.poll`),
starts the task once it is ready, and reports its end when it failed (uv's message, a
snapshot the server no longer has). Progress goes to the server as the agent's reports
say it ("building environment: 7 of 12 packages"), at most once a second per task.

Where things go (every directory root's own, so that no task can plant a name in it):
  DATA/snapshots/DIGEST      unpacked snapshots, the agent's only (0700 above them)
  DATA-envs/KEY              environments: every task account reads and runs, none writes
  DATA-workdirs/DIRECTORY/task-N
                             a task's private copy of its code, owned by its account, made
                             afresh at each start and kept after its end (its outputs),
                             until its workload is deleted
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.agent.containers import Containers, ImageFailed, ensure_image
from corral.agent.environments import EnvironmentCache, EnvironmentFailed
from corral.agent.identity import (
    Identity,
    environments_root,
    unreachable_parent,
    workdirs_root,
)
from corral.agent.planted import own_directory
from corral.agent.snapshots import SnapshotCache
from corral.messages import TaskLaunch
from corral.model.spec import PythonEnv

log = logging.getLogger("corral.agent")

# Preparations at once: builds are mostly waiting on uv and disks.
WORKERS = 4
# The least time between two progress reports of one task.
REPORT_EVERY = 1.0
# How far a step is: "7 of 12".
_COUNTS = re.compile(r"\d+ of \d+")
# The least time between two prunings of the node's caches.
PRUNE_EVERY = 60.0

Fetch = Callable[[str, str], bytes]
Progress = Callable[[TaskLaunch, str], None]


@dataclass(frozen=True, slots=True)
class NodeIndex:
    """Where this node's environments take packages from besides what a workload gives
    (an admin's `corral up --index-url --find-links`): an index instead of PyPI, and
    pages or directories of links, which uv asks after the workload's own."""

    index_url: str | None = None
    find_links: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Ready:
    """A task's prepared things: the directory it starts in (its code's copy) and its
    environment's directory, each None when it brings none."""

    workdir: Path | None = None
    venv: Path | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """Why a task's preparation failed: its end's reason."""

    reason: str


def brings(launch: TaskLaunch) -> bool:
    """Whether the task brings anything to prepare."""
    return launch.code is not None or launch.python is not None or launch.image is not None


class Preparations:
    """The preparations of one agent's tasks, by task and launch."""

    def __init__(
        self,
        data_dir: Path,
        fetch: Callable[[], Fetch | None],
        progress: Progress,
        containers: Callable[[], Containers],
        in_use: Callable[[], list[PythonEnv]] = list,
        index: NodeIndex | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.workdirs = workdirs_root(data_dir)
        self.snapshots = SnapshotCache(data_dir / "snapshots")
        # Made at first use: a node whose environments' root other accounts cannot reach
        # fails the tasks that need one, not the agent.
        self._environments: EnvironmentCache | None = None
        self._index = index or NodeIndex()
        # The server's snapshots as this agent reaches them (asked at each use: a transport
        # may set it after the agent was made).
        self._fetch = fetch
        self._progress = progress
        # What runs containers on this node, found at first use (corral.agent.containers).
        self._containers = containers
        # The environments of the node's running tasks, which pruning keeps.
        self._in_use = in_use
        self._pruned = 0.0
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="corral-prepare")
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, int, int | None], Future[Ready]] = {}

    def poll(self, launch: TaskLaunch, identity: Identity) -> Ready | Failed | None:
        """How far the task's preparation is: None while it runs (started now if it had
        not), Ready or Failed once it ended."""
        key = (launch.directory, launch.task, launch.launch)
        with self._lock:
            future = self._futures.get(key)
            if future is None:
                future = self._pool.submit(self._prepare, launch, identity)
                self._futures[key] = future
        if not future.done():
            return None
        with self._lock:
            self._futures.pop(key, None)
        error = future.exception()
        if error is None:
            return future.result()
        if isinstance(error, EnvironmentFailed):
            return Failed(f"its Python environment could not be built: {error}")
        if isinstance(error, ImageFailed):
            return Failed(f"its image cannot run here: {error.message}")
        log.warning("cannot prepare %s/%s: %s", launch.workload, launch.task, error)
        return Failed(f"could not be prepared: {error}")

    def existing(self, launch: TaskLaunch) -> Ready | None:
        """What a task that runs already (adopted after a restart) was prepared with, as
        far as it is still on the node; None when it brings nothing."""
        if not brings(launch):
            return None
        workdir = self.workdirs / launch.directory / f"task-{launch.task}"
        venv = None
        if launch.python is not None:
            try:
                venv = self.environments().built(launch.python)
            except EnvironmentFailed:
                venv = None
        return Ready(workdir if launch.code is not None and workdir.is_dir() else None, venv)

    def use_index(self, index: NodeIndex) -> None:
        """Take the node's index options from now on (a server's new settings)."""
        with self._lock:
            if index != self._index:
                self._index, self._environments = index, None

    def environments(self) -> EnvironmentCache:
        """The node's environments; EnvironmentFailed when this node can build none."""
        with self._lock:
            if self._environments is None:
                try:
                    self._environments = EnvironmentCache(
                        environments_root(self.data_dir),
                        index_url=self._index.index_url,
                        find_links=self._index.find_links,
                    )
                except PermissionError as error:
                    raise EnvironmentFailed(
                        f"this node keeps no environments: {error} (give corral a data "
                        "directory outside a private one, such as /var/lib/corral)"
                    ) from None
            return self._environments

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _prepare(self, launch: TaskLaunch, identity: Identity) -> Ready:
        said: list[Any] = [0.0, ""]

        def progress(what: str) -> None:
            # Each step is said; how far a step is, at most once a REPORT_EVERY.
            now, step = time.monotonic(), _COUNTS.sub("N of M", what)
            if now - said[0] >= REPORT_EVERY or step != said[1]:
                said[0], said[1] = now, step
                self._progress(launch, what)

        if launch.image is not None:
            progress("pulling image")
            ensure_image(self._containers(), launch.image)
        venv = None
        if launch.python is not None:
            progress("building environment")
            venv = self.environments().ensure(launch.python, progress)
        workdir = None
        if launch.code is not None:
            workdir = self._copy(launch, identity, progress)
        self._prune()
        return Ready(workdir, venv)

    def _prune(self) -> None:
        """Keep the caches within their caps (at most once a PRUNE_EVERY): the least
        recently used snapshots and environments go, never one a task runs in."""
        with self._lock:
            if time.monotonic() - self._pruned < PRUNE_EVERY:
                return
            self._pruned = time.monotonic()
        self.snapshots.prune()
        if self._environments is not None:
            keys = {self._environments.key_of(env) for env in self._in_use()}
            self._environments.prune(keys)

    def _copy(
        self, launch: TaskLaunch, identity: Identity, progress: Callable[[str], None]
    ) -> Path:
        """The task's own copy of its code, made afresh from the node's unpacked snapshot."""
        assert launch.code is not None
        fetch = self._fetch()
        if fetch is None:
            raise LookupError("this agent cannot reach the server's code snapshots")
        project, digest = launch.project, launch.code
        progress("fetching code")
        tree = self.snapshots.ensure(digest, lambda: fetch(project, digest))
        closed = unreachable_parent(self.workdirs)
        if closed is not None and identity.uid != os.geteuid():
            raise LookupError(
                f"its account could not reach a copy of its code: {closed} is closed to "
                "other accounts (give corral a data directory outside a private one, such "
                "as /var/lib/corral)"
            )
        own_directory(self.workdirs, 0o711, "workdirs")
        folder = self.workdirs / launch.directory
        own_directory(folder, 0o711, "workdirs")
        destination = folder / f"task-{launch.task}"
        self.snapshots.working_copy(tree, destination, identity.uid, identity.gid)
        return destination
