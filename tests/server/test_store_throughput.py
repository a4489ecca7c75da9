"""What makes the control plane fast, and must not make it wrong: group commit of
submissions, the snapshot the scheduler keeps between cycles, the token cache, the
database-side cluster counts, and server-made names that clash.

Each runs against a real store in this process, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import Session

from corral.api import submit as submitting
from corral.api import tokens_cache
from corral.control.scheduler import SchedulerLoop
from corral.control.submissions import Submissions
from corral.model import Node, Queue, Resources, TaskGroup
from corral.model.spec import Device, NodeSpec, WorkloadSpec
from corral.server.app import create_app
from corral.store import Conflict, Invalid, Store
from corral.store.schema import NodeRow
from corral.store.usage import open_allocations


def spec(name: str, project: str = "team", gpu: float = 1.0, **extra: Any) -> WorkloadSpec:
    return WorkloadSpec(
        name=name,
        project=project,
        user="alice",
        task_groups=(TaskGroup("main", 1, gpu),),
        command=("true",),
        **extra,
    )


def node(name: str, gpus: int = 4) -> NodeSpec:
    return NodeSpec(
        Node(name, gpus=gpus),
        tuple(Device(i, f"{name}-{i}", "virtual", 80 << 30, True) for i in range(gpus)),
        virtual=True,
    )


def prepared(store: Store, nodes: int = 2) -> Store:
    store.create_queue(Queue("team", deserved=Resources(gpu=nodes * 4)))
    for index in range(nodes):
        store.register_node(node(f"n{index}"))
    return store


def commits(store: Store) -> list[float]:
    """Appends the time of every transaction the store commits from now on."""
    seen: list[float] = []
    event.listen(store.engine, "commit", lambda _connection: seen.append(time.time()))
    return seen


# -- group commit --------------------------------------------------------------------------


def written_together(store: Store, specs: list[WorkloadSpec]) -> tuple[list[Any], list[float]]:
    """Submit `specs` through the server's submission writer (corral.control.submissions),
    queued all at once: behind a first submission that the writer is writing, and that
    waits for the write lock this holds (as a scheduling cycle does) until all are queued.
    Returns what each gave, and the commits after the first began to wait."""
    submissions = Submissions(store, lambda: None)
    writer = submissions._writer
    seen: list[float] = []

    async def submit() -> list[Any]:
        with store.writing():
            first = asyncio.ensure_future(submissions.submit(spec("first")))
            deadline = time.monotonic() + 10
            while writer._thread is None or writer._queued:
                assert time.monotonic() < deadline, "the writer did not take the first"
                await asyncio.sleep(0.01)
            nonlocal seen
            seen = commits(store)
            queued = [asyncio.ensure_future(submissions.submit(s)) for s in specs]
            while len(writer._queued) < len(specs):
                assert time.monotonic() < deadline, "submissions did not queue"
                await asyncio.sleep(0.01)
            assert not first.done() and not any(q.done() for q in queued), (
                "a submission was answered before it was committed"
            )
        await first
        return await asyncio.gather(*queued, return_exceptions=True)

    try:
        outcomes = asyncio.run(submit())
    finally:
        submissions.stop()
    return outcomes, seen


def test_queued_submissions_share_one_transaction(store: Store) -> None:
    prepared(store)
    names = [f"w{i}" for i in range(10)]
    results, seen = written_together(store, [spec(name) for name in names])
    assert len(seen) == 2, f"{len(seen)} transactions for the first and {len(names)} queued"
    ids = [record.id for record in results]
    assert len(set(ids)) == len(names)
    stored = {record.name: record for record in store.list_workloads()}
    assert sorted(stored) == ["first", *names]
    for name, record in zip(names, results, strict=True):
        assert stored[name].status == "pending"
        assert stored[name].spec == spec(name)
        assert stored[name].id == record.id
        assert stored[name].created_at == pytest.approx(record.created_at)
    assert Counter(e.kind for e in store.events())["submitted"] == len(names) + 1


def test_each_submission_of_a_batch_gets_its_own_error(store: Store) -> None:
    prepared(store)
    store.create_queue(Queue("dept"))
    store.create_queue(Queue("inner", parent="dept"))
    store.submit(spec("taken"))
    batch = [
        spec("a"),
        spec("taken"),  # exists already
        spec("b", project="nowhere"),  # no such queue
        spec("c", project="dept"),  # a department
        spec("d"),
        spec("d"),  # the same name twice in one batch: the first wins
        # Passes every check but cannot be written (not JSON): the batch's transaction
        # fails, and each is written alone, so that this one fails alone.
        spec("e", env={"KEY": object()}),  # type: ignore[dict-item]
        spec("f"),
    ]
    outcomes, _ = written_together(store, batch)
    kinds = [type(outcome).__name__ for outcome in outcomes]
    assert isinstance(outcomes[1], Conflict)
    assert isinstance(outcomes[2], Invalid) and outcomes[2].field == "project"
    assert isinstance(outcomes[3], Invalid) and "department" in str(outcomes[3])
    assert sorted(kinds[4:6]) == ["Conflict", "WorkloadRecord"]
    assert isinstance(outcomes[6], Exception) and not isinstance(outcomes[6], Conflict | Invalid)
    assert kinds[0] == kinds[7] == "WorkloadRecord"
    assert sorted(r.name for r in store.list_workloads()) == ["a", "d", "f", "first", "taken"]
    submitted = sorted(e.workload or "" for e in store.events() if e.kind == "submitted")
    assert submitted == ["a", "d", "f", "first", "taken"]


def test_a_submission_alone_raises_its_own_error(store: Store) -> None:
    prepared(store)
    assert store.submit(spec("a")).name == "a"
    with pytest.raises(Conflict):
        store.submit(spec("a"))
    with pytest.raises(Invalid, match="project"):
        store.submit(spec("b", project="nowhere"))
    assert [r.name for r in store.list_workloads()] == ["a"]


def test_concurrent_submissions_are_each_stored_once(store: Store) -> None:
    prepared(store)
    accepted: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(25):
            # Every client also submits names that another client submits.
            name = f"w-{(k * 25 + i) % 300}"
            try:
                record = store.submit(spec(name))
            except Conflict:
                with lock:
                    refused.append(name)
            else:
                assert record.name == name
                with lock:
                    accepted.append(name)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stored = [record.name for record in store.list_workloads()]
    assert sorted(stored) == sorted(accepted)
    assert len(set(accepted)) == len(accepted) == 300
    assert len(refused) == 16 * 25 - 300
    assert store.integrity_problems() == []


def test_work_added_while_cycles_write_is_each_scheduled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On PostgreSQL submissions are written beside a cycle's write, not after it. A cycle
    # reads new work by id, after the newest it read: work committed out of the order of
    # its ids would be passed over for good by a kept snapshot. Clients submit alone and
    # in batches while cycles run back to back; every cycle's kept snapshot is checked
    # against a full read of the store, and all the work is bound in the end.
    store.create_queue(Queue("team", deserved=Resources(gpu=800)))
    for index in range(10):
        store.register_node(node(f"n{index}", gpus=80))
    monkeypatch.setattr("corral.control.scheduler.FULL_SNAPSHOT_SECONDS", 3600.0)  # however slow
    loop = SchedulerLoop(store)
    loop.verify = True
    submitting = threading.Event()
    submitting.set()
    failures: list[BaseException] = []

    def cycles() -> None:
        try:
            while submitting.is_set():
                loop.run_cycle()
        except BaseException as error:  # reported below
            failures.append(error)

    def client(k: int) -> None:
        for i in range(20):
            if i % 4 == 0:
                store.submit_all([spec(f"b{k}-{i}-{j}") for j in range(5)])
            else:
                store.submit(spec(f"w{k}-{i}"))

    cycling = threading.Thread(target=cycles)
    cycling.start()
    clients = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(120)
    submitting.clear()
    cycling.join(60)
    assert failures == []
    loop.run_cycle()
    assert loop.full_snapshots == 1  # the first cycle's: every other kept its snapshot
    statuses = Counter(record.status for record in store.list_workloads())
    assert statuses == {"running": 8 * (15 + 5 * 5)}
    assert store.integrity_problems() == []


# -- the snapshot the scheduler keeps ------------------------------------------------------


def test_the_kept_snapshot_follows_the_store(store: Store) -> None:
    prepared(store)
    loop = SchedulerLoop(store)
    loop.verify = True
    for i in range(3):
        store.submit(spec(f"w{i}"))
    assert set(loop.run_cycle().bindings) == {"w0", "w1", "w2"}
    assert loop.full_snapshots == 1
    # New submissions only: the kept snapshot and the new rows, checked against a full read.
    for i in range(3, 6):
        store.submit(spec(f"w{i}", gpu=2.0))
    assert set(loop.run_cycle().bindings) == {"w3", "w4"}
    assert loop.last is not None and "w5" in loop.last.pending
    assert loop.full_snapshots == 1
    loop.run_cycle()
    assert loop.full_snapshots == 1
    # Any other change reads the whole store again.
    store.delete_workload("w3", "alice")
    assert set(loop.run_cycle().bindings) == {"w5"}
    assert loop.full_snapshots == 2
    store.submit(spec("w6"))
    loop.run_cycle()
    assert loop.full_snapshots == 2
    running = {r.name for r in store.list_workloads(status="running")}
    assert running == {"w0", "w1", "w2", "w4", "w5", "w6"}


def test_a_cycle_that_binds_new_work_reads_only_what_it_lacks(store: Store) -> None:
    # What a cycle runs under a stream of submissions, statement by statement: the new
    # workloads and their task groups (no placements: new work is pending), and for the
    # bound ones what it writes with and the node ids; not the bound workloads or their
    # nodes again for their allocation intervals. The write lock's own statements on
    # PostgreSQL are left out.
    loop = SchedulerLoop(prepared(store))
    loop.verify = False  # the check of every kept snapshot against a full read
    loop.run_cycle()
    store.submit(spec("first"))
    loop.run_cycle()
    seen: list[str] = []

    def statement(_c: Any, _cursor: Any, text: str, *_rest: Any) -> None:
        words = text.split()
        if "pg_advisory" not in text:
            if "FROM" in words:
                table = words[words.index("FROM") + 1]
            else:  # UPDATE table, INSERT INTO table
                table = words[1] if words[0] == "UPDATE" else words[2]
            seen.append(f"{words[0]} {table}")

    store.submit(spec("second"))
    event.listen(store.engine, "before_cursor_execute", statement)
    try:
        loop.run_cycle()
    finally:
        event.remove(store.engine, "before_cursor_execute", statement)
    assert store.get_workload("second").status == "running"
    assert seen == [
        "SELECT workloads",  # held work waiting for dependencies: none
        "SELECT changes",  # the generation
        "SELECT workloads",  # the new workloads
        "SELECT task_groups",
        "SELECT changes",  # the generation again, under the write lock
        "SELECT workloads",  # what the bindings are written with
        "SELECT nodes",  # node ids by name
        "INSERT placements",
        "SELECT queues",  # the project's departments, for the allocation interval
        "INSERT allocations",
        "UPDATE workloads",
        "INSERT events",
        "INSERT changes",
    ]
    [interval] = [a for a in open_allocations(store) if a.workload == "second"]
    assert (interval.project, interval.user, interval.node) == ("team", "alice", "n0")


@pytest.fixture
def postgresql_store(postgres: Callable[[], str]) -> Iterator[Store]:
    url = postgres()
    opened = Store("postgresql+psycopg://" + url.split("://", 1)[1])
    yield opened
    opened.close()


def test_on_postgresql_the_statements_do_not_grow_with_the_work(postgresql_store: Store) -> None:
    # A batch's submission and the cycle that binds it, for three workloads and for more
    # than one IN list took (bulk.CHUNK): the same statements, word for word. Names and
    # ids go as one array parameter, not a placeholder each, and new rows take their ids
    # from the sequence, not from a search by name after they are written.
    store = postgresql_store
    store.create_queue(Queue("team", deserved=Resources(gpu=1280)))
    for index in range(20):
        store.register_node(node(f"n{index}", gpus=64))
    loop = SchedulerLoop(store)
    loop.verify = False  # the check of every kept snapshot against a full read
    loop.run_cycle()

    def statements(count: int, prefix: str) -> list[str]:
        seen: list[str] = []

        def statement(_c: Any, _cursor: Any, text: str, *_rest: Any) -> None:
            # Not the write lock's, nor the planner statistics' refresh on its thread.
            if not any(word in text for word in ("pg_advisory", "ANALYZE", "reltuples")):
                seen.append(" ".join(text.split()))

        event.listen(store.engine, "before_cursor_execute", statement)
        try:
            records = store.submit_all([spec(f"{prefix}-{i}") for i in range(count)])
            loop.run_cycle()
        finally:
            event.remove(store.engine, "before_cursor_execute", statement)
        assert [r.spec.name for r in records] == [f"{prefix}-{i}" for i in range(count)]
        assert [r.id for r in records] == sorted({r.id for r in records})
        for record in (records[0], records[-1]):
            stored = store.get_workload(record.spec.name)
            assert (stored.id, stored.status) == (record.id, "running")
            assert stored.spec.task_groups == record.spec.task_groups
        return seen

    few = statements(3, "few")
    many = statements(1200, "many")
    assert any("= ANY" in text for text in many)
    assert many == few
    assert store.counts().workloads["running"] == 1203


def test_a_change_the_generation_missed_fails_the_check(store: Store) -> None:
    """The check is what guards the kept snapshot: a write that changes what the engine
    reads but does not move the generation (a bug) must be caught, not scheduled on."""
    prepared(store)
    loop = SchedulerLoop(store)
    loop.verify = True
    store.submit(spec("w0"))
    loop.run_cycle()
    with store.write(relevant=False) as session:
        for row in session.query(NodeRow).all():
            row.schedulable = False
    with pytest.raises(AssertionError, match="nodes or queues differ"):
        loop.run_cycle()


def test_a_write_that_holds_the_lock_is_no_false_alarm(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write moves the generation in its own transaction, under the write lock. A cycle
    that checks its kept snapshot while such a write is under way (the chaos test caught
    one when the two were apart: a task end committed, not yet counted) waits for it and
    must not take its change for one the generation missed."""
    prepared(store)
    loop = SchedulerLoop(store)
    loop.verify = True
    store.submit(spec("w0"))
    store.submit(spec("w1"))
    loop.run_cycle()
    counted, resume = threading.Event(), threading.Event()
    bump = store.bump

    def bump_then_wait(session: Any, touched: Any = None) -> int:
        generation = bump(session, touched)
        if threading.current_thread() is not threading.main_thread():
            counted.set()
            resume.wait(10)
        return generation

    monkeypatch.setattr(store, "bump", bump_then_wait)
    ending = threading.Thread(target=store.task_ended, args=("w0", 0, 0, "done"))
    ending.start()
    assert counted.wait(10)
    # The end is written and counted, not committed: the writer holds the lock, so the
    # cycle waits for it (the timer lets it go on).
    timer = threading.Timer(0.3, resume.set)
    timer.start()
    try:
        decisions = loop.run_cycle()
    finally:
        resume.set()
        timer.cancel()
        ending.join(10)
    assert decisions.bindings == {}
    assert {r.name for r in store.list_workloads(status="running")} == {"w1"}
    assert store.get_workload("w0").status == "succeeded"


