"""Fragmentation-aware placement: the expected-fragmentation measure and the choices it
makes, with numbers worked by hand."""

import pytest

from corral.engine import schedule
from corral.engine.fragmentation import Fragmentation, NodeClasses, shapes_of
from corral.model import (
    Node,
    Placement,
    Queue,
    SchedulerConfig,
    Snapshot,
    TaskGroup,
    Workload,
    gpu_quota,
)

ALLOCATE = SchedulerConfig(actions=("allocate",))


def job(
    name: str,
    gpu: float,
    cpu: float = 0.0,
    at: float = 0.0,
    on: tuple[Placement, ...] = (),
    models: tuple[str, ...] = (),
) -> Workload:
    return Workload(
        name,
        "q",
        (TaskGroup(gpu=gpu, cpu=cpu),),
        submitted=at,
        placements=on,
        node_selector={"gpu_model": models} if models else {},
    )


def placed(nodes: tuple[Node, ...], *workloads: Workload) -> dict[str, tuple[Placement, ...]]:
    queue = Queue("q", deserved=gpu_quota(sum(node.gpus for node in nodes)))
    return dict(schedule(Snapshot(nodes, (queue,), workloads), ALLOCATE).bindings)


def test_cpu_only_task_avoids_a_node_with_free_gpus() -> None:
    # gpu-a has its 2 GPUs free and the least free CPU, which binpack alone would pick;
    # gpu-b's GPUs are all taken, so CPU spent there strands nothing.
    nodes = (Node("gpu-a", gpus=2, cpu=16), Node("gpu-b", gpus=2, cpu=64))
    busy = job("busy", 2, cpu=8, on=(Placement(0, "gpu-b", (0, 1), 2.0),))
    bindings = placed(nodes, busy, job("cpu", 0, cpu=8, at=1))
    assert bindings["cpu"][0].node == "gpu-b"


def test_single_gpu_keeps_a_pair_for_two_gpu_work() -> None:
    # n0 has 2 free GPUs (a 2-GPU job runs there), n1 has 3. Shapes: 2-GPU x1, 1-GPU x2.
    # Taking one of n0's two breaks the only pair there (usable 2.0 -> 0.67, lost 1.33);
    # taking one of n1's three keeps a pair (2.67 -> 2.0, lost 0.67). Binpack by free
    # devices alone would pick n0.
    nodes = (Node("n0", gpus=4), Node("n1", gpus=4))
    pair = job("pair", 2, on=(Placement(0, "n0", (0, 1), 2.0),))
    single = job("single", 1, on=(Placement(0, "n1", (0,), 1.0),))
    bindings = placed(nodes, pair, single, job("new", 1, at=1))
    assert bindings["new"][0].node == "n1"


def test_fraction_goes_where_its_leftover_stays_usable() -> None:
    # Device 0 has 0.35 free, device 1 has 0.6. A 0.3 task on device 0 (the fullest that
    # fits) would leave 0.05 that no shape can use; on device 1 it leaves 0.3, which the
    # 0.2, 0.25 and 0.3 shapes can still use (weights 2, 3, 1 of 7): 0.35 x 6/7 of usable
    # capacity lost against 0.3 x 6/7.
    nodes = (Node("n0", gpus=2),)
    running = (
        job("r0", 0.65, on=(Placement(0, "n0", (0,), 0.65),)),
        job("r1", 0.2, on=(Placement(0, "n0", (1,), 0.2),)),
        job("r2", 0.2, on=(Placement(0, "n0", (1,), 0.2),)),
    )
    later = tuple(job(f"small{i}", 0.25, at=2 + i) for i in range(3))
    bindings = placed(nodes, *running, job("x", 0.3, at=1), *later)
    assert bindings["x"][0].devices == (1,)


def test_fraction_still_prefers_a_shared_device_to_a_free_one() -> None:
    # Pack: a partly used device with room comes before a wholly free one.
    nodes = (Node("n0", gpus=2),)
    running = job("r", 0.5, on=(Placement(0, "n0", (0,), 0.5),))
    bindings = placed(nodes, running, job("x", 0.25, at=1), job("y", 0.25, at=2))
    assert bindings["x"][0].devices == (0,)
    assert bindings["y"][0].devices == (0,)


def test_cpu_hungry_task_goes_where_its_cpu_strands_no_gpu() -> None:
    # Alike but for CPU: n0 has 24 cores for 4 GPUs, n1 64. The shapes ask for 7 cores
    # per GPU on average (1 GPU with 10 CPU x1, 1 GPU with 6 CPU x3). On n0 the 10 cores
    # leave 14 for its 3 free GPUs, enough for 2 at 7 each: 1 GPU stranded, against 0.57
    # before. On n1 the 54 cores left serve all 3. Both nodes stay usable by both shapes
    # (14 cores >= 10), so without the CPU term they tie and n0 wins by name.
    nodes = (Node("n0", gpus=4, cpu=24), Node("n1", gpus=4, cpu=64))
    later = tuple(job(f"y{i}", 1, cpu=6, at=2 + i) for i in range(3))
    bindings = placed(nodes, job("x", 1, cpu=10, at=1), *later)
    assert bindings["x"][0].node == "n1"


