"""The server, put together: the control plane (`corral.control`) built once and handed to
the FastAPI application, which serves the REST API under /api/v1 (`corral.api`), the
workspaces' proxy and exec (`corral.workspaces`) and the dashboard (`corral.dashboard`),
and starts and stops the control plane and the audit writer with its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from corral.api.audit import Audit, AuditLog
from corral.api.body_limit import BodyLimit
from corral.api.deps import API
from corral.api.docs import install_api_docs
from corral.api.errors import install_error_handlers
from corral.api.nul import RefuseNul
from corral.api.options import AllowedMethods
from corral.api.rate_limit import RateLimiter
from corral.api.routers import ROUTERS
from corral.api.routers.visibility import install_visibility
from corral.api.routes import PrefixedRoute, serve
from corral.api.threads import limit_worker_threads, worker_threads
from corral.cluster import Cluster
from corral.control.plane import ControlPlane
from corral.dashboard import install as install_dashboard
from corral.model import SchedulerConfig
from corral.store import Store
from corral.workspaces.exec_bridge import router as exec_router
from corral.workspaces.proxy import install as install_proxy


def create_app(
    store: Store,
    *,
    config: SchedulerConfig | None = None,
    cluster: Cluster | None = None,
    interval: float = 1.0,
    run_scheduler: bool = True,
    data_dir: Path | None = None,
    node_timeout: float = 30.0,
    scheduler_process: bool = False,
) -> FastAPI:
    """The server application. The scheduler loop, and with a cluster the dispatcher and
    its reconciler, start and stop with it; with `scheduler_process`, the loop runs in a
    process of its own (as `corral server` and `corral up` run it)."""
    control = ControlPlane(
        store,
        config=config,
        cluster=cluster,
        interval=interval,
        run_scheduler=run_scheduler,
        data_dir=data_dir,
        node_timeout=node_timeout,
        scheduler_process=scheduler_process,
    )
    audit = AuditLog(store)
    # Read now, so that a bad CORRAL_WORKER_THREADS stops the server from starting.
    threads = worker_threads()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        limit_worker_threads(threads)
        control.start()
        try:
            yield
        finally:
            control.stop()
            audit.stop()

    app = FastAPI(
        title="corral",
        version="0.1.0",
        description="GPU cluster scheduler and workload manager",
        openapi_url=f"{API}/openapi.json",
        # Served by corral.api.docs, without a CDN.
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    # Routes the application makes itself (/metrics) as its routers make theirs.
    app.router.route_class = PrefixedRoute
    # Read by the handlers' dependencies (corral.api.deps).
    app.state.store = store
    app.state.control = control
    app.add_middleware(AllowedMethods, routes=app.router.routes)
    app.add_middleware(BodyLimit)
    app.add_middleware(RefuseNul)
    # Outermost, so that every write is audited, a refused one (413, 429) too.
    app.add_middleware(Audit, log=audit, limiter=RateLimiter.from_environment())
    install_error_handlers(app)
    for router in ROUTERS:
        serve(app, router)
    install_visibility(app, store, control.loop)
    install_api_docs(app)
    install_dashboard(app)
    serve(app, exec_router)
    install_proxy(app)
    return app
