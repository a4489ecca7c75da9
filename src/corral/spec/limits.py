"""The limits of a workload's tasks, the same for the API, scenario files and the CLI:
a file that `corral plan` accepts is one the server accepts."""

from __future__ import annotations

# A task runs on one node: no node has more GPUs than this.
MAX_GPUS_PER_TASK = 64
# Tasks of one group, and of one workload in all its groups.
MAX_REPLICAS = 1024
MAX_TASKS = 4096
# Task groups of one workload.
MAX_TASK_GROUPS = 16


def gpu_problem(gpu: float) -> str | None:
    """Why `gpu` is no task's GPU request (None when it is one): a fraction of one GPU
    below 1, whole GPUs from 1, and at most MAX_GPUS_PER_TASK."""
    if gpu >= 1 and gpu != int(gpu):
        return "a GPU request of 1 or more must be a whole number of devices"
    if gpu > MAX_GPUS_PER_TASK:
        return f"at most {MAX_GPUS_PER_TASK} GPUs per task"
    return None


def tasks_problem(total: int) -> str | None:
    """Why a workload of `total` tasks is refused (None when it is not)."""
    if total > MAX_TASKS:
        return f"at most {MAX_TASKS} tasks in one workload"
    return None
