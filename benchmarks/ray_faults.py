"""Distributed jobs against the faults of their machines, on a local Ray cluster.

    python benchmarks/ray_faults.py [--json] [--runs N] [--absence S]

Starts a Ray cluster on loopback (`ray.cluster_utils.Cluster`: a head and 3 worker nodes
on 127.0.0.x with 2 virtual GPUs each) and `corral server --ray` on it with its default
timeouts (loss 10 s, fence 4 s) and a checkpoint root every node sees. The job is
tests/ray/ranks.py: 2 ranks of 2 GPUs, which exchange a step every 100 ms, exit 1 as soon
as a peer vanishes (as gloo, NCCL and MPI ranks do), and checkpoint every 10 steps.

- Node loss, N runs: a rank's node is removed (its raylet killed, Ray's processes with
  it; the task lives on until fenced). `node_loss_failed`: runs whose workload failed or
  used a retry (goal 0); `loss_to_requeued_s_p50`: removal until the `requeued` event;
  `requeued_to_running_s_p50`: until both ranks of the next attempt ran a step;
  `resumed_behind_checkpoint`: ranks that resumed before their last checkpoint (goal 0).
  Beside them, the bare stack's own figure: `ray_declares_dead_s_p50`, removal until Ray
  lists the node as dead.
- Server restart: the server is killed (-9) while the job runs and started again S
  seconds later (30 by default). `server_restart_fenced`: ranks that stopped or changed
  process meanwhile (goal 0).
- Logs: a task prints a numbered line every 10 ms while the server is killed three
  times. `log_lines_lost` and `log_lines_doubled` in the stored log (goal 0 each).

Everything it started is stopped by handle or process group (never `ray stop`). With
--json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ray_cluster import GPUS, PYTHON, Corral, kill_tasks, ray_cluster, wait

RANKS = str(Path(__file__).resolve().parents[1] / "tests" / "ray" / "ranks.py")
COUNTER = """import sys, time
for i in range(int(sys.argv[1])):
    print(f"line {i}", flush=True)
    time.sleep(0.01)
"""


class Job:
    """The cluster, the server and the job's files."""

    def __init__(self, cluster: Any, root: Path) -> None:
        from corral.cluster.ray import connect

        # A driver of its own, to ask Ray when it declares a removed node dead.
        connect(cluster.address)
        self.cluster = cluster
        self.root = root
        self.nodes: dict[str, Any] = {}
        self.next_ip = 2
        for _ in range(3):
            self.add_node()
        (root / "shared").mkdir()
        (root / "records").mkdir()
        os.environ["CORRAL_RAY_NAMESPACE"] = f"corral-faults-{os.getpid()}"
        self.args = [
            "server",
            "--ray",
            cluster.address,
            "--agent-dir",
            str(root / "agents"),
            "--checkpoint-root",
            str(root / "shared"),
        ]
        self.server = Corral(self.args, root)
        wait(lambda: len(self.ready()) == 3, 60, "3 nodes")
        self.server.post("/queues", {"name": "bench", "deserved": 8})

    def add_node(self) -> None:
        name = f"n{self.next_ip - 2}"
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1,
            node_ip_address=f"127.0.0.{self.next_ip}",
            resources={"corral_virtual_gpus": GPUS},
            labels={"corral.io/name": name},
        )
        self.next_ip += 1

    def ready(self) -> list[str]:
        return [n["name"] for n in self.server.get("/nodes") if n["state"] == "ready"]

    def restart(self, after: float = 0.0) -> None:
        self.server.close()
        time.sleep(after)
        self.server = Corral(self.args, self.root)

    def submit_ranks(self, name: str) -> None:
        stop = self.root / f"{name}.stop"
        self.server.post(
            "/workloads",
            {
                "name": name,
                "project": "bench",
                "tasks": [{"replicas": 2, "gpu": GPUS}],
                "command": [PYTHON, RANKS, str(self.root / "records"), str(stop)],
            },
        )

    def records(self, name: str, attempt: int) -> dict[int, dict[str, Any]]:
        found = {}
        for path in (self.root / "records").glob(f"{name}-*-{attempt}.json"):
            with contextlib.suppress(OSError, ValueError):
                found[int(path.stem.rsplit("-", 2)[1])] = json.loads(path.read_text())
        return found

    def progressing(self, name: str, attempt: int) -> dict[int, dict[str, Any]]:
        def check() -> dict[int, dict[str, Any]] | None:
            found = self.records(name, attempt)
            return found if _stepped(found) else None

        found: dict[int, dict[str, Any]] = wait(check, 120, f"{name} attempt {attempt}")
        return found

    def finish(self, name: str) -> dict[str, Any]:
        (self.root / f"{name}.stop").touch()

        def ended() -> dict[str, Any] | None:
            workload: dict[str, Any] = self.server.get(f"/workloads/{name}")
            return workload if workload["status"] in ("succeeded", "failed") else None

        done: dict[str, Any] = wait(ended, 120, f"{name} to end")
        return done


def _stepped(records: dict[int, dict[str, Any]]) -> bool:
    """Whether both ranks checkpointed past where they resumed: they run together."""
    return len(records) == 2 and all(r["checkpoint"] > r["start"] for r in records.values())


