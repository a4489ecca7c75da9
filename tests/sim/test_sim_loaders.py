"""Each trace loader on small slices of the real files, and its errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sim_support import head

from corral.model.resources import MIB
from corral.sim import SimError, load_trace
from corral.sim.loaders import (
    load_gavel,
    load_helios,
    load_openb,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
)
from corral.sim.loaders.gavel import load_throughputs
from corral.sim.loaders.philly import gang_shape
from corral.sim.synthetic import synthetic_trace

# -- Philly (Pollux's job table) ---------------------------------------------------------


def test_philly_slice(traces: Path, tmp_path: Path) -> None:
    source = traces / "pollux-osdi21" / "traces" / "philly.csv"
    trace = load_philly(head(source, tmp_path / "philly.csv", 201))
    assert len(trace.jobs) == 200
    # Submission times count from the earliest row and come out sorted.
    times = [job.submitted for job in trace.jobs]
    assert min(times) == 0.0 and times == sorted(times)
    assert trace.span == max(times)
    # The first data row: 2017-10-09 07:01:55, 66 s, 1 GPU, VC 11cb48.
    first_row = next(job for job in trace.jobs if job.name == "philly-00000")
    assert (first_row.project, first_row.duration, first_row.gpus) == ("11cb48", 66.0, 1.0)
    assert first_row.preemptible and first_row.priority == 50
    assert set(trace.projects) <= {
        "0e4a51",
        "103959",
        "11cb48",
        "23dbec",
        "2869ce",
        "51b7ef",
        "6214e9",
        "6c71a0",
        "795a4c",
        "7f04ca",
        "925e2b",
        "b436b2",
        "e13805",
        "ed69ec",
        "ee9e8c",
    }


def test_gangs_wider_than_a_node_split_into_node_sized_tasks() -> None:
    assert [(g.replicas, g.gpu) for g in gang_shape(4, 8)] == [(1, 4.0)]
    assert [(g.replicas, g.gpu) for g in gang_shape(16, 8)] == [(2, 8.0)]
    assert [(g.replicas, g.gpu) for g in gang_shape(12, 8)] == [(1, 8.0), (1, 4.0)]


def test_philly_absent_column(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,num_gpus,cluster\n2017-10-09 07:01:55,1,a\n")
    with pytest.raises(SimError, match=r"philly.csv: column 'duration' is absent"):
        load_philly(path)


def test_philly_bad_value_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-09 07:01:56,soon,1,66.0,a\n"
    )
    with pytest.raises(SimError, match=r"line 3, column 'duration': 'soon' is not a number"):
        load_philly(path)


# -- Gavel (per-VC Philly-derived traces) -------------------------------------------------


def test_gavel_slice(traces: Path, tmp_path: Path) -> None:
    gavel = traces / "gavel-osdi20"
    vc = head(gavel / "traces" / "msr" / "seed_0" / "6214e9.trace", tmp_path / "6214e9.trace", 20)
    trace = load_gavel(vc, throughputs=gavel / "simulation_throughputs.json")
    assert len(trace.jobs) == 20
    assert trace.projects == ("6214e9",)
    # Line 1: Transformer (batch size 128), 20,851,471 steps, arrival 0, 1 GPU; its
    # duration is the steps over the measured V100 throughput alone.
    table = load_throughputs(gavel / "simulation_throughputs.json", "v100")
    first = next(job for job in trace.jobs if job.name == "6214e9-00001")
    assert first.submitted == 0.0 and first.gpus == 1.0
    assert first.duration == pytest.approx(20_851_471 / table["Transformer (batch size 128)"][1])


def test_gavel_missing_field(traces: Path, tmp_path: Path) -> None:
    path = tmp_path / "vc.trace"
    path.write_text("ResNet-18 (batch size 16)\tcmd\t-n\t1\t1000\t0.0\n")
    with pytest.raises(SimError, match=r"line 1: field 7 \(scale factor\) is absent"):
        load_gavel(path, throughputs=traces / "gavel-osdi20" / "simulation_throughputs.json")


# -- Alibaba 2023 (openb) ----------------------------------------------------------------


def test_openb_nodes_slice(traces: Path, tmp_path: Path) -> None:
    source = traces / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv"
    nodes = load_openb_nodes(head(source, tmp_path / "nodes.csv", 6))
    # openb-node-0000,64000,262144,2,P100
    assert [node.name for node in nodes][:1] == ["openb-node-0000"]
    first = nodes[0]
    assert (first.gpus, first.gpu_model, first.cpu, first.memory) == (2, "P100", 64.0, 262144 * MIB)


def test_openb_pods_fractions_and_gpu_models(traces: Path, tmp_path: Path) -> None:
    source = traces / "alibaba-gpu-v2023" / "openb_pod_list_gpuspec33.csv"
    pods = load_openb_pods(head(source, tmp_path / "pods.csv", 400))
    assert len(pods) == 399
    # openb-pod-0001: 6 cores, 12 GiB, one GPU shared at 460 thousandths.
    second = pods[1]
    assert (second.cpu, second.memory, second.gpus, second.gpu) == (6.0, 12288 * MIB, 1, 0.46)
    assert second.task_group().fractional
    assert any(pod.gpu_models for pod in pods)
    assert all(
        set(pod.gpu_models) <= {"G1", "G2", "G3", "P100", "T4", "V100M16", "V100M32", "A10"}
        for pod in pods
    )


def test_openb_replay_needs_time_columns(traces: Path, tmp_path: Path) -> None:
    folder = traces / "alibaba-gpu-v2023"
    # The multigpu variants only have the first five columns: fine for packing, not replay.
    pods = head(folder / "openb_pod_list_multigpu20.csv", tmp_path / "pods.csv", 30)
    assert len(load_openb_pods(pods)) == 29
    with pytest.raises(SimError, match=r"columns 'creation_time', 'deletion_time', "):
        load_openb(pods, folder / "openb_node_list_gpu_node.csv")


def test_openb_replay_slice(traces: Path, tmp_path: Path) -> None:
    folder = traces / "alibaba-gpu-v2023"
    pods = head(folder / "openb_pod_list_default.csv", tmp_path / "pods.csv", 101)
    trace = load_openb(pods, folder / "openb_node_list_gpu_node.csv")
    assert len(trace.nodes) == 1213 and trace.projects == ("openb",)
    # openb-pod-0000 was created at 0, scheduled at 0 and deleted at 12,537,496.
    first = next(job for job in trace.jobs if job.name == "openb-pod-0000")
    assert (first.submitted, first.duration) == (0.0, 12_537_496.0)
    assert not first.preemptible  # QoS LS: latency-sensitive


# -- Helios --------------------------------------------------------------------------------


def test_helios_layers_reproduce_the_demand(traces: Path, tmp_path: Path) -> None:
    source = traces / "helios-sc21" / "earth_vc_sequences" / "vchbv.csv"
    rows = 1 + 600  # ten hours of minutes
    path = head(source, tmp_path / "vchbv.csv", rows)
    trace = load_helios(path)
    assert trace.quotas == {"vchbv": 64.0}
    assert trace.span == 600 * 60.0
    # Replayed with no limit, the jobs hold exactly the running + pending GPUs of each
    # minute: recount both from the file and from the jobs.
    import csv

    with path.open() as handle:
        demand = [
            float(row["running_gpu_num"]) + float(row["pending_gpu_num"])
            for row in csv.DictReader(handle)
        ]
    for minute in (0, 17, 250, 599):
        now = minute * 60.0 + 30.0
        held = sum(
            job.gpus for job in trace.jobs if job.submitted <= now < job.submitted + job.duration
        )
        assert held == demand[minute]


def test_helios_absent_column(tmp_path: Path) -> None:
    path = tmp_path / "vc.csv"
    path.write_text("time,total_gpu_num,running_gpu_num\n2020-05-01 00:00:00,8,1\n")
    with pytest.raises(SimError, match="'pending_gpu_num', 'running_gpu_num_noless_8', "):
        load_helios(path)


# -- names, paths and the synthetic generator ---------------------------------------------


def test_trace_names_resolve(traces: Path) -> None:
    philly = load_trace("philly", root=traces)
    assert len(philly.jobs) == 82_247 and len(philly.projects) == 15


def test_path_detection(traces: Path, tmp_path: Path) -> None:
    source = traces / "pollux-osdi21" / "traces" / "philly.csv"
    copy = head(source, tmp_path / "jobs.csv", 11)
    assert load_trace(str(copy)).name == "philly"
    unknown = tmp_path / "other.csv"
    unknown.write_text("a,b\n1,2\n")
    with pytest.raises(SimError, match="not a known trace format"):
        load_trace(str(unknown))


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(SimError, match="no such file, and not a trace name"):
        load_trace(str(tmp_path / "nothing.csv"))


def test_synthetic_is_seeded() -> None:
    first, again, other = synthetic_trace(3), synthetic_trace(3), synthetic_trace(4)
    assert first.jobs == again.jobs
    assert first.jobs != other.jobs
    assert first.projects == ("team-a", "team-b", "team-c", "team-d")
    kinds = {job.name.split("-")[2] for job in first.jobs}
    assert kinds == {"interactive", "training", "distributed"}
    interactive = [job for job in first.jobs if "-interactive-" in job.name]
    assert all(not job.preemptible and job.priority == 100 for job in interactive)
    assert all(job.utilisation is not None and 0 < job.utilisation < 1 for job in first.jobs)
    # Over 72 hours the default mix submits a few hundred jobs, every one within the span.
    assert 300 < len(first.jobs) < 600
    assert all(0 <= job.submitted < first.span for job in first.jobs)
    assert not math.isnan(sum(job.duration for job in first.jobs))
