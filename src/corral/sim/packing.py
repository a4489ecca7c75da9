"""Placement scorers for packing studies, and a first-come-first-served scheduler that
places with them.

Each scorer picks a node for one task among the nodes where it fits; the device on the
node is the fullest one with room for a fraction (any fitting one for `random`) and the
lowest-numbered free ones for whole GPUs:

- `random`: any node where the task fits, uniformly.
- `bestfit`: the node left with the least free GPU, CPU and memory after the task, each
  as a share of the node's capacity, summed.
- `packing`: a fraction goes to a partly used device first, then to a free device of a
  node already in use, then to an idle node; whole GPUs to a node already in use before
  an idle one. Among equals, the node with the most GPUs in use.
- `dotprod`: Tetris's alignment: the node whose free GPU, CPU and memory (shares of its
  capacity) have the largest dot product with the task's request (same shares).

Ties go to the node listed first. Node state is kept in numpy arrays so that one task is
scored against every node in a few vector operations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from corral.model import Decisions, Node, Placement, SchedulerConfig, Snapshot, TaskGroup
from corral.model.resources import EPSILON
from corral.sim.names import SCORER_NAMES

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
# A scorer's choice: the node, and for a fraction the device (None: the fullest with room).
Choice = tuple[int, int | None]
Scorer = Callable[["PackingState", TaskGroup, Bools], Choice]


class PackingState:
    """Free capacity of every node and the use of every device, as arrays."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.index = {node.name: at for at, node in enumerate(self.nodes)}
        self.gpus = np.array([node.gpus for node in self.nodes], dtype=np.float64)
        width = max((node.gpus for node in self.nodes), default=0)
        self.exists = np.arange(width)[None, :] < self.gpus[:, None]
        # Devices a node does not have count as full, so nothing is ever placed there.
        self.used = np.where(self.exists, 0.0, 1.0)
        self.cpu = np.array([node.cpu for node in self.nodes], dtype=np.float64)
        self.memory = np.array([node.memory for node in self.nodes], dtype=np.float64)
        self.free_cpu = self.cpu.copy()
        self.free_memory = self.memory.copy()
        self.free_whole = self.gpus.copy()
        self.best_free = np.where(self.gpus > 0, 1.0, 0.0)
        self.used_gpu = np.zeros(len(self.nodes))
        self._models = np.array([node.gpu_model for node in self.nodes])
        self._eligible: dict[tuple[str, ...], Bools] = {}
        self.rng = np.random.default_rng(0)
        # True: a fraction goes to any device with room, at random (the random scorer).
        self.random_devices = False

    def eligible(self, models: tuple[str, ...]) -> Bools:
        """Nodes whose GPU model is one of `models` (every node when empty)."""
        found = self._eligible.get(models)
        if found is None:
            found = np.isin(self._models, models) if models else np.ones(len(self.nodes), bool)
            self._eligible[models] = found
        return found

    def fits(self, group: TaskGroup, eligible: Bools) -> Bools:
        """Nodes where one task of `group` fits now."""
        room = (
            eligible
            & (self.free_cpu + EPSILON >= group.cpu)
            & (self.free_memory + EPSILON >= group.memory)
        )
        if group.gpu >= 1:
            return room & (self.free_whole >= int(group.gpu))
        if group.gpu > 0:
            return room & (self.best_free + EPSILON >= group.gpu)
        return room

    def place(self, group: TaskGroup, task: int, node: int, device: int | None = None) -> Placement:
        """Bind one task of `group` to node `node` (which must fit it); a fraction goes to
        `device` when given."""
        row = self.used[node]
        if group.gpu >= 1:
            count = int(group.gpu)
            devices = tuple(int(device) for device in np.flatnonzero(row == 0.0)[:count])
            amount = float(count)
        elif group.gpu > 0:
            room = 1.0 - row
            fitting = np.flatnonzero(room + EPSILON >= group.gpu)
            if device is None and self.random_devices:
                device = int(self.rng.choice(fitting))
            elif device is None:
                device = int(fitting[np.argmin(room[fitting])])
            devices = (device,)
            amount = group.gpu
        else:
            devices = ()
            amount = 0.0
        placement = Placement(task, self.nodes[node].name, devices, amount)
        self.bind(placement, group, 1.0)
        return placement

    def bind(self, placement: Placement, group: TaskGroup, sign: float) -> None:
        """Add (sign 1) or remove (sign -1) a placed task's use."""
        node = self.index[placement.node]
        self.free_cpu[node] -= sign * group.cpu
        self.free_memory[node] -= sign * group.memory
        if placement.devices:
            share = placement.gpu / len(placement.devices)
            row = self.used[node]
            for device in placement.devices:
                row[device] = round(row[device] + sign * share, 9)
            self.used_gpu[node] = round(self.used_gpu[node] + sign * placement.gpu, 9)
            real = row[self.exists[node]]
            self.free_whole[node] = float(np.count_nonzero(real == 0.0))
            self.best_free[node] = float(1.0 - real.min()) if real.size else 0.0


