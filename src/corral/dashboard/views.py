"""What the pages show, worked out from the API's JSON: formatting and small derivations.

static/dashboard.js holds the same functions for the live updates; the two must agree,
because the first render comes from here and every refresh from there.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

Json = dict[str, Any]
STATUSES = ("pending", "running", "suspended", "succeeded", "failed", "cancelled")
DEVICE_STATES = ("free", "busy", "idle")


def half_up(value: float, digits: int) -> float:
    """Round halves up, as Math.round does in the pages' script, so both show the same."""
    scale = 10.0**digits
    return math.floor(value * scale + 0.5) / scale


def num(value: float | None, digits: int = 2) -> str:
    """A GPU count or amount: whole numbers bare, others to at most `digits` decimals."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "∞"
    rounded = half_up(value, digits)
    if rounded == int(rounded):
        return str(int(rounded))
    return f"{rounded:.{digits}f}".rstrip("0").rstrip(".")


def hours(value: float | None) -> str:
    """GPU-hours: three decimals below one hour, so that a few minutes still show."""
    if value is None:
        return "—"
    return num(value, 3 if abs(value) < 1 else 2)


def pct(value: float | None) -> str:
    return "—" if value is None else f"{int(half_up(value, 0))}%"


def duration(seconds: float | None) -> str:
    """A wait or a run time the way people say it: 45s, 3m 12s, 2h 5m, 1d 3h."""
    if seconds is None:
        return "—"
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def gib(amount: float | None) -> str:
    if amount is None:
        return "—"
    return f"{num(amount / 2**30)} GiB"


def clock(timestamp: float | None) -> str:
    if timestamp is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def command(args: list[str]) -> str:
    """A command as a shell would take it; an inline script (python -c '...') is shown as
    written, on lines of its own, rather than quoted."""
    if not any("\n" in arg for arg in args):
        return shlex.join(args)
    lines: list[str] = []
    words: list[str] = []
    for arg in args:
        if "\n" in arg:
            if words:
                lines.append(shlex.join(words))
                words = []
            lines.append(arg.strip("\n"))
        else:
            words.append(arg)
    if words:
        lines.append(shlex.join(words))
    return "\n".join(lines)


# -- devices and workloads -------------------------------------------------------------------


def device_workloads(device: Mapping[str, Any]) -> list[str]:
    """The names of the workloads on a device (the API may give names or objects)."""
    names = []
    for item in device.get("workloads") or []:
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, Mapping):
            name = item.get("name") or item.get("workload")
            if name:
                names.append(str(name))
    return names


def device_states(devices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many devices are free, allocated and busy, allocated and idle."""
    counts = dict.fromkeys(DEVICE_STATES, 0)
    for device in devices:
        state = device.get("state")
        if state in counts:
            counts[state] += 1
    return counts


def activity(devices: Iterable[Mapping[str, Any]], workloads: Iterable[Json]) -> dict[str, Json]:
    """Each running workload's utilisation now, as a percentage of what it was given (the
    mean over its devices), whether it is busy or idle, and whether the figures are declared.

    Telemetry is per device. On a device a workload holds alone, its share of the device
    turns the device's figure into the workload's; on a shared device the device's figure
    stands for every holder."""
    telemetry = {(d.get("node"), d.get("device")): d for d in devices}
    result = {}
    for workload in workloads:
        values, states, declared = [], set(), False
        for placement in workload.get("placements") or []:
            held = placement["devices"]
            share = min(placement["gpu"] / len(held), 1.0) if held else 1.0
            for index in held:
                device = telemetry.get((placement["node"], index))
                if device is None:
                    continue
                states.add(device.get("state"))
                declared = declared or device.get("source") == "declared"
                value = device.get("utilization")
                if value is None:
                    continue
                alone = device_workloads(device) == [workload["name"]]
                values.append(min(value / share, 100.0) if alone and share > 0 else value)
        if not states:
            continue
        result[workload["name"]] = {
            "utilization": sum(values) / len(values) if values else None,
            "state": "busy" if "busy" in states else "idle" if "idle" in states else "—",
            "declared": declared,
        }
    return result


def gpus_asked(workload: Mapping[str, Any]) -> str:
    """What a workload asks for: GPUs over all its tasks, or GPU memory for memory fractions."""
    gpus = sum(group["replicas"] * group["gpu"] for group in workload["tasks"])
    memory = sum(group["replicas"] * group["gpu_memory"] for group in workload["tasks"])
    if memory and not gpus:
        return gib(memory)
    return num(gpus)


