"""GPU-hours on a timeline built by hand: allocation intervals and samples at set times,
figures worked out in the comments. On SQLite and PostgreSQL.

The timeline, from T (an hour boundary), with now = T + 3 h:

- train-a (vision, alice, research): 2 whole GPUs from T to T + 2 h; 50% busy the first
  hour, 0% the second. Allocated 4, used 2 * 0.5 * 1 = 1, idle 2 * 1 = 2 GPU-hours.
- nb-b (nlp, bob, research): half a GPU from T + 30 m, still held; 100% for an hour, then
  0% for 90 minutes. Allocated 0.5 * 2.5 = 1.25, used 0.5 * 1 = 0.5, idle 0.5 * 1.5 = 0.75.
- job-c (infra, alice, ops): 1 GPU from T - 1 h to T + 1 h, 25% throughout. From T:
  allocated 1, used 0.25, idle 0.
"""

from __future__ import annotations

import pytest
from vis_timeline import HOUR, MINUTE, T, every_minute

from corral.store import Store
from corral.store.telemetry import record_samples, rollup, watermarks
from corral.store.usage import Allocation, UsageRow, record_allocation, series, usage

NOW = T + 3 * HOUR
DAY = 24 * HOUR


def build(store: Store) -> None:
    record_allocation(
        store,
        Allocation(
            "train-a", 0, "vision", ("research",), "alice", 50, "n1", (0, 1), 2.0, T, T + 2 * HOUR
        ),
    )
    record_allocation(
        store,
        Allocation(
            "nb-b", 0, "nlp", ("research",), "bob", 100, "n1", (2,), 0.5, T + 30 * MINUTE, None
        ),
    )
    record_allocation(
        store,
        Allocation("job-c", 0, "infra", ("ops",), "alice", 50, "n2", (0,), 1.0, T - HOUR, T + HOUR),
    )
    samples = []
    for device in (0, 1):
        samples += every_minute(T, 60, 50, workload="train-a", device=device)
        samples += every_minute(T + HOUR, 60, 0, workload="train-a", device=device)
    samples += every_minute(T + 30 * MINUTE, 60, 100, workload="nb-b", device=2, share=0.5)
    samples += every_minute(T + 90 * MINUTE, 90, 0, workload="nb-b", device=2, share=0.5)
    samples += every_minute(T - HOUR, 120, 25, workload="job-c", node="n2")
    # A free device: it counts for nobody.
    samples += every_minute(T, 180, 0, workload=None, device=3, source="none")
    record_samples(store, samples)


def table(rows: list[UsageRow]) -> dict[str, tuple[float, float, float]]:
    return {
        row.key: (
            pytest.approx(row.gpu_hours_allocated, abs=1e-6),
            pytest.approx(row.gpu_hours_used, abs=1e-6),
            pytest.approx(row.gpu_hours_idle, abs=1e-6),
        )
        for row in rows
    }


def catch_up(store: Store, now: float) -> None:
    while True:
        rollup(store, now)
        with store.read() as session:
            if watermarks(session).raw_rolled_until >= now - 2 * MINUTE:
                return


@pytest.mark.parametrize("rolled_up", [False, True], ids=["raw", "minutes"])
def test_gpu_hours_by_project_department_user_and_workload(store: Store, rolled_up: bool) -> None:
    build(store)
    if rolled_up:
        catch_up(store, NOW + 2 * MINUTE)
    since, until = T, NOW
    assert table(usage(store, since, until, "project", now=NOW)) == {
        "vision": (4.0, 1.0, 2.0),
        "nlp": (1.25, 0.5, 0.75),
        "infra": (1.0, 0.25, 0.0),
    }
    assert table(usage(store, since, until, "department", now=NOW)) == {
        "research": (5.25, 1.5, 2.75),
        "ops": (1.0, 0.25, 0.0),
    }
    assert table(usage(store, since, until, "user", now=NOW)) == {
        "alice": (5.0, 1.25, 2.0),
        "bob": (1.25, 0.5, 0.75),
    }
    rows = usage(store, since, until, "workload", now=NOW)
    assert [row.key for row in rows] == ["train-a", "nb-b", "job-c"]  # largest first
    assert table(rows)["nb-b"] == (1.25, 0.5, 0.75)


@pytest.mark.parametrize("rolled_up", [False, True], ids=["raw", "minutes"])
def test_a_period_clips_intervals_and_rollups(store: Store, rolled_up: bool) -> None:
    build(store)
    if rolled_up:
        catch_up(store, NOW + 2 * MINUTE)
    # The second hour: train-a holds 2 GPUs at 0%; nb-b holds half a GPU, at 100% until
    # T + 90 m and 0% after: used 0.5 * 0.5 = 0.25, idle 0.25; job-c ended at T + 1 h.
    assert table(usage(store, T + HOUR, T + 2 * HOUR, "workload", now=NOW)) == {
        "train-a": (2.0, 0.0, 2.0),
        "nb-b": (0.5, 0.25, 0.25),
    }
    # From T + 30 s the first minute counts for half: train-a loses 2 GPUs * 30 s of
    # allocation and 2 * 0.5 * 30 s of use.
    found = table(usage(store, T + 30, NOW, "workload", now=NOW))
    assert found["train-a"] == (4.0 - 60 / 3600, 1.0 - 30 / 3600, 2.0)