def _random(state: PackingState, group: TaskGroup, fits: Bools) -> Choice:
    return int(state.rng.choice(np.flatnonzero(fits))), None


def _bestfit(state: PackingState, group: TaskGroup, fits: Bools) -> Choice:
    candidates = np.flatnonzero(fits)
    gpus = state.gpus[candidates]
    left_gpu = np.divide(
        gpus - state.used_gpu[candidates] - group.gpu,
        gpus,
        out=np.zeros(len(candidates)),
        where=gpus > 0,
    )
    left_cpu = (state.free_cpu[candidates] - group.cpu) / state.cpu[candidates]
    left_memory = (state.free_memory[candidates] - group.memory) / state.memory[candidates]
    return int(candidates[np.argmin(left_gpu + left_cpu + left_memory)]), None


def _packing(state: PackingState, group: TaskGroup, fits: Bools) -> Choice:
    candidates = np.flatnonzero(fits)
    in_use = state.used_gpu[candidates] > EPSILON
    tier = np.where(in_use, 1, 2)
    if 0 < group.gpu < 1:
        used = state.used[candidates]
        partial = (used > EPSILON) & (1.0 - used + EPSILON >= group.gpu)
        tier = np.where(partial.any(axis=1), 0, tier)
    # Lexicographic: tier first, then the most GPUs in use (scaled below one tier step).
    key = tier * 1e6 - state.used_gpu[candidates]
    return int(candidates[np.argmin(key)]), None


def _dotprod(state: PackingState, group: TaskGroup, fits: Bools) -> Choice:
    candidates = np.flatnonzero(fits)
    gpus = state.gpus[candidates]
    free_gpu = np.divide(
        gpus - state.used_gpu[candidates], gpus, out=np.zeros(len(candidates)), where=gpus > 0
    )
    want_gpu = np.divide(
        np.full(len(candidates), group.gpu), gpus, out=np.zeros(len(candidates)), where=gpus > 0
    )
    cpu = state.cpu[candidates]
    memory = state.memory[candidates]
    score = (
        want_gpu * free_gpu
        + (group.cpu / cpu) * (state.free_cpu[candidates] / cpu)
        + (group.memory / memory) * (state.free_memory[candidates] / memory)
    )
    return int(candidates[np.argmax(score)]), None