def node_loss(job: Job, runs: int) -> dict[str, Any]:
    import ray

    requeued, running, dead = [], [], []
    failed = behind = 0
    for run in range(runs):
        name = f"loss-{run}"
        job.submit_ranks(name)
        job.progressing(name, 1)
        nodes = {p["task"]: p["node"] for p in job.server.get(f"/workloads/{name}")["placements"]}
        victim = nodes[run % 2]
        node_id = job.nodes[victim].node_id
        begin = time.perf_counter()
        job.cluster.remove_node(job.nodes.pop(victim), allow_graceful=False)

        # Each moment is taken as it comes, in one loop: when Ray lists the node as dead,
        # when the job is requeued, when both ranks of the next attempt ran a step.
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 180
        while len(seen) < 3:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run}: only {sorted(seen)} within 180 s")
            now = time.perf_counter() - begin
            if "dead" not in seen and any(
                n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()
            ):
                seen["dead"] = now
            if "requeued" not in seen and job.server.events(name, "requeued"):
                seen["requeued"] = now
            if "running" not in seen and _stepped(job.records(name, 2)):
                seen["running"] = now
            time.sleep(0.1)
        dead.append(seen["dead"])
        requeued.append(seen["requeued"])
        running.append(seen["running"] - seen["requeued"])
        after = job.records(name, 2)
        last = job.records(name, 1)
        behind += sum(after[rank]["start"] < last[rank]["checkpoint"] for rank in (0, 1))
        done = job.finish(name)
        kinds = {e["kind"] for e in job.server.get(f"/workloads/{name}/events")}
        failed += done["status"] != "succeeded" or bool(kinds & {"failed", "retrying"})
        print(
            f"node loss {run + 1}/{runs}: {victim} removed; Ray declared it dead after "
            f"{dead[-1]:.1f} s, corral requeued the job after {requeued[-1]:.1f} s, running "
            f"again {running[-1]:.1f} s later; {done['status']}",
            flush=True,
        )
        job.add_node()
        wait(lambda: len(job.ready()) >= 3, 60, "the replacement node")
    return {
        "node_loss_runs": runs,
        "node_loss_failed": failed,
        "loss_to_requeued_s_p50": statistics.median(requeued),
        "requeued_to_running_s_p50": statistics.median(running),
        "resumed_behind_checkpoint": behind,
        "ray_declares_dead_s_p50": statistics.median(dead),
    }


def task_processes(workload: str) -> set[int]:
    """The pids of the workload's task processes on this machine, seen from outside (a
    task's own pid is its namespace's), launchers not counted."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            mine = f"CORRAL_WORKLOAD={workload}".encode() in environ
            if mine and b"ranks.py" in cmdline and b"corral.agent.launch" not in cmdline:
                found.add(int(entry))
    return found


def server_restart(job: Job, absence: float) -> dict[str, Any]:
    job.submit_ranks("restart")
    before = job.progressing("restart", 1)
    processes = task_processes("restart")
    job.restart(after=absence)
    # A restarted server declares no node lost within a loss timeout of its start.
    time.sleep(15)
    after = job.records("restart", 1)
    changed = sum(after.get(rank, {}).get("run") != before[rank]["run"] for rank in (0, 1))
    stopped = len(processes - task_processes("restart"))
    kinds = [e["kind"] for e in job.server.get("/workloads/restart/events")]
    fenced = max(changed, stopped, kinds.count("requeued") + kinds.count("retrying"))
    done = job.finish("restart")
    print(
        f"server down {absence:g} s: {fenced} ranks fenced or moved, {done['status']}, "
        f"attempts {done['attempts']}",
        flush=True,
    )
    return {"server_absence_s": absence, "server_restart_fenced": fenced}


def logs(job: Job, lines: int = 2500) -> dict[str, Any]:
    job.server.post(
        "/workloads",
        {
            "name": "counter",
            "project": "bench",
            "tasks": [{"gpu": 1}],
            "command": [PYTHON, "-c", COUNTER, str(lines)],
        },
    )
    wait(lambda: job.server.get("/workloads/counter")["status"] == "running", 60, "the task")
    for _ in range(3):
        time.sleep(2)
        job.restart()
    wait(lambda: job.server.get("/workloads/counter")["status"] == "succeeded", 120, "the end")
    time.sleep(3)  # the last answer's output
    text = job.server.get("/workloads/counter/logs", task=0)["text"]
    seen = text.splitlines()
    expected = [f"line {i}" for i in range(lines)]
    lost = len(set(expected) - set(seen))
    doubled = len(seen) - len(set(seen))
    print(f"logs: {lines} lines printed, {lost} lost, {doubled} doubled", flush=True)
    return {"log_lines": lines, "log_lines_lost": lost, "log_lines_doubled": doubled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--absence", type=float, default=30.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-faults-bench-"))
    result: dict[str, Any] = {}
    with ray_cluster(racks=()) as cluster:
        job = Job(cluster, root)
        try:
            result.update(node_loss(job, args.runs))
            result.update(server_restart(job, args.absence))
            result.update(logs(job))
        finally:
            import ray

            job.server.close()
            kill_tasks(root)
            ray.shutdown()
    result = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
    if args.json:
        print(json.dumps(result))
    else:
        json.dump(result, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
