"""Chaos: `corral up` (server and agent, one process) runs a mixed workload while a driver
kills it with SIGKILL at random, seeded moments, and starts it again each time.

Two clients submit gangs, fractions, elastic and interactive work (and inference that
preempts training) to two projects that borrow from each other on four virtual GPUs; every
task is a `sleep` of 1 to 4 s, long enough that many outlive a restart and are adopted.
After each kill, while the server is down, the store is checked; after each restart, the
API and the task processes in /proc. At the end the clients stop, everything must
finish, and nothing may be left running. The invariants (invariants.py):

- no acknowledged submission lost or duplicated, nothing stored that was never sent;
- the store's own integrity check is clean (no device over-committed in it, no running
  workload without placements, no placement of a workload that is not running);
- every workload whose last settling event is a preemption is requeued (pending), or
  still runs on what it kept (an elastic one that shrank);
- no device over-committed, by the API's placements nor by the live task processes;
- every live task process runs a task the server binds, on its devices, and is the very
  process the server recorded; no task runs in two process groups;
- the scheduler's kept snapshot and state never differed from the store's
  (CORRAL_VERIFY_SNAPSHOTS).

CORRAL_CHAOS_ITERATIONS (default 20) sets the number of kills, CORRAL_CHAOS_SEED the seed.
Loopback only; the driver kills only the `corral up` it started (in its own process
group) and, at the end, the task processes it left.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import invariants as inv
import pytest
from livecorral import CorralUp, running, wait_until

from corral.store import Store, database_url

# Minutes of work: started before the other modules (tests/conftest.py).
pytestmark = pytest.mark.long

ITERATIONS = int(os.environ.get("CORRAL_CHAOS_ITERATIONS", "20"))
SEED = int(os.environ.get("CORRAL_CHAOS_SEED", "13"))
GPUS = 4
PROJECTS = {"alpha": 2.0, "beta": 2.0}
SUBMITTERS = 2
BACKLOG = 6  # pending workloads above which the clients wait: the end must drain quickly
TAG = "CHAOS_TAG"  # the submitter's sequence tag, in the workload's environment
# Every task of this run has RUN=<its data directory> in its environment: that, not where
# corral puts a task's files, is how /proc tells its processes from everyone else's.
RUN = "CHAOS_RUN"

# kind -> (weight, fields of the submission)
KINDS: dict[str, tuple[int, dict[str, Any]]] = {
    "fraction": (3, {"tasks": [{"replicas": 1, "gpu": 0.5}]}),
    "gang": (2, {"tasks": [{"replicas": 2, "gpu": 1}], "min_available": 2}),
    "elastic": (2, {"tasks": [{"replicas": 3, "gpu": 0.5}], "min_available": 1}),
    "interactive": (2, {"tasks": [{"replicas": 1, "gpu": 1}], "priority": "interactive"}),
    "inference": (1, {"tasks": [{"replicas": 1, "gpu": 0.25}], "priority": "inference"}),
}


class Clients:
    """SUBMITTERS threads that submit until stopped, each recording every 201."""

    def __init__(self, up: CorralUp, seed: int) -> None:
        self.up = up
        self.seed = seed
        self.acknowledged: dict[str, str] = {}
        self.sent: set[str] = set()
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._submit, args=(n,), daemon=True) for n in range(SUBMITTERS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            if thread.ident is not None:  # started
                thread.join(30)

    def _body(self, rng: random.Random, tag: str) -> dict[str, Any]:
        names = list(KINDS)
        kind = rng.choices(names, weights=[KINDS[name][0] for name in names])[0]
        return {
            "project": rng.choice(sorted(PROJECTS)),
            "command": ["/bin/sleep", f"{rng.uniform(1.0, 4.0):.2f}"],
            "env": {TAG: tag, RUN: str(self.up.data_dir)},
            **KINDS[kind][1],
        }

    def _submit(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        headers = {"Authorization": f"Bearer {self.up.token}"}
        with httpx.Client(base_url=f"{self.up.url}/api/v1", headers=headers, timeout=5) as client:
            count = 0
            while not self.stopping.is_set():
                try:
                    summary = client.get("/cluster")
                except httpx.TransportError:
                    self.stopping.wait(0.1)  # the server is down
                    continue
                if summary.status_code != 200:
                    with self.lock:
                        self.refused.append(f"GET /cluster: {summary.status_code} {summary.text}")
                    self.stopping.wait(0.1)
                    continue
                if summary.json()["workloads"]["pending"] >= BACKLOG:
                    self.stopping.wait(0.2)
                    continue
                tag = f"{number}-{count}"
                count += 1
                with self.lock:
                    self.sent.add(tag)
                try:
                    response = client.post("/workloads", json=self._body(rng, tag))
                except httpx.TransportError:
                    continue  # in flight at the kill: it may or may not be stored
                with self.lock:
                    if response.status_code == 201:
                        self.acknowledged[tag] = response.json()["name"]
                    else:
                        self.refused.append(f"{tag}: {response.status_code} {response.text}")
                self.stopping.wait(rng.uniform(0.05, 0.3))


def task_processes(data_dir: Path) -> list[inv.TaskProcess]:
    """The live task commands (not their launchers) of this run, from /proc."""
    marker = f"{RUN}={data_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not running(int(entry)):
            continue
        pid = int(entry)
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            if marker not in raw.split(b"\0"):
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            group = os.getpgid(pid)
        except OSError:
            continue  # it ended meanwhile, or it is not ours to read
        if b"corral.agent.launch" in command:
            continue
        items = raw.decode(errors="replace").split("\0")
        env = dict(item.split("=", 1) for item in items if "=" in item)
        devices = tuple(int(d) for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d)
        # A whole device each, unless a fraction is given; nothing without devices.
        share = float(env.get("CORRAL_GPU_FRACTION", "1")) if devices else 0.0
        found.append(
            inv.TaskProcess(
                pid, group, env["CORRAL_WORKLOAD"], int(env["CORRAL_TASK_INDEX"]), devices, share
            )
        )
    return found


@dataclass(frozen=True)
class StoreState:
    """What the store holds, read directly while the server is down."""

    integrity: list[str]
    workloads: list[inv.StoredWorkload]
    uses: list[tuple[str, int, float]]  # (node, device, share) of every placement


def read_store(data_dir: Path) -> StoreState:
    store = Store(database_url(data_dir, None))
    try:
        integrity = store.integrity_problems()
        records = store.list_workloads()
        last: dict[str, str] = {}
        for event in store.events(limit=10_000_000):
            if event.workload is not None and event.kind in inv.SETTLING:
                last[event.workload] = event.kind
    finally:
        store.close()
    return StoreState(
        integrity,
        [
            inv.StoredWorkload(
                r.name, r.spec.env.get(TAG), r.status, len(r.placements), last.get(r.name), r.reason
            )
            for r in records
        ],
        [
            (p.node, device, p.gpu / len(p.devices))
            for r in records
            for p in r.placements
            for device in p.devices
        ],
    )


def check_store(state: StoreState, clients: Clients, tally: inv.Tally) -> list[str]:
    """While the server is down: the store's integrity, the submissions, the requeues."""
    tally.count("store-integrity", 1)
    with clients.lock:
        acknowledged, sent = dict(clients.acknowledged), set(clients.sent)
    problems = list(state.integrity)
    problems += inv.submissions(acknowledged, sent, state.workloads, tally)
    problems += inv.requeued(state.workloads, tally)
    return problems + inv.overcommit(state.uses, "store", tally)


