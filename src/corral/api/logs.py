"""Reading a task's output from the data directory, where its agent writes it (or where
the output shipped from its node is stored): DATA_DIR/logs/DIRECTORY/task-N.log, by the
name of its workload's directories (NAME.ID), so that a workload that takes a deleted
one's name reads none of its output."""

from __future__ import annotations

from pathlib import Path

from corral.agent.logcap import marker, read_kept
from corral.api.schemas.workloads import LogOut
from corral.model.spec import short_name
from corral.store.records import WorkloadRecord

LOG_CHUNK = 1 << 20


def read_log(
    data_dir: Path | None, workload: WorkloadRecord, task: int, offset: int, tail: int | None
) -> LogOut:
    """A task's output from `offset` (at most 1 MiB of it), or its last `tail` lines."""
    name = short_name(workload.name)
    folder = data_dir / "logs" / workload.directory if data_dir is not None else None
    tasks = sorted(
        int(path.stem.split("-", 1)[1])
        for path in (folder.glob("task-*.log") if folder and folder.is_dir() else [])
        if path.stem.split("-", 1)[1].isdigit()
    )
    path = folder / f"task-{task}.log" if folder else None
    if path is None or not path.is_file():
        return LogOut(workload=name, task=task, text="", offset=offset, tasks=tasks)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if tail is not None:
            start = max(size - LOG_CHUNK, 0)
            dropped, data = read_kept(handle, start, LOG_CHUNK)
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:])
            end = size
        else:
            start = min(offset, size)
            dropped, data = read_kept(handle, start, LOG_CHUNK)
            end = start + dropped + len(data)
            # Output the agent dropped to keep the log within its cap (corral.agent.logcap).
            data = marker(dropped) + data if dropped else data
    return LogOut(
        workload=name, task=task, text=data.decode("utf-8", "replace"), offset=end, tasks=tasks
    )
