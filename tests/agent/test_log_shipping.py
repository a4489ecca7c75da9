"""What a node's agent sends the server, sent at least once and stored exactly once: task
logs (corral.cluster.log_shipping), with answers lost, servers killed in the middle of a
write and agents restarted, in any order, and the server's copy is the node's log byte
for byte; and the reports of an answer the server did not acknowledge, sent again. Real
files and a real agent; the transport between the two is the test's own loop."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from livecorral import wait_until

from corral.cluster.log_shipping import Inbox, Outbox
from corral.cluster.ray_agent import NodeAgent
from corral.messages import AgentSettings, TaskLaunch


def outbox(root: Path) -> Outbox:
    return Outbox(root / "node" / "offsets.json", lambda w, t: root / "node" / f"{w}-{t}.log")


def write(root: Path, text: bytes, workload: str = "job", task: int = 0) -> None:
    with open(root / "node" / f"{workload}-{task}.log", "ab") as handle:
        handle.write(text)


def ship(sender: Outbox, receiver: Inbox, node: str = "a") -> dict[tuple[str, int], int]:
    """One answer, stored; the receipt the server would send back."""
    return {
        (w, t): receiver.take(node, w, t, offset, data) for w, t, offset, data in sender.chunks()
    }


def test_a_chunk_sent_again_is_stored_once(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    sender, receiver = outbox(tmp_path), Inbox(tmp_path / "server")
    sender.watch(("job", 0))
    write(tmp_path, b"one\n")
    ship(sender, receiver)  # its receipt is lost
    write(tmp_path, b"two\n")
    receipt = ship(sender, receiver)  # "one" again, with "two"
    assert receipt == {("job", 0): 8}
    sender.acknowledge(receipt)
    assert sender.chunks() == []
    assert receiver.path("job", 0).read_bytes() == b"one\ntwo\n"


def test_a_write_the_server_did_not_record_is_cut_and_comes_again(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    sender, receiver = outbox(tmp_path), Inbox(tmp_path / "server")
    sender.watch(("job", 0))
    write(tmp_path, b"line 1\n")
    sender.acknowledge(ship(sender, receiver))
    write(tmp_path, b"line 2\n")
    # Killed after writing the bytes and before recording them in the index.
    with open(receiver.path("job", 0), "ab") as log:
        log.write(b"line 2\n")
    with open(receiver.path("job", 0).with_suffix(".log.idx"), "a") as index:
        index.write("a 14 1")  # and in the middle of the index's line
    restarted = Inbox(tmp_path / "server")
    sender.acknowledge(ship(sender, restarted))
    assert restarted.path("job", 0).read_bytes() == b"line 1\nline 2\n"
    assert sender.chunks() == []


def test_the_agent_goes_on_where_the_server_stands_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    sender, receiver = outbox(tmp_path), Inbox(tmp_path / "server")
    sender.watch(("job", 0))
    write(tmp_path, b"a" * 10)
    sender.acknowledge(ship(sender, receiver))
    write(tmp_path, b"b" * 10)
    ship(sender, receiver)  # stored, but the agent dies before the receipt
    again = outbox(tmp_path)  # restarted by Ray: its offsets were kept on disk
    again.watch(("job", 0))  # the task is adopted
    assert [c[2] for c in again.chunks()] == [10]
    again.acknowledge(ship(again, receiver))
    assert receiver.path("job", 0).read_bytes() == b"a" * 10 + b"b" * 10


def test_a_new_attempt_on_the_node_ships_from_the_end_of_what_was_shipped(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    sender, receiver = outbox(tmp_path), Inbox(tmp_path / "server")
    sender.watch(("job", 0))
    write(tmp_path, b"first attempt\n")
    sender.finish(("job", 0))
    sender.acknowledge(ship(sender, receiver))
    assert sender.chunks() == [] and sender.offsets == {}, "forgotten once shipped to its end"
    sender.watch(("job", 0))
    write(tmp_path, b"second attempt\n")
    sender.acknowledge(ship(sender, receiver))
    assert receiver.path("job", 0).read_bytes() == b"first attempt\nsecond attempt\n"


def test_two_nodes_append_to_one_log_each_once(tmp_path: Path) -> None:
    # A task moved from node a to node b: both ship to the same server log.
    (tmp_path / "node").mkdir()
    receiver = Inbox(tmp_path / "server")
    assert receiver.take("a", "job", 0, 0, b"from a\n") == 7
    assert receiver.take("b", "job", 0, 0, b"from b\n") == 7
    assert receiver.take("a", "job", 0, 0, b"from a\nmore a\n") == 14
    assert receiver.take("b", "job", 0, 0, b"from b\n") == 7
    again = Inbox(tmp_path / "server")
    assert again.take("a", "job", 0, 7, b"more a\n") == 14
    assert again.path("job", 0).read_bytes() == b"from a\nfrom b\nmore a\n"


def test_a_deleted_workloads_log_is_forgotten_and_a_later_one_of_its_name_starts_empty(
    tmp_path: Path,
) -> None:
    (tmp_path / "node").mkdir()
    sender, receiver = outbox(tmp_path), Inbox(tmp_path / "server")
    sender.watch(("job.1", 0))
    write(tmp_path, b"secret of job 1\n", "job.1")
    sender.acknowledge(ship(sender, receiver))
    write(tmp_path, b"its last words\n", "job.1")
    late = sender.chunks()  # on its way when the workload is deleted
    receiver.forget("job.1")
    sender.forget("job.1")
    assert not (tmp_path / "server" / "job.1").exists()
    assert sender.chunks() == [] and sender.offsets == {}
    # What was on its way is dropped, and said stored, so that it is not sent again.
    [(directory, task, offset, data)] = late
    assert receiver.take("a", directory, task, offset, data) == offset + len(data)
    assert not (tmp_path / "server" / "job.1").exists()
    sender.watch(("job.2", 0))
    write(tmp_path, b"job 2\n", "job.2")
    sender.acknowledge(ship(sender, receiver))
    assert receiver.path("job.2", 0).read_bytes() == b"job 2\n"


def test_a_chunk_that_names_no_workload_directory_is_refused(tmp_path: Path) -> None:
    receiver = Inbox(tmp_path / "server")
    for bad in ("../escape", "job/../../x", ".job", "Job", "job.1.2", ""):
        with pytest.raises(ValueError, match="is not the name of a workload's directories"):
            receiver.take("a", bad, 0, 0, b"x")
    assert not (tmp_path / "server").exists() or not any((tmp_path / "server").iterdir())


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.binary(min_size=1, max_size=300)),
        st.tuples(st.sampled_from(["ship", "lose", "kill-server", "restart-agent", "ack-late"])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_whatever_is_lost_or_killed_the_server_stores_each_byte_once(
    steps: list[tuple[object, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        replay(Path(folder), steps)


def replay(root: Path, steps: list[tuple[object, ...]]) -> None:
    (root / "node").mkdir()
    sender, receiver = outbox(root), Inbox(root / "server")
    sender.watch(("job", 0))
    written = b""
    late: dict[tuple[str, int], int] = {}
    for step in steps:
        kind = step[0]
        if kind == "write":
            data = step[1]
            assert isinstance(data, bytes)
            write(root, data)
            written += data
        elif kind == "ship":
            sender.acknowledge(ship(sender, receiver))
        elif kind == "lose":
            ship(sender, receiver)  # stored, receipt lost
        elif kind == "ack-late":
            # A receipt that arrives after newer ones: never moves an offset back.
            sender.acknowledge(late)
            late = ship(sender, receiver)
        elif kind == "kill-server":
            receiver = Inbox(root / "server")
        else:
            sender = outbox(root)
            sender.watch(("job", 0))
    for _ in range(200):
        receipt = ship(sender, receiver)
        if not receipt:
            break
        sender.acknowledge(receipt)
    stored = receiver.path("job", 0)
    assert (stored.read_bytes() if stored.exists() else b"") == written


def test_an_answer_the_server_did_not_acknowledge_is_sent_again(tmp_path: Path) -> None:
    # A real NodeAgent (without Ray) runs a task that prints and ends; its drains carry
    # the server's settings as a server of this corral sends them.
    body = NodeAgent("n1", str(tmp_path / "agents"), AgentSettings(60.0), 1, str(tmp_path / "w"))
    try:
        user = "root" if os.geteuid() == 0 else None
        body.start(
            [TaskLaunch("job", "p", 0, 1, "n1", (0,), 1.0, ("echo", "hello"), unix_user=user)]
        )
        settings = AgentSettings(60.0)

        def ended() -> dict[str, Any] | None:
            answer = body.drain(0.2, settings)
            return answer if any(r[0] == "ended" for r in answer["reports"]) else None

        first = wait_until(ended, 30, "the task's end")
        instance, number = first["answer"]
        assert first["logs"] == [("job", 0, 0, b"hello\n")]
        # The server was killed with that answer in hand: a new one sends no receipt.
        again = body.drain(0.0, settings, None)
        assert [r[0] for r in again["reports"]] == [r[0] for r in first["reports"]]
        assert again["logs"] == first["logs"]
        # Acknowledged (reports and the log up to its end): nothing more is sent.
        stored = {"instance": instance, "answer": again["answer"][1], "logs": {("job", 0): 6}}
        quiet = body.drain(0.0, settings, stored)
        assert quiet["reports"] == [] and quiet["logs"] == []
        # A receipt of another agent's instance acknowledges no report of this one's.
        body.buffer.task_ports("n1", "job", 0, {"http": 1})
        told = body.drain(0.0, settings, {"instance": "other", "answer": 10**6})
        assert (
            body.drain(0.0, settings, {"instance": "other", "answer": 10**6})["reports"]
            == (told["reports"])
        )
        # An older server (no settings) gets each report once.
        body.buffer.task_ports("n1", "job", 0, {"http": 2})
        body.drain(0.0, None)
        assert body.drain(0.0, None)["reports"] == []
        assert number < again["answer"][1]
    finally:
        body.close()