def test_past_30_days_hourly_rollups_keep_the_gpu_hours(store: Store) -> None:
    build(store)
    catch_up(store, T + 31 * DAY)
    # The minutes are gone; hours keep used GPU-hours exactly. Idle counts whole hours at
    # 0%: nb-b's third hour (0.5 GPU * 1 h), not the idle half of its second one.
    assert table(usage(store, T, NOW, "project", now=NOW)) == {
        "vision": (4.0, 1.0, 2.0),
        "nlp": (1.25, 0.5, 0.5),
        "infra": (1.0, 0.25, 0.0),
    }


def test_series_average_gpus_per_step(store: Store) -> None:
    build(store)
    catch_up(store, NOW + 2 * MINUTE)
    points = series(store, T, NOW, HOUR, now=NOW)[None]
    # Hour 1: train-a 2 + nb-b 0.5 for half the hour + job-c 1 = 3.25 allocated; used
    # 2 * 0.5 + 0.5 * 1 * 0.5 + 0.25 = 1.5. Hour 2: 2.5 allocated, 0.25 used (nb-b's half
    # hour at 100%). Hour 3: nb-b's half GPU at 0%.
    assert [(p.time, p.allocated, p.used) for p in points] == [
        (T, 3.25, 1.5),
        (T + HOUR, 2.5, 0.25),
        (T + 2 * HOUR, 0.5, 0.0),
    ]
    by_department = series(store, T, NOW, HOUR, by="department", now=NOW)
    assert [(p.allocated, p.used) for p in by_department["research"]] == [
        (2.25, 1.25),
        (2.5, 0.25),
        (0.5, 0.0),
    ]
    assert [(p.allocated, p.used) for p in by_department["ops"]] == [
        (1.0, 0.25),
        (0.0, 0.0),
        (0.0, 0.0),
    ]


def test_fine_series_spread_each_sample_over_the_steps_it_stands_for(store: Store) -> None:
    build(store)
    # Steps of 30 s read raw samples: each sample stands for a minute and is spread over
    # two steps. train-a's 2 GPUs at 50% and job-c's 1 GPU at 25% in every step.
    points = series(store, T, T + 10 * MINUTE, 30, now=NOW)[None]
    assert len(points) == 20
    assert {(p.allocated, p.used) for p in points} == {(3.0, 1.25)}


def held_past_their_intervals(store: Store) -> None:
    """Tasks whose samples reach past what they were allocated.

    - grace (1 GPU on n3): allocated from T + 30 s to T + 10 m 20 s (590 s); sampled every
      minute from T to T + 12 m at 0%, as a task started before its bind was written and
      checkpointing for two minutes after its release would be. Idle 590 s, not 720.
    - moved (task 0, 1 GPU): on n1 from T to T + 5 m, then on n2 from T + 6 m to T + 10 m;
      n1 kept sampling it at 100% until T + 7 m, and n2 from T + 6 m on. Used 5 m on n1
      and 4 m on n2: 540 s, not 660 (n1's last two minutes are within n2's interval, but
      not its node's).
    """
    for name, node, start, end in (
        ("grace", "n3", T + 30, T + 10 * MINUTE + 20),
        ("moved", "n1", T, T + 5 * MINUTE),
        ("moved", "n2", T + 6 * MINUTE, T + 10 * MINUTE),
    ):
        record_allocation(
            store, Allocation(name, 0, "vision", (), "alice", 50, node, (0,), 1.0, start, end)
        )
    samples = every_minute(T, 12, 0, workload="grace", node="n3")
    samples += every_minute(T, 7, 100, workload="moved", node="n1")
    samples += every_minute(T + 6 * MINUTE, 4, 100, workload="moved", node="n2")
    record_samples(store, samples)


@pytest.mark.parametrize("rolled_up", ["raw", "minutes", "hours"])
def test_only_the_time_a_task_held_its_devices_counts(store: Store, rolled_up: str) -> None:
    held_past_their_intervals(store)
    if rolled_up == "minutes":
        catch_up(store, T + HOUR)
    elif rolled_up == "hours":
        catch_up(store, T + 31 * DAY)
    assert table(usage(store, T, T + HOUR, "workload", now=NOW)) == {
        "grace": (590 / 3600, 0.0, 590 / 3600),
        "moved": (540 / 3600, 540 / 3600, 0.0),
    }
    if rolled_up == "raw":
        # A period that cuts the intervals clips the samples with them.
        assert table(usage(store, T + 2 * MINUTE, T + 10 * MINUTE + 10, "workload", now=NOW)) == {
            "grace": (490 / 3600, 0.0, 490 / 3600),
            "moved": (420 / 3600, 420 / 3600, 0.0),
        }


def test_series_count_only_the_time_held(store: Store) -> None:
    held_past_their_intervals(store)
    # In steps of 2 minutes: moved holds 1 GPU but in [T + 5 m, T + 6 m), at 100% while
    # held, which is what its samples say; grace's GPU is allocated and unused.
    points = series(store, T, T + 12 * MINUTE, 2 * MINUTE, by="workload", now=NOW)
    assert [(p.allocated, p.used) for p in points["moved"]] == [
        (1.0, 1.0),
        (1.0, 1.0),
        (0.5, 0.5),
        (1.0, 1.0),
        (1.0, 1.0),
        (0.0, 0.0),
    ]
    assert [p.used for p in points["grace"]] == [0.0] * 6