def pending_since(workload: Mapping[str, Any]) -> float:
    """When a pending workload last became pending (a requeue starts its wait again)."""
    since = workload.get("pending_since")
    return float(since if since is not None else workload["created_at"])


def waited(workload: Mapping[str, Any], now: float) -> float | None:
    """For pending work, seconds since it last became pending; else from submission to
    its first start."""
    if workload["status"] == "pending":
        return now - pending_since(workload)
    if workload.get("started_at") is not None:
        return float(workload["started_at"]) - float(workload["created_at"])
    return None


def longest_waits(pending: list[Json], now: float, count: int = 8) -> list[Json]:
    ordered = sorted(pending, key=lambda w: (pending_since(w), w["name"]))
    return [w | {"waited": now - pending_since(w)} for w in ordered[:count]]


# -- queues ----------------------------------------------------------------------------------


def queue_tree(queues: list[Json]) -> list[Json]:
    """Queues in tree order (departments, then their projects, by name), each with its
    depth."""
    by_name = {q["name"]: q for q in queues}
    children: dict[str | None, list[str]] = {}
    for queue in queues:
        parent = queue["parent"] if queue["parent"] in by_name else None
        children.setdefault(parent, []).append(queue["name"])
    ordered: list[Json] = []

    def walk(parent: str | None, depth: int) -> None:
        for name in sorted(children.get(parent, [])):
            ordered.append(by_name[name] | {"depth": depth})
            walk(name, depth + 1)

    walk(None, 0)
    return ordered


def weight_text(queue: Mapping[str, Any]) -> str:
    """The over-quota GPU weight, and with time-decayed fair share the one the latest
    cycle used: "2 → 0.6" (as dashboard.js's weightText)."""
    base = float(queue["over_quota_weight"]["gpu"])
    effective = queue.get("effective_weight")
    if effective is None or abs(effective - base) <= 1e-9:
        return f"{base:.3g}"
    return f"{base:.3g} → {effective:.2g}"


def gpu(amounts: Mapping[str, Any] | None) -> float | None:
    """The GPU figure of an Amounts object; None for none (or unlimited)."""
    if amounts is None:
        return None
    value = amounts.get("gpu")
    return None if value is None else float(value)


def workload_url(name: str, project: str | None = None) -> str:
    """The dashboard's page of workload NAME of `project`, or of PROJECT/NAME."""
    given, separator, short = name.rpartition("/")
    project = given if separator else project
    page = f"/workloads/{quote(short, safe='')}"
    return f"{page}?project={quote(project, safe='')}" if project else page


def device_cells(nodes: list[Json], devices: list[Json] | None) -> list[Json]:
    """Every node with a cell per device: its allocation from the node, its utilisation and
    state from telemetry (state `allocated` when there is no telemetry to tell busy from
    idle)."""
    telemetry = {(d.get("node"), d.get("device")): d for d in devices or []}
    result = []
    for node in sorted(nodes, key=lambda n: n["name"]):
        cells = []
        for device in sorted(node["devices"], key=lambda d: d["index"]):
            seen = telemetry.get((node["name"], device["index"]))
            allocated = [
                f"{t['project']}/{t['workload']}"
                for t in node["tasks"]
                if device["index"] in t["devices"] and t["workload"]
            ]
            cells.append(
                {
                    "index": device["index"],
                    "model": device["model"],
                    "virtual": bool(seen.get("virtual", device["virtual"]))
                    if seen
                    else device["virtual"],
                    "utilization": seen.get("utilization") if seen else None,
                    "memory_used": seen.get("memory_used") if seen else None,
                    "memory_total": (seen.get("memory_total") if seen else None)
                    or device["memory"],
                    "power": seen.get("power") if seen else None,
                    "temperature": seen.get("temperature") if seen else None,
                    "source": seen.get("source") if seen else None,
                    "workloads": device_workloads(seen) if seen else allocated,
                    "state": (seen.get("state") if seen else None)
                    or ("allocated" if allocated else "free"),
                }
            )
        result.append({"node": node, "cells": cells})
    return result


def usage_rows(usage: Any) -> list[Json]:
    """The rows of a usage answer, whether it is a list or an object holding `rows`."""
    if isinstance(usage, list):
        return usage
    if isinstance(usage, Mapping):
        rows = usage.get("rows")
        return list(rows) if isinstance(rows, list) else []
    return []
