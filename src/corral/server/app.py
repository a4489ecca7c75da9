"""The FastAPI application: the REST API under /api/v1 (`corral.server.routers`), its
errors, the telemetry and the dashboard, with the background work (`Background`) started
and stopped by its lifespan."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from corral.cluster import Cluster
from corral.model import SchedulerConfig
from corral.server.api_docs import install_api_docs
from corral.server.audit import Audit
from corral.server.background import Background
from corral.server.body_limit import BodyLimit
from corral.server.dashboard import install as install_dashboard
from corral.server.deps import API
from corral.server.errors import install_error_handlers
from corral.server.exec_bridge import router as exec_router
from corral.server.nul import RefuseNul
from corral.server.options import AllowedMethods
from corral.server.proxy import install as install_proxy
from corral.server.rate_limit import RateLimiter
from corral.server.routers import ROUTERS
from corral.server.routes import PrefixedRoute, serve
from corral.server.visibility import install_visibility
from corral.store import Store


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
    background = Background(
        store,
        config=config,
        cluster=cluster,
        interval=interval,
        run_scheduler=run_scheduler,
        data_dir=data_dir,
        node_timeout=node_timeout,
        scheduler_process=scheduler_process,
    )
    app = FastAPI(
        title="corral",
        version="0.1.0",
        description="GPU cluster scheduler and workload manager",
        openapi_url=f"{API}/openapi.json",
        # Served by corral.server.api_docs, without a CDN.
        docs_url=None,
        redoc_url=None,
        lifespan=background.lifespan,
    )
    # Routes the application makes itself (/metrics) as its routers make theirs.
    app.router.route_class = PrefixedRoute
    # Read by the handlers' dependencies (corral.server.deps).
    app.state.store = store
    app.state.background = background
    app.add_middleware(AllowedMethods, routes=app.router.routes)
    app.add_middleware(BodyLimit)
    app.add_middleware(RefuseNul)
    # Outermost, so that every write is audited, a refused one (413, 429) too.
    app.add_middleware(Audit, log=background.audit, limiter=RateLimiter.from_environment())
    install_error_handlers(app)
    for router in ROUTERS:
        serve(app, router)
    install_visibility(app, store, background.loop)
    install_api_docs(app)
    install_dashboard(app)
    serve(app, exec_router)
    install_proxy(app)
    return app