class FragmentationGradient:
    """Fragmentation gradient descent, after "Beware of Fragmentation" (ATC'23): place a
    task where it adds the least expected GPU fragmentation.

    A node's fragmentation for one kind of task is the free GPU capacity that kind cannot
    use there: all of it when the kind does not fit the node (too little CPU, too few
    wholly free devices, no device with room for its fraction) or asks for no GPU; else
    the free share of the devices too full for it (partly used devices for whole-GPU
    kinds, devices with less free than the fraction for fractional kinds). The expected
    fragmentation weighs each kind by its share of the workload. For each node the task
    fits (and, for a fraction, each distinct device it fits), the scorer computes the
    change and takes the smallest; nodes in the same state are scored once.
    """

    def __init__(self, kinds: Sequence[tuple[float, float]], weights: Sequence[float]) -> None:
        total = float(sum(weights))
        self.cpu = np.array([cpu for cpu, _ in kinds], dtype=np.float64)
        self.gpu = np.array([gpu for _, gpu in kinds], dtype=np.float64)
        self.weight = np.array(weights, dtype=np.float64) / total
        self.whole = self.gpu >= 1
        self.fraction = (self.gpu > 0) & ~self.whole

    @classmethod
    def of(cls, groups: Sequence[TaskGroup], most: int = 40) -> FragmentationGradient:
        """The kinds of a workload: its most common (CPU, GPU) requests."""
        counts = Counter((group.cpu, group.gpu) for group in groups)
        common = counts.most_common(most)
        return cls([kind for kind, _ in common], [count for _, count in common])

    def fragmentation(self, free: Floats, cpu: Floats) -> Floats:
        """Expected fragmentation of node states: `free` (states x devices) free shares
        of each device (0 for devices a node lacks), `cpu` free cores."""
        total = free.sum(axis=1)
        host = cpu[:, None] + EPSILON >= self.cpu[None, :]
        wholly_free = (free >= 1 - EPSILON).sum(axis=1)
        partial = np.where(free < 1 - EPSILON, free, 0.0).sum(axis=1)
        # For each fractional kind: the free share of devices with less free than it needs.
        small = free[:, :, None] + EPSILON < self.gpu[None, None, :]
        too_full = np.where(small, free[:, :, None], 0.0).sum(axis=1)
        fits_whole = host & (wholly_free[:, None] >= self.gpu[None, :])
        fits_fraction = host & (free.max(axis=1)[:, None] + EPSILON >= self.gpu[None, :])
        unusable = np.where(
            self.whole[None, :] & fits_whole,
            partial[:, None],
            np.where(self.fraction[None, :] & fits_fraction, too_full, total[:, None]),
        )
        result: Floats = unusable @ self.weight
        return result

    def __call__(self, state: PackingState, group: TaskGroup, fits: Bools) -> Choice:
        candidates = np.flatnonzero(fits)
        free = np.where(state.exists[candidates], 1.0 - state.used[candidates], 0.0)
        cpu = state.free_cpu[candidates]
        # Nodes in the same state (free shares in any order, free CPU) score the same.
        signature = np.column_stack((np.sort(free, axis=1), cpu))
        _, first = np.unique(signature, axis=0, return_index=True)
        states = free[first]
        before = self.fragmentation(states, cpu[first])
        after_cpu = cpu[first] - group.cpu
        if group.gpu >= 1:
            count = int(group.gpu)
            after = states.copy()
            for row in after:
                row[np.flatnonzero(row >= 1 - EPSILON)[:count]] = 0.0
            change = self.fragmentation(after, after_cpu) - before
            best = int(np.argmin(change))
            return int(candidates[first[best]]), None
        if group.gpu > 0:
            rows, devices = np.nonzero(states + EPSILON >= group.gpu)
            after = states[rows].copy()
            after[np.arange(len(rows)), devices] -= group.gpu
            change = self.fragmentation(after, after_cpu[rows]) - before[rows]
            best = int(np.argmin(change))
            node = int(candidates[first[rows[best]]])
            return node, int(devices[best])
        change = self.fragmentation(states, after_cpu) - before
        return int(candidates[first[int(np.argmin(change))]]), None


SCORERS: dict[str, Scorer] = dict(
    zip(SCORER_NAMES, (_random, _bestfit, _packing, _dotprod), strict=True)
)


def place_group(
    state: PackingState, scorer: Scorer, groups: Sequence[TaskGroup], models: tuple[str, ...]
) -> list[Placement] | None:
    """Place every task of a gang, or none (undoing what was placed) and return None."""
    eligible = state.eligible(models)
    placements: list[Placement] = []
    tasks = [group for group in groups for _ in range(group.replicas)]
    for task, group in enumerate(tasks):
        fits = state.fits(group, eligible)
        if not fits.any():
            for placement in placements:
                state.bind(placement, tasks[placement.task], -1.0)
            return None
        node, device = scorer(state, group, fits)
        placements.append(state.place(group, task, node, device))
    return placements


class ScorerScheduler:
    """A cycle that places pending workloads oldest first, each where a scorer says; it
    never evicts. Called like `corral.engine.schedule`."""

    def __init__(self, scorer: Scorer, seed: int = 0) -> None:
        self.scorer = scorer
        self.rng = np.random.default_rng(seed)
        self.random_devices = scorer is _random

    def __call__(self, snapshot: Snapshot, config: SchedulerConfig) -> Decisions:
        state = PackingState(snapshot.nodes)
        state.rng = self.rng
        state.random_devices = self.random_devices
        pending = []
        for workload in snapshot.workloads:
            if workload.placements:
                tasks = workload.tasks()
                for placement in workload.placements:
                    state.bind(placement, tasks[placement.task], 1.0)
            else:
                pending.append(workload)
        pending.sort(key=lambda workload: (workload.submitted, workload.name))
        bindings: dict[str, tuple[Placement, ...]] = {}
        reasons: dict[str, str] = {}
        for workload in pending:
            models = workload.node_selector.get("gpu_model", ())
            placed = place_group(state, self.scorer, workload.task_groups, tuple(models))
            if placed is None:
                reasons[workload.name] = "no node has room for every task"
            else:
                bindings[workload.name] = tuple(placed)
        return Decisions(bindings, (), reasons, {})
