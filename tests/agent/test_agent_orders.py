"""Orders that reach an agent in another order than they were decided in. The server
decides in several threads, and a Ray agent is a threaded actor that may run two calls in
either order; CI once saw a gang's second attempt fail when a stop decided during its
requeue reached its node after the new launch had.

Here a real store, scheduler, dispatcher and agent run a workload through two attempts;
the transport holds stops back until the test delivers them, as a busy actor's threads
may. A stop decided before the task was bound again leaves the new binding running; one
decided after it stops it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livecorral import kill_everything_of, running, wait_until

from corral.agent import Agent
from corral.cluster.local import LocalCluster
from corral.control.dispatch import Dispatcher
from corral.control.scheduler import SchedulerLoop
from corral.messages import FENCED, TaskStop
from corral.model import Decisions, Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.store import Store
from corral.store.records import Release
from corral.store.reports import Beat, Ended, Started
from corral.store.rules import enforce_rules, set_rules


def spec(name: str, replicas: int, gpu: float, **more: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {"command": ("true",)} | more
    return WorkloadSpec(
        name=name,
        project="team",
        user="alice",
        task_groups=(TaskGroup("main", replicas, gpu),),
        **fields,
    )


class HeldStops(LocalCluster):
    """The in-process transport, but stops wait while `holding` until `deliver`."""

    def __init__(self, agents: list[Agent]) -> None:
        super().__init__(agents)
        self.holding = False
        self.held: list[TaskStop] = []

    def stop(self, stops: list[TaskStop]) -> None:
        if self.holding:
            self.held.extend(stops)
        else:
            super().stop(stops)

    def deliver(self, stops: list[TaskStop]) -> None:
        for stop in stops:
            self.held.remove(stop)
        super().stop(stops)


class Plant:
    """One node with one virtual GPU, its agent, the dispatcher and the scheduler."""

    def __init__(self, store: Store, folder: Path) -> None:
        self.store = store
        device = Device(0, "n0-0", "virtual", 80 << 30, True)
        store.create_queue(Queue("team", deserved=Resources(gpu=1)))
        store.register_node(NodeSpec(Node("n0", gpus=1), (device,), virtual=True))
        self.agent = Agent(
            "n0",
            folder / "agent",
            heartbeat_interval=3600.0,
            poll_interval=0.05,
            devices=(device,),
            workloads_dir=folder / "workloads",
            run_as_submitter=False,
        )
        self.cluster = HeldStops([self.agent])
        self.loop = SchedulerLoop(store)
        self.dispatcher = Dispatcher(store, self.cluster, folder, self.loop.trigger)
        self.loop.on_changes = self.changed
        self.cluster.connect(self.dispatcher)

    def changed(self, decisions: Decisions, releases: list[Release]) -> None:
        # What the server does after a cycle (corral.control.plane).
        self.dispatcher.release(releases)
        self.dispatcher.started(set(decisions.bindings))

    def bind(self, name: str) -> int:
        """A cycle that binds `name`; the pid of the process its agent started for it."""
        self.loop.run_cycle()
        assert self.store.get_workload(name).status == "running"
        return int(wait_until(lambda: self.pid(name), 30, f"{name}'s process"))

    def pid(self, name: str) -> int | None:
        self.dispatcher.reports.flush()
        work = self.store.bound_work(names=[name])
        return work[0].tasks[0].pid if work and work[0].tasks[0].state == "running" else None

    def suspend(self, name: str) -> None:
        # What POST /workloads/NAME/suspend does (corral.api.routers.workloads).
        record, releases = self.store.suspend(name, "test")
        self.dispatcher.release(releases, record.spec.grace_period)

    def close(self) -> None:
        self.agent.close()
        self.dispatcher.reports.stop()


@pytest.fixture
def plant(store: Store, tmp_path: Path) -> Iterator[Plant]:
    made = Plant(store, tmp_path)
    try:
        yield made
    finally:
        made.close()
        kill_everything_of(tmp_path)


def test_a_stop_decided_between_two_attempts_spares_the_second(plant: Plant) -> None:
    store = plant.store
    store.submit(spec("w", 1, 1.0, command=("sleep", "600"), backoff_limit=0))
    first = plant.bind("w")
    # Taken off its node; the agent is told to stop it, and the reconciler, which sees it
    # still running there, decides to stop it too. Both stops wait in the transport.
    plant.cluster.holding = True
    plant.suspend("w")
    plant.dispatcher.reconcile()
    ordered, late = plant.cluster.held
    assert late.reason == "no longer bound here" and late.tasks == (0,)
    # The first arrives; the process ends and the agent lets the task go.
    plant.cluster.deliver([ordered])
    wait_until(lambda: not running(first), 30, "the first attempt to end")
    wait_until(lambda: ("w", 0) not in plant.agent.running(), 30, "the agent to let it go")
    # Bound again: the second attempt starts on the same node.
    store.resume("w", "test")
    second = plant.bind("w")
    assert second != first and store.get_workload("w").attempts == 2
    # Now the reconciler's stop arrives, decided before this binding: it stops nothing.
    plant.cluster.deliver([late])
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert running(second), "the late stop stopped the second attempt"
        time.sleep(0.05)
    assert plant.pid("w") == second
    record = store.get_workload("w")
    assert (record.status, record.attempts) == ("running", 2), record.reason
    # A stop decided now, after the binding, stops it.
    plant.cluster.holding = False
    plant.suspend("w")
    wait_until(lambda: not running(second), 30, "the second attempt to stop")
    plant.dispatcher.reports.flush()
    assert store.get_workload("w").status == "suspended"
    assert [e.kind for e in store.events("w") if e.kind in ("failed", "retrying")] == []


def test_what_the_store_releases_carries_the_time_before_the_release(store: Store) -> None:
    store.create_queue(Queue("team", deserved=Resources(gpu=4)))
    for node in ("n0", "n1"):
        devices = tuple(Device(i, f"{node}-{i}", "virtual", 80 << 30, True) for i in range(2))
        store.register_node(NodeSpec(Node(node, gpus=2), devices, virtual=True))
    loop = SchedulerLoop(store)
    # A task of a gang is fenced: its sibling is stopped.
    store.submit(spec("a", 2, 2.0))
    loop.run_cycle()
    before = time.time()
    stopped = store.task_ended("a", 0, 137, "fenced: cut off", attempt=1, cause=FENCED)
    after = time.time()
    (decided,) = {r.decided_at for r in stopped if r.tasks == (1,)}
    assert len(stopped) == 1 and decided is not None and before <= decided <= after
    store.delete_workload("a", "test")  # requeued, it would take the devices again
    # The same through the agents' reports, with a start of a task no longer bound.
    store.submit(spec("b", 2, 2.0))
    loop.run_cycle()
    (first,) = [p.node for p in store.get_workload("b").placements if p.task == 0]
    before = time.time()
    outcome = store.write_reports(
        [
            Started("n0", "a", 0, 4242, 1),
            Ended(first, "b", 0, 137, "fenced: cut off", 1, None, FENCED),
        ]
    )
    after = time.time()
    assert [u.workload for u in outcome.unbound] == ["a"]
    assert outcome.decided_at is not None and before <= outcome.decided_at <= after
    assert [(r.tasks, r.decided_at) for r in outcome.releases] == [((1,), outcome.decided_at)]
    store.delete_workload("b", "test")
    # A task of a gang fails, and the verdict that waited for its other node comes.
    store.submit(spec("f", 2, 2.0))
    loop.run_cycle()
    (first,) = [p.node for p in store.get_workload("f").placements if p.task == 0]
    assert store.task_ended("f", 0, 1, "exited with code 1", attempt=1) == []
    before = time.time()
    stopped = store.settle_failing(0.0)
    after = time.time()
    (decided,) = {r.decided_at for r in stopped if r.tasks == (1,)}
    assert len(stopped) == 1 and decided is not None and before <= decided <= after
    # Cancelled.
    store.submit(spec("c", 2, 2.0))
    loop.run_cycle()
    before = time.time()
    _, stopped = store.cancel("c", "test")
    after = time.time()
    assert sorted(r.tasks for r in stopped) == [(0,), (1,)]
    (decided,) = {r.decided_at for r in stopped}
    assert decided is not None and before <= decided <= after
    # Suspended, then (resumed and bound again) deleted: the tasks of each node, named by
    # the store in the transaction that took them off, with its time.
    store.submit(spec("d", 2, 2.0))
    loop.run_cycle()
    for change, done in ((store.suspend, "suspended"), (store.delete_workload, "deleted")):
        before = time.time()
        record, stopped = change("d", "test")
        after = time.time()
        assert sorted((r.node, r.tasks) for r in stopped) == sorted(
            (p.node, (p.task,)) for p in record.placements
        )
        assert {r.reason for r in stopped} == {f"{done} by test"}
        (decided,) = {r.decided_at for r in stopped}
        assert decided is not None and before <= decided <= after
        assert len(stopped) == 2  # its two tasks, one on each node
        if done == "suspended":
            store.resume("d", "test")
            loop.run_cycle()
    # Stopped by a rule (the project's maximum runtime for its training work): the same.
    set_rules(store, "team", {"train": {"max_runtime": "1m"}})
    store.submit(spec("r", 2, 2.0))
    loop.run_cycle()
    placed = store.get_workload("r").placements
    before = time.time()
    (enforced,) = [e for e in enforce_rules(store, time.time() + 3600) if e.record.name == "r"]
    after = time.time()
    assert sorted((r.node, r.tasks) for r in enforced.releases) == sorted(
        (p.node, (p.task,)) for p in placed
    )
    assert len(enforced.releases) == 2 and {r.workload for r in enforced.releases} == {"r"}
    assert {r.reason for r in enforced.releases} == {enforced.reason}
    (decided,) = {r.decided_at for r in enforced.releases}
    assert decided is not None and before <= decided <= after
    # And nothing of it once the store has taken the reports in: a write that stops
    # nothing says no time.
    assert store.write_reports([Beat("n0")]).decided_at is None
