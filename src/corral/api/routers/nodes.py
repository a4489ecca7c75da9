"""Nodes: registering, removing and cordoning them is an admin's; anyone may read them,
but a member sees the names of their own projects' workloads only."""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from corral.api.deps import API, Admin, LoopDep, StoreDep, User, readable_projects
from corral.api.errors import ERRORS
from corral.api.outputs import node_out
from corral.api.routes import PrefixedRoute
from corral.api.schemas.nodes import NodeIn, NodeOut

router = APIRouter(prefix=API, responses=ERRORS, tags=["nodes"], route_class=PrefixedRoute)


@router.get("/nodes", response_model=list[NodeOut])
def list_nodes(current: User, store: StoreDep) -> list[NodeOut]:
    readable = readable_projects(current)
    return [node_out(record, readable) for record in store.list_nodes()]


@router.post("/nodes", response_model=NodeOut, status_code=201)
def register_node(body: NodeIn, _: Admin, store: StoreDep, loop: LoopDep) -> NodeOut:
    record = store.register_node(body.to_spec())
    loop.trigger()
    return node_out(record)


@router.get("/nodes/{name}", response_model=NodeOut)
async def get_node(name: str, current: User, store: StoreDep) -> NodeOut:
    # Async, its one store read in a worker thread (see `workloads.get_workload`).
    return node_out(await run_in_threadpool(store.get_node, name), readable_projects(current))


@router.delete("/nodes/{name}", status_code=204)
def remove_node(name: str, _: Admin, store: StoreDep, loop: LoopDep) -> Response:
    store.remove_node(name)
    loop.trigger()
    return Response(status_code=204)


@router.post("/nodes/{name}/cordon", response_model=NodeOut)
def cordon(name: str, _: Admin, store: StoreDep, loop: LoopDep) -> NodeOut:
    record = store.set_schedulable(name, False)
    loop.trigger()
    return node_out(record)


@router.post("/nodes/{name}/uncordon", response_model=NodeOut)
def uncordon(name: str, _: Admin, store: StoreDep, loop: LoopDep) -> NodeOut:
    record = store.set_schedulable(name, True)
    loop.trigger()
    return node_out(record)