def test_stranded_gpus_by_hand() -> None:
    # Shapes: 1 GPU with 10 CPU (x1), 0.5 GPU with 2 CPU (x2), CPU only (x1): weighted,
    # 1/4 x 10 + 2/4 x 2 = 3.5 cores for 1/4 x 1 + 2/4 x 0.5 = 0.5 GPU, 7 per GPU.
    node = Node("n", gpus=4, cpu=32)
    shapes = shapes_of(
        [(job("a", 1, cpu=10), 1), (job("c", 0.5, cpu=2), 2), (job("d", 0, cpu=2), 1)],
        node.gpu_memory,
    )
    model = Fragmentation(NodeClasses([node]), shapes)
    # 2.9 GPUs free; 14 cores serve 2 of them.
    assert model.stranded(0, (1.0, 1.0, 0.6, 0.3), 14.0) == pytest.approx(0.9)
    assert model.stranded(0, (1.0, 1.0, 0.6, 0.3), 21.0) == 0.0
    # A 1-GPU task with 10 cores on a node with 2 GPUs and 14 cores free. Usable: 1/4 x 2
    # + 2/4 x 2 = 1.5 before, 2/4 x 1 after (4 cores are too few for the 1-GPU shape).
    # Stranded: none before (14 cores serve 2 GPUs), 1 - 4/7 = 3/7 after, lost to the GPU
    # shapes (weight 3/4). Less the GPU taken.
    growth = model.change(0, [0.0, 0.0, 1.0, 1.0], 14.0, (0,), 1.0, 10.0)
    assert growth == pytest.approx(1.5 - 0.5 + 0.75 * 3 / 7 - 1.0)


def test_less_stranding_is_no_gain_where_a_shape_is_bound_by_its_selector() -> None:
    # A P100 node with 2 GPUs and 10 cores; the shapes ask for 10 cores per GPU, so 1 GPU
    # is stranded while the node is idle. A 1-GPU task with 2 cores leaves 1 GPU and 8
    # cores: stranded 0.2, and the 10-core shapes fit no more (usable 2 -> 0).
    node = Node("p", gpus=2, cpu=10, gpu_model="P100")
    anywhere = shapes_of([(job("a", 1, cpu=10), 2)], node.gpu_memory)
    model = Fragmentation(NodeClasses([node]), anywhere)
    # Only shapes that fit anywhere: the 0.8 GPU no longer stranded counts as a gain.
    assert model.change(0, [0.0, 0.0], 10.0, (0,), 1.0, 2.0) == pytest.approx(2 - 0.8 - 1)
    # Half of the tasks may use only P100s: the node's GPUs are theirs to keep, and
    # serving stranded ones with work that could go anywhere earns nothing.
    bound = shapes_of(
        [(job("a", 1, cpu=10), 1), (job("b", 1, cpu=10, models=("P100",)), 1)],
        node.gpu_memory,
    )
    model = Fragmentation(NodeClasses([node]), bound)
    assert model.change(0, [0.0, 0.0], 10.0, (0,), 1.0, 2.0) == pytest.approx(2 - 1)


def test_unconstrained_work_leaves_room_for_constrained_work() -> None:
    # Both nodes are idle and alike but for their model; a100 comes first by name. The
    # A100-only shape can use only a100's GPUs, so the free task goes to t4.
    nodes = (Node("a100", gpus=2, gpu_model="A100"), Node("t4", gpus=2, gpu_model="T4"))
    bindings = placed(nodes, job("free", 1, at=1), job("picky", 1, at=2, models=("A100",)))
    assert bindings["free"][0].node == "t4"
    assert bindings["picky"][0].node == "a100"


def test_usable_capacity_by_hand() -> None:
    # Shapes: 1 GPU with 8 CPU (x2), 0.5 GPU with 4 CPU (x1), CPU only (x1).
    node = Node("n", gpus=4, cpu=32)
    shapes = shapes_of(
        [(job("a", 1, cpu=8), 2), (job("c", 0.5, cpu=4), 1), (job("d", 0, cpu=2), 1)],
        node.gpu_memory,
    )
    model = Fragmentation(NodeClasses([node]), shapes)
    # Free shares 1, 1, 0.6, 0.3 and 16 CPU: the 1-GPU shape uses the 2 free devices,
    # the 0.5 shape the devices with at least 0.5 free (1 + 1 + 0.6); weights 2/4, 1/4.
    assert model.usable((0, (1.0, 1.0, 0.6, 0.3), 16.0)) == pytest.approx(0.5 * 2 + 0.25 * 2.6)
    # With 3 CPU free neither GPU shape fits: nothing is usable.
    assert model.usable((0, (1.0, 1.0, 0.6, 0.3), 3.0)) == 0.0
    # A fraction of 0.5 on the 0.6 device: 0.6 of usable capacity is lost, 0.5 GPU taken.
    growth = model.change(0, [0.0, 0.0, 0.4, 0.7], 16.0, (2,), 0.5, 4.0)
    assert growth == pytest.approx(0.25 * 0.6 - 0.5)
