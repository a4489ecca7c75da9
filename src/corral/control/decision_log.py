"""The scheduler's decisions in the server's log, one line each at info level: what was
bound where, and what was evicted, by what and why. An operator reads from the log why a
job started or stopped without asking the API."""

from __future__ import annotations

import logging

from corral.model import Decisions, Placement
from corral.model.resources import format_gpus

log = logging.getLogger("corral.scheduler")
# A gang spread over many nodes is told by its first nodes and how many more.
NODES_SHOWN = 8


def log_decisions(decisions: Decisions) -> None:
    """One line per eviction, then one per workload bound, in a stable order."""
    if not log.isEnabledFor(logging.INFO):
        return
    for eviction in decisions.evictions:
        tasks = ",".join(str(task) for task in eviction.tasks)
        by = f" for {eviction.by}" if eviction.by else ""
        log.info(
            "evicted %s (tasks %s) by %s%s: %s",
            eviction.workload,
            tasks,
            eviction.action,
            by,
            eviction.reason,
        )
    for name in sorted(decisions.bindings):
        log.info("bound %s: %s", name, where(decisions.bindings[name]))


def where(placements: tuple[Placement, ...]) -> str:
    """ "2 tasks on node-a (GPUs 0,1; 2,3)", or with a fraction "node-a (GPU 0 x0.5)"."""
    by_node: dict[str, list[str]] = {}
    for placement in placements:
        devices = ",".join(str(index) for index in placement.devices) or "-"
        if 0 < placement.gpu < 1:
            devices += f" x{format_gpus(placement.gpu)}"
        by_node.setdefault(placement.node, []).append(devices)
    shown = [
        f"{node} (GPUs {'; '.join(devices)})"
        for node, devices in list(by_node.items())[:NODES_SHOWN]
    ]
    more = len(by_node) - NODES_SHOWN
    if more > 0:
        shown.append(f"and {more} more nodes")
    count = len(placements)
    return f"{count} task{'s' if count != 1 else ''} on {', '.join(shown)}"
