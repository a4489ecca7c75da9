"""Workspaces: workloads that declare ports, with their URLs through the proxy and how
long the proxy has carried none of their traffic (`corral workspace list`, the dashboard)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from corral.api.deps import (
    API,
    ProjectQuery,
    StoreDep,
    User,
    lists_workspaces,
    visible_workload,
)
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.workloads import WorkspaceOut, WorkspacePortOut
from corral.model.spec import short_name
from corral.store import Store, WorkloadRecord

router = APIRouter(prefix=API, responses=ERRORS, tags=["workspaces"], route_class=PrefixedRoute)


def workspace_out(store: Store, record: WorkloadRecord, active: float | None) -> WorkspaceOut:
    """A workspace as the API shows it: its ports' paths, and whether each is ready."""
    spec = record.spec
    numbers: dict[str, int] = {}
    node = None
    if record.status == "running":
        target = store.workspace_target(spec.name)
        numbers, node = dict(target.numbers), target.node
    last = (
        max(t for t in (active, record.started_at) if t is not None)
        if (active or record.started_at)
        else None
    )
    idle = time.time() - last if record.status == "running" and last is not None else None
    return WorkspaceOut(
        name=short_name(spec.name),
        project=spec.project,
        user=spec.user,
        status=record.status,  # type: ignore[arg-type]
        node=node,
        ports=[
            WorkspacePortOut(
                name=port.name,
                path=f"/w/{spec.name}/" if port.name == "main" else f"/w/{spec.name}/{port.name}/",
                ready=port.name in numbers,
            )
            for port in spec.ports
        ],
        active_at=active,
        idle_seconds=idle,
    )


@router.get("/workspaces", response_model=list[WorkspaceOut])
def list_workspaces(
    current: User, store: StoreDep, project: str | None = None
) -> list[WorkspaceOut]:
    """Workloads that declare ports, of the caller's projects (every project's for an
    admin), oldest first."""
    found = [
        r
        for r in store.list_workloads(
            project, None, None, None if current.role == "admin" else current.projects
        )
        if r.spec.ports and lists_workspaces(current, r.spec.project)
    ]
    active = store.active_at([r.spec.name for r in found])
    return [workspace_out(store, r, active.get(r.spec.name)) for r in found]


@router.get("/workspaces/{name}", response_model=WorkspaceOut)
def get_workspace(
    name: str, current: User, store: StoreDep, project: ProjectQuery = None
) -> WorkspaceOut:
    """One workspace: its status, node, ports (path, ready) and idle time."""
    record = visible_workload(store, current, name, project)
    active = store.active_at([record.name])
    return workspace_out(store, record, active.get(record.name))
