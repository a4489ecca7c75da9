"""A workload's answer is made once, as plain data (`workload_fields`), and the busy
handlers send it as JSON without the model. It must be exactly what the model would
send: every field, in its order, with its types (a float field as a float)."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.api.outputs import json_answer, workload_fields, workload_out
from corral.api.schemas.workloads import WorkloadOut
from corral.model import Placement, TaskGroup, Topology
from corral.model.arrays import ArrayMember, Dependency
from corral.model.spec import PortSpec, WorkloadSpec
from corral.store import STATUSES, WorkloadRecord
from corral.store.records import LostWork

names = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12)
texts = st.text(max_size=12)
# Whole numbers where the record holds a float: the answer must still write 1.0, not 1.
amounts = st.one_of(st.integers(0, 64), st.floats(0, 1e6, allow_nan=False, allow_infinity=False))
times = st.one_of(st.integers(0, 2**31), st.floats(0, 4e9, allow_nan=False))
maybe_times = st.none() | times

groups = st.builds(
    TaskGroup,
    name=names,
    replicas=st.integers(0, 1000),
    gpu=amounts,
    gpu_memory=st.integers(0, 2**40),
    cpu=amounts,
    memory=st.integers(0, 2**42),
)
specs = st.builds(
    WorkloadSpec,
    name=names,
    project=names,
    user=names,
    task_groups=st.lists(groups, min_size=1, max_size=3).map(tuple),
    priority=st.integers(0, 1000),
    preemptible=st.booleans(),
    min_available=st.none() | st.integers(1, 100),
    node_selector=st.dictionaries(names, st.lists(texts, max_size=3).map(tuple), max_size=2),
    topology=st.none() | st.builds(Topology, names, st.booleans()),
    node_pools=st.lists(names, max_size=2).map(tuple),
    command=st.lists(texts, max_size=3).map(tuple),
    env=st.dictionaries(names, texts, max_size=3),
    secrets=st.dictionaries(names, names, max_size=2),
    workdir=st.none() | texts,
    max_runtime=st.none() | amounts,
    backoff_limit=st.integers(0, 10),
    grace_period=amounts,
    after=st.lists(st.builds(Dependency, names, st.sampled_from(["ok", "any"])), max_size=2).map(
        tuple
    ),
    kill_on_invalid_dep=st.booleans(),
    array=st.none()
    | st.builds(ArrayMember, names, st.integers(0, 99), st.none() | st.integers(1, 9)),
    ports=st.lists(st.builds(PortSpec, names, st.booleans()), max_size=2).map(tuple),
)
placements = st.builds(
    Placement,
    task=st.integers(0, 100),
    node=names,
    devices=st.lists(st.integers(0, 7), max_size=8).map(tuple),
    gpu=amounts,
)
records = st.builds(
    WorkloadRecord,
    id=st.integers(1, 10**6),
    spec=specs,
    status=st.sampled_from(STATUSES),
    reason=st.none() | texts,
    attempts=st.integers(0, 10),
    created_at=times,
    started_at=maybe_times,
    finished_at=maybe_times,
    placements=st.lists(placements, max_size=3).map(tuple),
    exit_code=st.none() | st.integers(-255, 255),
    cancelled_by=st.none() | names,
    pending_since=maybe_times,
    checkpoint_at=maybe_times,
    lost_work=st.none() | st.builds(LostWork, times, amounts, times, st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_the_plain_answer_is_the_models_byte_for_byte(record: WorkloadRecord) -> None:
    sent = json_answer(workload_fields(record)).body
    assert sent == workload_out(record).model_dump_json().encode()
    # and it is a valid WorkloadOut as it is, with nothing left out or added
    assert WorkloadOut.model_validate_json(sent).model_dump_json().encode() == sent


def test_a_list_is_sent_as_the_models_would_be() -> None:
    spec = WorkloadSpec("w", "p", "u", (TaskGroup(gpu=1),))
    record = WorkloadRecord(
        1, spec, "running", None, 1, 10, 11, None, (Placement(0, "n", (0,), 1),)
    )
    sent = json_answer([workload_fields(record)] * 2, 201, {"X-Test": "1"})
    assert sent.status_code == 201
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["x-test"] == "1"
    one = workload_out(record).model_dump_json()
    assert sent.body == f"[{one},{one}]".encode()
    assert b'"gpu":1.0' in sent.body and b'"started_at":11.0' in sent.body