def test_the_kept_snapshot_is_read_again_after_a_while(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared(store)
    loop = SchedulerLoop(store)
    store.submit(spec("w0"))
    loop.run_cycle()
    loop.run_cycle()
    assert loop.full_snapshots == 1
    monkeypatch.setattr("corral.control.scheduler.FULL_SNAPSHOT_SECONDS", 0.0)
    loop.run_cycle()
    assert loop.full_snapshots == 2


# -- tokens, counts, names -----------------------------------------------------------------


def test_a_remembered_token_follows_changes_to_its_user(store: Store) -> None:
    store.create_queue(Queue("team"))
    user, token = store.create_user("bob", "member", "team")
    cache = tokens_cache.of(store)
    assert cache.remembered(token) is None
    found = cache.authenticate(token)
    assert found is not None and found.project == "team"
    assert cache.remembered(token) == found == cache.authenticate(token)
    store.delete_queue("team")
    assert cache.remembered(token) is None
    after = cache.authenticate(token)
    assert after is not None and after.project is None
    assert cache.authenticate(token + "x") is None
    # A revoked token is refused at once.
    store.revoke_token(store.list_tokens(user.name)[0].id)
    assert cache.remembered(token) is None
    assert cache.authenticate(token) is None


def test_a_lookup_under_way_during_a_change_is_not_trusted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user looked up before a change to accounts committed, and remembered after it,
    is not trusted: the change might have been its token's revocation."""
    user, token = store.create_user("bob", "viewer", None)
    cache = tokens_cache.of(store)
    token_user = store.token_user

    def then_revoked(looked_up: str) -> Any:
        found = token_user(looked_up)
        store.revoke_token(store.list_tokens(user.name)[0].id)
        return found

    monkeypatch.setattr(store, "token_user", then_revoked)
    assert cache.authenticate(token) is not None  # as it was when looked up
    monkeypatch.undo()
    assert cache.remembered(token) is None
    assert cache.authenticate(token) is None


def in_transaction(session: Session) -> bool:
    """Whether the database connection of `session` is inside a transaction now."""
    driver = session.connection().connection.driver_connection
    if isinstance(driver, sqlite3.Connection):
        return driver.in_transaction
    assert isinstance(driver, psycopg.Connection)
    return driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def test_reads_take_no_transaction(store: Store) -> None:
    """A read's statements each see what was committed when they began, as they would
    within a transaction of PostgreSQL's default isolation, but without one: on
    PostgreSQL its BEGIN and ROLLBACK were two round trips more for every read (SQLite's
    driver begins none for a read). A write is one transaction."""
    prepared(store, nodes=1)
    with store.read() as session:
        assert session.scalars(select(NodeRow.name)).all() == ["n0"]
        assert not in_transaction(session)
        if not store.sqlite:
            # now() is when the transaction began: when the statement began, outside one.
            time.sleep(0.01)
            assert session.execute(text("SELECT now() = statement_timestamp()")).scalar()
    with store.write(relevant=False) as session:
        session.execute(update(NodeRow).where(NodeRow.name == "n0").values(name="n0"))
        assert in_transaction(session)


def test_counts_agree_with_the_records(store: Store) -> None:
    prepared(store, nodes=3)
    store.set_schedulable("n2", False)
    loop = SchedulerLoop(store)
    for i in range(5):
        store.submit(spec(f"w{i}", gpu=0.5 if i % 2 else 3.0))
    loop.run_cycle()
    store.suspend("w4", "alice")
    counts = store.counts()
    nodes = store.list_nodes()
    workloads = store.list_workloads()
    assert counts.nodes == len(nodes) == 3
    assert counts.gpus == sum(n.node.gpus for n in nodes) == 12
    assert counts.virtual_gpus == 12
    assert counts.nodes_ready == 3
    assert counts.gpus_allocated == pytest.approx(sum(t.gpu for n in nodes for t in n.tasks))
    assert counts.gpus_allocated > 0
    assert counts.workloads == {
        status: sum(1 for w in workloads if w.status == status)
        for status in ("pending", "running", "suspended", "succeeded", "failed", "cancelled")
    }
    assert counts.workloads["suspended"] == 1
    assert counts.queues == 1


def test_a_server_made_name_that_clashes_is_drawn_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared(store)
    token = store.ensure_admin()
    draws = iter(["aaaaaa", "aaaaaa", "bbbbbb", *["cccccc"] * 10])
    monkeypatch.setattr(submitting.secrets, "token_hex", lambda _n: next(draws))
    app = create_app(store, run_scheduler=False)
    body = {"project": "team", "tasks": [{"gpu": 1}], "command": ["true"]}
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        first = client.post("/api/v1/workloads", json=body)
        second = client.post("/api/v1/workloads", json=body)
        assert (first.status_code, second.status_code) == (201, 201)
        assert first.json()["name"] == "team-aaaaaa"
        assert second.json()["name"] == "team-bbbbbb"
        # Every draw clashes: after NAME_ATTEMPTS draws the clash is reported.
        client.post("/api/v1/workloads", json=body)
        last = client.post("/api/v1/workloads", json=body)
        assert last.status_code == 409, last.text
        assert "team-cccccc" in last.json()["detail"]


def test_a_batch_draws_its_names_again_but_never_a_name_the_client_chose(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared(store)
    token = store.ensure_admin()
    draws = iter(["aaaaaa", "aaaaaa", "bbbbbb", "cccccc", "dddddd"])
    monkeypatch.setattr(submitting.secrets, "token_hex", lambda _n: next(draws))
    app = create_app(store, run_scheduler=False)
    item = {"project": "team", "tasks": [{"gpu": 1}], "command": ["true"]}
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.post("/api/v1/workloads", json=item).json()["name"] == "team-aaaaaa"
        # The drawn name clashes with the first workload's: drawn again, the chosen kept.
        both = {"workloads": [item, {**item, "name": "mine"}]}
        answer = client.post("/api/v1/workloads/batch", json=both)
        assert answer.status_code == 201, answer.text
        assert [w["name"] for w in answer.json()] == ["team-bbbbbb", "mine"]
        # A chosen name that clashes is final: no draw is spent on it, nothing is stored.
        again = client.post("/api/v1/workloads/batch", json=both)
        assert again.status_code == 409, again.text
        assert "'mine'" in again.json()["detail"]
        assert next(draws) == "dddddd"
        assert len(client.get("/api/v1/workloads").json()) == 3