def check_live(up: CorralUp, tally: inv.Tally) -> list[str]:
    """With the server up: the API's placements against the task processes in /proc."""
    before = {(p.pid, p.group) for p in task_processes(up.data_dir)}
    bound: dict[tuple[str, int], inv.Binding] = {}
    uses = []
    for workload in up.get("/workloads", status="running"):
        launchers = dict(up.started_pids(workload["name"]))  # the latest start of each task
        for placement in workload["placements"]:
            devices = tuple(placement["devices"])
            share = placement["gpu"] / len(devices) if devices else 0.0
            key = (workload["name"], placement["task"])
            bound[key] = inv.Binding(devices, share, launchers.get(placement["task"]))
            uses += [(placement["node"], device, share) for device in devices]
    # Only processes alive before and after the API was read: one that started or ended
    # meanwhile may rightly disagree with what the API said at its moment.
    found = [p for p in task_processes(up.data_dir) if (p.pid, p.group) in before]
    problems = inv.overcommit(uses, "api", tally)
    problems += inv.overcommit(
        [("node", d, p.share) for p in found for d in p.devices], "processes", tally
    )
    return problems + inv.processes(found, bound, tally)


def persistent(check: Callable[[], list[str]], tries: int = 6, pause: float = 0.5) -> list[str]:
    """The violations that remain after `tries` looks: a cycle or a task ending between
    two reads is not a violation, an orphan or an over-commit stays."""
    problems: list[str] = []
    for _ in range(tries):
        problems = check()
        if not problems:
            return []
        time.sleep(pause)
    return problems


