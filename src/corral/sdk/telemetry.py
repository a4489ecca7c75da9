"""Telling corral how busy a task's GPUs are, where nothing can measure it.

On real GPUs corral measures utilisation through NVML. On virtual GPUs (a laptop, CI, a
demo) nothing can, so a task says it itself, every few seconds while it runs:

    from corral.sdk import report_utilization

    report_utilization(85, memory="12GiB")

corral counts a declaration for 30 seconds (or three sampling intervals, when longer);
after that, and before the first one, the task's GPUs count as 0% busy, which an idle
timeout may act on. Declared figures are shown as declared, never as measured.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

from corral.model import parse_memory

TELEMETRY_FILE_ENV = "CORRAL_TELEMETRY_FILE"


def report_utilization(percent: float, memory: int | str | None = None) -> bool:
    """Declare this task's GPU utilisation (0 to 100, of what it was given) and, optionally,
    the GPU memory it uses on each of its devices (bytes, or "12GiB").

    Returns False, and does nothing, outside a corral task. Raises ValueError for a
    percentage outside 0..100 or a memory amount that is not one."""
    if isinstance(percent, bool) or not isinstance(percent, int | float):
        raise ValueError(f"percent: {percent!r} is not a number")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise ValueError(f"percent: {percent!r} must be between 0 and 100")
    amount = None
    if memory is not None:
        try:
            amount = parse_memory(memory)
        except ValueError as error:
            raise ValueError(f"memory: {error}") from None
    path = os.environ.get(TELEMETRY_FILE_ENV)
    if not path:
        return False
    record = {"utilization": float(percent), "memory": amount, "time": time.time()}
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    # Written beside the file and renamed over it: the agent never reads half a record.
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".util-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return True
