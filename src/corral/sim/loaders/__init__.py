"""Trace loaders, and `load_trace` to find one by name or path.

Names: `philly` (Pollux's Philly job table), `gavel` (Gavel's per-VC Philly traces),
`openb` or `openb:VARIANT` (Alibaba 2023, the default pod list or a variant such as
`openb:gpuspec33`), `helios` (Helios per-VC demand series) and `synthetic` (the seeded
generator). A path is read according to what it holds.
"""

from __future__ import annotations

import csv
from pathlib import Path

from corral.sim.errors import SimError
from corral.sim.loaders.alibaba import (
    NODE_LIST,
    Pod,
    load_openb,
    load_openb_nodes,
    load_openb_pods,
)
from corral.sim.loaders.gavel import load_gavel
from corral.sim.loaders.helios import load_helios
from corral.sim.loaders.philly import load_philly
from corral.sim.synthetic import synthetic_trace
from corral.sim.trace import Trace, traces_root

ALIBABA = "alibaba-gpu-v2023"
NAMES = ("philly", "gavel", "openb", "openb:VARIANT", "helios", "synthetic")

__all__ = [
    "NAMES",
    "Pod",
    "load_gavel",
    "load_helios",
    "load_openb",
    "load_openb_nodes",
    "load_openb_pods",
    "load_philly",
    "load_trace",
    "openb_pod_list",
]


def openb_pod_list(variant: str, root: Path | None = None) -> Path:
    """The pod list of an openb variant: "default", "gpuspec33", "multigpu50", ..."""
    return (root or traces_root()) / ALIBABA / f"openb_pod_list_{variant}.csv"


def load_trace(name_or_path: str, root: Path | None = None, seed: int = 0) -> Trace:
    """A trace by name (see NAMES) or by path; `seed` drives the synthetic generator."""
    base = root or traces_root()
    name, _, variant = name_or_path.partition(":")
    if name == "synthetic":
        return synthetic_trace(seed)
    if name == "philly":
        return load_philly(base / "pollux-osdi21" / "traces" / "philly.csv")
    if name == "gavel":
        return load_gavel(base / "gavel-osdi20" / "traces" / "msr" / "seed_0")
    if name == "helios":
        return load_helios(base / "helios-sc21")
    if name in ("openb", "alibaba"):
        return load_openb(openb_pod_list(variant or "default", base), base / ALIBABA / NODE_LIST)
    return _load_path(Path(name_or_path))


def _load_path(path: Path) -> Trace:
    if path.is_dir():
        if any(path.glob("*.trace")):
            return load_gavel(path)
        return load_helios(path)
    if not path.is_file():
        names = ", ".join(NAMES)
        raise SimError(str(path), f"no such file, and not a trace name ({names})")
    if path.suffix == ".trace":
        return load_gavel(path)
    # Recognise the format by a column only it has, so that a file of a known format
    # with a column missing is reported as exactly that.
    header = set(_header(path))
    if header & {"total_gpu_num", "running_gpu_num"}:
        return load_helios(path)
    if header & {"num_gpu", "gpu_milli"}:
        nodes = path.parent / NODE_LIST
        if not nodes.is_file():
            raise SimError(str(path), f"an openb pod list needs {NODE_LIST} beside it")
        return load_openb(path, nodes)
    if header & {"num_gpus", "cluster"}:
        return load_philly(path)
    raise SimError(
        path.name,
        "not a known trace format (a Philly job table, an openb pod list, a Helios "
        "sequence or a Gavel .trace file)",
    )


def _header(path: Path) -> list[str]:
    """The first line's fields."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError) as error:
        raise SimError(str(path), f"cannot read the file: {error}") from None
