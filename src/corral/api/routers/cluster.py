"""The cluster at a glance, and the liveness probe."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from corral.api.deps import API, LoopDep, StoreDep, User
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.nodes import ClusterOut

router = APIRouter(prefix=API, responses=ERRORS, tags=["cluster"], route_class=PrefixedRoute)
# Outside /api/v1 and without a token, for load balancers and supervisors.
health = APIRouter(tags=["cluster"], route_class=PrefixedRoute)


@router.get("/cluster", response_model=ClusterOut)
async def cluster_summary(_: User, store: StoreDep, loop: LoopDep) -> ClusterOut:
    # Async, its one store read in a worker thread: FastAPI checks a plain function's
    # answer in a worker thread of its own, a second trip (as `workloads.get_workload`).
    counts = await run_in_threadpool(store.counts)
    return ClusterOut(
        nodes=counts.nodes,
        nodes_ready=counts.nodes_ready,
        gpus=counts.gpus,
        gpus_allocated=round(counts.gpus_allocated, 6),
        gpus_free=round(counts.gpus - counts.gpus_allocated, 6),
        virtual_gpus=counts.virtual_gpus,
        workloads=counts.workloads,
        queues=counts.queues,
        last_cycle_at=loop.last_at,
        last_cycle_seconds=loop.last_seconds,
    )


# Async, as it does no I/O: a sync handler costs a request two trips to a worker thread
# (the handler, then its answer's validation), far dearer than the handler itself.
@health.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