def strays_found(up: CorralUp) -> int:
    """How many task processes the restarted agents found that the store had not adopted."""
    if not up.log.exists():
        return 0
    return up.log.read_text().count("running from before this agent started")


def test_chaos_kill_9_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    # The kept snapshot and state are checked against the store every cycle.
    up = CorralUp(tmp_path / "corral", GPUS, env={"CORRAL_VERIFY_SNAPSHOTS": "1"})
    clients = Clients(up, SEED)
    tally = inv.Tally()
    violations: list[str] = []
    started = time.monotonic()
    try:
        up.start()
        for name, deserved in PROJECTS.items():
            up.queue(name, deserved)
        clients.start()
        for iteration in range(1, ITERATIONS + 1):
            time.sleep(rng.uniform(0.2, 1.5))
            up.kill9()
            found = check_store(read_store(up.data_dir), clients, tally)
            up.start()
            # A victim whose preemption was committed just before the kill, or a task
            # whose start was not, runs unbound until the restarted agent finds it.
            found += persistent(lambda: check_live(up, tally))
            violations += [f"after kill {iteration}: {problem}" for problem in found]
        clients.stop()
        # Everything acknowledged finishes, and nothing is left running.
        wait_until(
            lambda: all(w["status"] in ("succeeded", "failed") for w in up.get("/workloads")),
            90,
            "every workload to finish",
            0.5,
        )
        up.kill9()
        final = read_store(up.data_dir)
        violations += check_store(final, clients, tally)
        ended = {w.tag: w for w in final.workloads}
        tally.count("succeeded", len(clients.acknowledged))
        for tag, name in sorted(clients.acknowledged.items()):
            workload = ended.get(tag)
            if workload is None or workload.status == "succeeded":
                continue  # a lost one is reported by check_store
            violations.append(f"{tag} ({name}) ended {workload.status}: {workload.reason}")
        tally.count("nothing-left", 1)
        violations += [
            f"{p.workload}/{p.task} still runs after the end" for p in task_processes(up.data_dir)
        ]
        tally.count("kept-snapshots", 1)
        # As LiveServer.stop in tests/conftest.py reads the scheduler's own verification.
        violations += [
            line
            for line in up.log.read_text().splitlines()
            if "kept snapshot" in line or "kept state" in line
        ]
        violations += [f"refused: {refusal}" for refusal in clients.refused]
    finally:
        clients.stop()
        left_behind = up.close()
    print(
        f"\nchaos: {ITERATIONS} kills survived in {time.monotonic() - started:.0f} s "
        f"(seed {SEED}); {len(clients.acknowledged)} submissions acknowledged of "
        f"{len(clients.sent)} sent; {sum(tally.evaluations.values())} invariant checks over "
        f"{sum(tally.items.values())} items: {tally.summary()}; processes found running "
        f"unadopted after a restart (corral.agent.strays): {strays_found(up)}"
    )
    assert not violations, "\n".join(violations[:50])
    assert left_behind == [], f"task processes left behind: {left_behind}"
    assert len(clients.acknowledged) >= ITERATIONS, "too little work to mean anything"


def test_an_orphan_task_process_is_found_and_reported(tmp_path: Path) -> None:
    """The /proc side of the checks: a task process that nobody bound (planted here, as
    a kill between a spawn and its record would leave one) is found by its marker and
    reported, and a launcher beside it is not taken for a task."""
    env = {
        **os.environ,
        RUN: str(tmp_path),
        "CORRAL_WORKLOAD": "orphan",
        "CORRAL_TASK_INDEX": "0",
        "CUDA_VISIBLE_DEVICES": "1",
        "CORRAL_GPU_FRACTION": "0.5",
    }
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "corral.agent.launch"],
        env=env,
        start_new_session=True,
    )
    orphan = subprocess.Popen(["/bin/sleep", "30"], env=env, start_new_session=True)
    try:
        found = wait_until(lambda: task_processes(tmp_path), 10, "the planted process")
        assert found == [inv.TaskProcess(orphan.pid, orphan.pid, "orphan", 0, (1,), 0.5)]
        tally = inv.Tally()
        assert inv.processes(found, {}, tally) == [
            f"orphan/0 (pid {orphan.pid}) runs but is not bound"
        ]
    finally:
        for process in (launcher, orphan):
            process.kill()
            process.wait()
    assert task_processes(tmp_path) == []
