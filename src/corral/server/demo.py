"""`corral demo`: the pooling story, live, on 8 virtual GPUs, in under two minutes.

Three projects are each guaranteed 2 GPUs. team-a's training borrows all 8 while the
others are idle. team-b submits and takes its 2 GPUs back by reclaim: a team-a job
checkpoints, stops and goes back to the queue. When team-b's work is done, the borrowed
job resumes from its checkpoint. Everything runs for real: a server, an agent, processes,
signals; only the GPUs are virtual.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from corral.agent import Agent, discover
from corral.cluster.local import LocalCluster
from corral.model import Node
from corral.model.spec import NodeSpec
from corral.server.app import create_app
from corral.server.main import open_store

TRAIN_STEPS = 240
STEP_SECONDS = 0.1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Demo:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.start = time.monotonic()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._api: httpx.Client | None = None

    def log(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.start:5.1f}s] {text}")

    def run(self, data_dir: Path) -> int:
        store, token = open_store(data_dir, None)
        assert token is not None
        found = discover(8, "virtual-H100")
        store.register_node(
            NodeSpec(
                Node("demo-node", gpus=8, gpu_model=found.model, gpu_memory=found.memory),
                found.devices,
                virtual=True,
            )
        )
        # The demo runs its own commands for its own users: as whoever runs it, even root.
        agent = Agent(
            "demo-node", data_dir, poll_interval=0.1, devices=found.devices, run_as_submitter=False
        )
        app = create_app(store, cluster=LocalCluster([agent]), data_dir=data_dir, interval=0.5)
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        try:
            self._wait(lambda: self._healthy(port), 20, "the server to start")
            return self._story(api)
        finally:
            api.close()
            server.should_exit = True
            thread.join(timeout=30)
            # The agent made it beside the data directory, outside what the caller removes.
            shutil.rmtree(agent.workloads_dir, ignore_errors=True)

    @staticmethod
    def _healthy(port: int) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait(self, done: Callable[[], bool], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}")
            self._sample_if_due()
            time.sleep(0.2)

    def _pause(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        self._wait(lambda: time.monotonic() >= until, seconds + 5, "a pause")

    @property
    def api(self) -> httpx.Client:
        assert self._api is not None, "the story has not started"
        return self._api

    def _sample_if_due(self) -> None:
        if self._api is None:
            # Still waiting for the server (a slow start): the story, and its samples,
            # begin once it answers.
            return
        now = time.monotonic() - self.start
        if self.samples and now - self.samples[-1][0] < 1.0:
            return
        allocated = {
            queue["name"]: (queue["allocated"] or {}).get("gpu") or 0.0
            for queue in self.api.get("/queues").json()
        }
        self.samples.append((now, allocated))

    def _workloads(self) -> dict[str, dict[str, Any]]:
        return {w["name"]: w for w in self.api.get("/workloads").json()}

    def _story(self, api: httpx.Client) -> int:
        self._api = api
        self._team_a_borrows(api)
        victims = self._team_b_reclaims(api)
        return self._victims_resume(api, victims)

    def _team_a_borrows(self, api: httpx.Client) -> None:
        """Three teams deserve 2 GPUs each; team-a's 4 jobs borrow the idle ones."""
        self.log("8 virtual GPUs on one node; team-a, team-b and team-c each deserve 2")
        for name in ("team-a", "team-b", "team-c"):
            api.post("/queues", json={"name": name, "deserved": 2}).raise_for_status()
        train = [
            sys.executable,
            "-m",
            "corral.sdk.example",
            "--steps",
            str(TRAIN_STEPS),
            "--step-seconds",
            str(STEP_SECONDS),
            "--checkpoint-every",
            "20",
        ]
        for index in range(1, 5):
            api.post(
                "/workloads",
                json={
                    "name": f"a-train-{index}",
                    "project": "team-a",
                    "tasks": [{"gpu": 2}],
                    "priority": "train",
                    "command": train,
                    "grace_period": 10,
                },
            ).raise_for_status()
        self.log("team-a submits 4 training jobs of 2 GPUs: it borrows the idle GPUs")
        self._wait(
            lambda: all(w["status"] == "running" for w in self._workloads().values()),
            30,
            "team-a's jobs to run",
        )
        # Training, with their handler of preemption in place (a loaded machine takes
        # seconds to start Python): a job stopped before has nothing to checkpoint.
        self._wait(
            lambda: all(
                "starting from scratch" in api.get(f"/workloads/a-train-{i}/logs").json()["text"]
                for i in range(1, 5)
            ),
            60,
            "team-a's jobs to start training",
        )
        self._show_allocation()
        self._pause(3)

    def _team_b_reclaims(self, api: httpx.Client) -> list[str]:
        """team-b's job within its guarantee reclaims GPUs lent to team-a; returns the
        jobs of team-a it preempted."""
        api.post(
            "/workloads",
            json={
                "name": "b-job",
                "project": "team-b",
                "tasks": [{"gpu": 2}],
                "priority": "train",
                "command": [sys.executable, "-c", "import time; time.sleep(8); print('b done')"],
            },
        ).raise_for_status()
        self.log("team-b submits a 2-GPU job: it is within its guarantee, so it reclaims")
        self._wait(
            lambda: self._workloads()["b-job"]["status"] == "running", 30, "team-b's job to run"
        )
        victims = [
            name
            for name, w in self._workloads().items()
            if name.startswith("a-") and w["status"] == "pending"
        ]
        for victim in victims:
            events = api.get(f"/workloads/{victim}/events").json()
            preempted = [e["reason"] for e in events if e["kind"] == "preempted"]
            self.log(f"{victim}: {preempted[-1] if preempted else 'pending'}")
        self._show_allocation()
        return victims

    def _victims_resume(self, api: httpx.Client, victims: list[str]) -> int:
        """Every job finishes, the preempted ones from their checkpoints; returns the
        demo's exit status."""
        self._wait(
            lambda: self._workloads()["b-job"]["status"] == "succeeded",
            30,
            "team-b's job to finish",
        )
        self.log("team-b's job is done; the preempted job runs again")
        self._wait(
            lambda: all(w["status"] == "succeeded" for w in self._workloads().values()),
            90,
            "every job to finish",
        )
        for victim in victims:
            text = api.get(f"/workloads/{victim}/logs").json()["text"]
            lines = [
                line
                for line in text.splitlines()
                if "preempted" in line or "resuming" in line or line.startswith("done")
            ]
            for line in lines:
                self.log(f"{victim} log: {line}")
        self._show_timeline()
        resumed = all(
            "resuming from step" in api.get(f"/workloads/{v}/logs").json()["text"] for v in victims
        )
        self.log(
            "every job succeeded; the preempted job resumed from its checkpoint"
            if resumed and victims
            else "every job succeeded, but no job was resumed from a checkpoint"
        )
        return 0 if resumed and victims else 1

    def _show_allocation(self) -> None:
        queues = self.api.get("/queues").json()
        text = ", ".join(
            f"{q['name']} {((q['allocated'] or {}).get('gpu') or 0):g}/"
            f"{q['deserved']['gpu']:g} deserved"
            for q in queues
        )
        self.log(f"allocated GPUs: {text}")

    def _show_timeline(self) -> None:
        self.say("")
        self.say("measured allocation (GPUs, sampled every second):")
        self.say("   time  team-a  team-b  team-c")
        for moment, allocated in self.samples[:: max(1, len(self.samples) // 15)]:
            row = "  ".join(f"{allocated.get(q, 0):6g}" for q in ("team-a", "team-b", "team-c"))
            self.say(f"  {moment:5.1f}  {row}")
        self.say("")


def run_demo(say: Callable[[str], None] = print) -> int:
    """Run the story in a temporary data directory (gone, with the directory of its
    workloads beside it, when the story ends); 0 when it went as told."""
    with tempfile.TemporaryDirectory(prefix="corral-demo-") as directory:
        return Demo(say).run(Path(directory))
