"""What each page asks the API for. The JSON gathered here is rendered into the first view
and embedded in the page, and the page's script asks the same endpoints to refresh it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any
from urllib.parse import quote

from corral.dashboard.apiclient import ApiClient, together
from corral.dashboard.views import STATUSES

Json = dict[str, Any]
Query = Mapping[str, str]

SINCE = ("15m", "1h", "6h", "24h", "7d")
# Seconds per point of the charts over time: about 60 to 170 points whatever the window.
STEP = {"15m": 15, "1h": 30, "6h": 180, "24h": 600, "7d": 3600}
USAGE_SINCE = ("1h", "24h", "7d", "30d")
USAGE_BY = ("project", "department", "user", "workload")
# The usage chart's bars: one per step of the window.
USAGE_STEP = {"1h": 300, "24h": 3600, "7d": 86400, "30d": 86400}


def choice(query: Query, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = query.get(key, default)
    return value if value in allowed else default


async def overview(api: ApiClient, query: Query) -> Json:
    since = choice(query, "since", SINCE, "1h")
    cluster, devices, series, running, pending = await together(
        api.get("/cluster"),
        api.optional("/telemetry/devices"),
        api.optional("/telemetry/cluster", since=since, step=STEP[since]),
        api.get("/workloads", status="running"),
        api.get("/workloads", status="pending"),
    )
    return {
        "since": since,
        "step": STEP[since],
        "cluster": cluster,
        "devices": devices,
        "series": series,
        "running": running,
        "pending": pending,
    }


async def queues(api: ApiClient, query: Query) -> Json:
    since = choice(query, "since", SINCE, "1h")
    found, series = await together(
        api.get("/queues"), api.optional("/telemetry/queues", since=since, step=STEP[since])
    )
    return {"since": since, "step": STEP[since], "queues": found, "series": series}


async def workloads(api: ApiClient, query: Query) -> Json:
    filters = {
        "status": choice(query, "status", ("", *STATUSES), ""),
        "project": query.get("project", ""),
        "user": query.get("user", ""),
    }
    found, devices, all_queues = await together(
        api.get("/workloads", **filters),
        api.optional("/telemetry/devices"),
        api.get("/queues"),
    )
    projects = sorted(q["name"] for q in all_queues if not q["department"])
    return {"filters": filters, "workloads": found, "devices": devices, "projects": projects}


async def workload(api: ApiClient, query: Query, name: str) -> Json:
    since = choice(query, "since", SINCE, "1h")
    task = query.get("task", "0")
    task = task if task.isdigit() else "0"
    path = f"/workloads/{quote(name, safe='')}"
    # A name is unique within its project: the page's `project` says which.
    where = {"project": query["project"]} if query.get("project") else {}
    found, events, logs, series = await together(
        api.get(path, **where),
        api.get(f"{path}/events", **where),
        api.get(f"{path}/logs", tail=50, task=task, **where),
        api.optional(f"/telemetry{path}", since=since, **where),
    )
    why = await api.get(f"{path}/why", **where) if found["status"] == "pending" else None
    return {
        "name": name,
        "project": found["project"],
        "since": since,
        "workload": found,
        "events": events,
        "logs": logs,
        "series": series,
        "why": why,
    }


async def nodes(api: ApiClient, query: Query) -> Json:
    found, devices = await together(api.get("/nodes"), api.optional("/telemetry/devices"))
    return {"nodes": found, "devices": devices}


async def usage(api: ApiClient, query: Query) -> Json:
    since = choice(query, "since", USAGE_SINCE, "7d")
    by = choice(query, "by", USAGE_BY, "project")
    rows, series, all_queues = await together(
        api.optional("/usage", since=since, by=by, format="json"),
        api.optional("/telemetry/queues", since=since, step=USAGE_STEP[since]),
        api.get("/queues"),
    )
    projects = sorted(q["name"] for q in all_queues if not q["department"])
    # The chart stacks departments when the table is by department.
    departments = sorted(q["name"] for q in all_queues if q["department"])
    return {
        "since": since,
        "by": by,
        "step": USAGE_STEP[since],
        "usage": rows,
        "series": series,
        "projects": projects,
        "departments": departments,
    }


Loader = Callable[[ApiClient, Query], Coroutine[Any, Any, Json]]


async def workspaces(api: ApiClient, query: Query) -> Json:
    return {"workspaces": await api.get("/workspaces")}


PAGES: dict[str, Loader] = {
    "overview": overview,
    "queues": queues,
    "workloads": workloads,
    "nodes": nodes,
    "usage": usage,
    "workspaces": workspaces,
}
