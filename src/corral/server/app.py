"""The FastAPI application: the REST API under /api/v1, auth, errors and the scheduler loop."""

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.cluster import Cluster
from corral.engine.state import natural_key
from corral.model import Decisions, SchedulerConfig
from corral.server.dashboard import install as install_dashboard
from corral.server.dispatch import Dispatcher
from corral.server.rules import rules_out, rules_payload
from corral.server.scheduler import SchedulerLoop
from corral.server.schemas import (
    Amounts,
    ClusterOut,
    DeviceOut,
    ErrorOut,
    EventOut,
    HolderOut,
    LogOut,
    NodeIn,
    NodeOut,
    PlacementOut,
    QueueIn,
    QueueOut,
    QueuePatch,
    TaskGroupOut,
    TaskOnNodeOut,
    TokenOut,
    TopologyOut,
    UserIn,
    UserOut,
    WeightsOut,
    WhyOut,
    WorkloadBatchIn,
    WorkloadIn,
    WorkloadOut,
)
from corral.server.submissions import Submissions
from corral.server.visibility import install_visibility
from corral.store import (
    STATUSES,
    Conflict,
    Invalid,
    NodeRecord,
    NotFound,
    QueueRecord,
    Store,
    UserRecord,
    WorkloadRecord,
)
from corral.store.records import Release

log = logging.getLogger("corral.server")
MAX_BODY = 1 << 20
API = "/api/v1"
# Draws of a server-made workload name before a clash is reported (each clashes with
# odds of about n / 16.7 million for n workloads in the project).
NAME_ATTEMPTS = 5
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "the body is not valid JSON"},
    401: {"model": ErrorOut, "description": "no token, or a token that is not valid"},
    403: {"model": ErrorOut, "description": "the token's role does not allow this"},
    404: {"model": ErrorOut, "description": "no such object"},
    409: {"model": ErrorOut, "description": "conflicts with the current state"},
    413: {"model": ErrorOut, "description": "body larger than 1 MiB"},
}


class BodyLimit:
    """Refuse request bodies over MAX_BODY, declared or streamed, before the app reads them.

    The body is read here first (at most MAX_BODY + 1 bytes), then handed to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > MAX_BODY:
                await _too_large(send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away; let the app see it.
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                await _too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        await self.app(
            scope,
            _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
            send,
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A `receive` that gives `messages`, then waits on `then` (for the disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _too_large(send: Send) -> None:
    response = JSONResponse({"detail": "request body is larger than 1 MiB"}, status_code=413)
    await response({"type": "http"}, _replay([]), send)


def create_app(
    store: Store,
    *,
    config: SchedulerConfig | None = None,
    cluster: Cluster | None = None,
    interval: float = 1.0,
    run_scheduler: bool = True,
    data_dir: Path | None = None,
    node_timeout: float = 30.0,
) -> FastAPI:
    """The server application. The scheduler loop, and with a cluster the dispatcher and
    its reconciler, start and stop with it."""
    loop = SchedulerLoop(store, config, interval)
    submissions = Submissions(store, loop.trigger)
    dispatcher: Dispatcher | None = None
    if cluster is not None:
        if data_dir is None:
            raise ValueError("a cluster needs the data directory for logs and checkpoints")
        dispatcher = Dispatcher(store, cluster, data_dir, loop.trigger, node_timeout)
        active = dispatcher

        def changed(decisions: Decisions, releases: list[Release]) -> None:
            active.release(releases)
            active.started(set(decisions.bindings))

        loop.on_changes = changed

    def release(record: WorkloadRecord, why: str) -> None:
        if dispatcher is not None and record.placements:
            dispatcher.release(
                [
                    Release(
                        record.name,
                        node,
                        tuple(p.task for p in record.placements if p.node == node),
                        why,
                    )
                    for node in sorted({p.node for p in record.placements})
                ],
                record.spec.grace_period,
            )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if dispatcher is not None and cluster is not None:
            cluster.connect(dispatcher)
            # Adopt what survived a restart, and start what was decided but not started.
            dispatcher.reconcile()
            dispatcher.start_monitor()
        if run_scheduler:
            loop.start()
            loop.trigger()
        try:
            yield
        finally:
            submissions.stop()
            loop.stop()
            if dispatcher is not None:
                dispatcher.stop_monitor()
            if cluster is not None:
                cluster.close()

    app = FastAPI(
        title="corral",
        version="0.1.0",
        description="GPU cluster scheduler and workload manager",
        openapi_url=f"{API}/openapi.json",
        docs_url=f"{API}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.loop = loop
    app.add_middleware(BodyLimit)
    _install_error_handlers(app)

    bearer = HTTPBearer(auto_error=False)

    async def user(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> UserRecord:
        # Async so that a token seen lately costs no trip to a worker thread; the
        # database is read in one only when the token is not remembered.
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise _Unauthorized("a bearer token is required")
        found = store.remembered(credentials.credentials)
        if found is None:
            found = await run_in_threadpool(store.authenticate, credentials.credentials)
        if found is None:
            raise _Unauthorized("the token is not valid")
        return found

    User = Annotated[UserRecord, Depends(user)]

    async def admin(current: User) -> UserRecord:
        if current.role != "admin":
            raise _Forbidden(f"{current.name} is a {current.role}; this needs an admin")
        return current

    Admin = Annotated[UserRecord, Depends(admin)]

    def may_manage(current: UserRecord, project: str) -> None:
        if current.role == "admin":
            return
        if current.role == "member" and current.project == project:
            return
        if current.role == "viewer":
            raise _Forbidden(f"{current.name} is a viewer and may only read")
        raise _Forbidden(f"{current.name} is a member of {current.project}, not of {project}")

    router = APIRouter(prefix=API, responses=ERRORS)

    # -- queues ------------------------------------------------------------------------

    def queue_out(record: QueueRecord) -> QueueOut:
        queue = record.queue
        status = loop.last.queues.get(queue.name) if loop.last else None
        return QueueOut(
            name=queue.name,
            parent=queue.parent,
            department=record.department,
            children=list(record.children),
            deserved=Amounts.of(queue.deserved),
            limit=Amounts.of(queue.limit),
            over_quota_weight=WeightsOut.of(queue.over_quota_weight),
            priority=queue.priority,
            fair_share=Amounts.of(status.fair_share) if status else None,
            allocated=Amounts.of(status.allocated) if status else None,
            requested=Amounts.of(status.requested) if status else None,
            pending_gpu=(max(status.requested.gpu - status.allocated.gpu, 0.0) if status else None),
            created_at=record.created_at,
            rules=rules_out(store, queue.name),
        )

    @router.get("/queues", response_model=list[QueueOut], tags=["queues"])
    def list_queues(_: User) -> list[QueueOut]:
        return [queue_out(record) for record in store.list_queues()]

    @router.post("/queues", response_model=QueueOut, status_code=201, tags=["queues"])
    def create_queue(body: QueueIn, _: Admin) -> QueueOut:
        record = store.create_queue(body.to_model(), rules_payload(body))
        loop.trigger()
        return queue_out(record)

    @router.get("/queues/{name}", response_model=QueueOut, tags=["queues"])
    def get_queue(name: str, _: User) -> QueueOut:
        return queue_out(store.get_queue(name))

    @router.patch("/queues/{name}", response_model=QueueOut, tags=["queues"])
    def update_queue(name: str, body: QueuePatch, _: Admin) -> QueueOut:
        rules = (rules_payload(body) or {}) if "rules" in body.model_fields_set else None
        record = store.update_queue(name, body.changes(), rules)
        loop.trigger()
        return queue_out(record)

    @router.delete("/queues/{name}", status_code=204, tags=["queues"])
    def delete_queue(name: str, _: Admin) -> Response:
        store.delete_queue(name)
        loop.trigger()
        return Response(status_code=204)

    # -- workloads ---------------------------------------------------------------------

    @router.get("/workloads", response_model=list[WorkloadOut], tags=["workloads"])
    def list_workloads(
        _: User,
        project: str | None = None,
        status: Annotated[str | None, Query(pattern="^(" + "|".join(STATUSES) + ")$")] = None,
        user: str | None = None,
    ) -> list[WorkloadOut]:
        return [workload_out(r) for r in store.list_workloads(project, status, user)]

    @router.post("/workloads", response_model=WorkloadOut, status_code=201, tags=["workloads"])
    async def submit(body: WorkloadIn, current: User) -> WorkloadOut:
        # Async, unlike the other handlers: the writer thread commits submissions in
        # batches (corral.server.submissions) and wakes the scheduler.
        may_manage(current, body.project)
        if body.name is not None:
            record = await submissions.submit(body.to_spec(body.name, current.name))
        else:
            record = await submit_named(body, current.name)
        return workload_out(record)

    async def submit_named(body: WorkloadIn, user: str) -> WorkloadRecord:
        """Name the workload project-XXXXXX (24 random bits); on the rare clash with an
        existing name, draw again."""
        for _ in range(NAME_ATTEMPTS - 1):
            try:
                return await submissions.submit(
                    body.to_spec(f"{body.project}-{secrets.token_hex(3)}", user)
                )
            except Conflict:
                continue
        return await submissions.submit(
            body.to_spec(f"{body.project}-{secrets.token_hex(3)}", user)
        )

    @router.post(
        "/workloads/batch",
        response_model=list[WorkloadOut],
        status_code=201,
        tags=["workloads"],
    )
    def submit_batch(body: WorkloadBatchIn, current: User) -> list[WorkloadOut]:
        """Submit several workloads in one transaction: all are stored, or none (the
        first that fails a check is named by its place, `workloads[i]`)."""
        for item in body.workloads:
            may_manage(current, item.project)
        for attempt in range(NAME_ATTEMPTS):
            specs = [
                item.to_spec(item.name or f"{item.project}-{secrets.token_hex(3)}", current.name)
                for item in body.workloads
            ]
            try:
                records = store.submit_all(specs)
                break
            except Conflict as clash:
                # A clash of names the client chose is final; of names drawn here, draw again.
                chosen = [item.name for item in body.workloads if item.name]
                if attempt == NAME_ATTEMPTS - 1 or any(repr(n) in str(clash) for n in chosen):
                    raise
        loop.trigger()
        return [workload_out(record) for record in records]

    @router.get("/workloads/{name}", response_model=WorkloadOut, tags=["workloads"])
    def get_workload(name: str, _: User) -> WorkloadOut:
        return workload_out(store.get_workload(name))

    @router.delete("/workloads/{name}", status_code=204, tags=["workloads"])
    def delete_workload(name: str, current: User) -> Response:
        may_manage(current, store.get_workload(name).spec.project)
        release(store.delete_workload(name, current.name), f"deleted by {current.name}")
        loop.trigger()
        return Response(status_code=204)

    @router.post("/workloads/{name}/suspend", response_model=WorkloadOut, tags=["workloads"])
    def suspend(name: str, current: User) -> WorkloadOut:
        may_manage(current, store.get_workload(name).spec.project)
        release(store.suspend(name, current.name), f"suspended by {current.name}")
        loop.trigger()
        return workload_out(store.get_workload(name))

    @router.post("/workloads/{name}/resume", response_model=WorkloadOut, tags=["workloads"])
    def resume(name: str, current: User) -> WorkloadOut:
        may_manage(current, store.get_workload(name).spec.project)
        record = store.resume(name, current.name)
        loop.trigger()
        return workload_out(record)

    @router.get("/workloads/{name}/events", response_model=list[EventOut], tags=["workloads"])
    def workload_events(name: str, _: User) -> list[EventOut]:
        store.get_workload(name)
        return [EventOut(**vars_of(event)) for event in store.events(workload=name)]

    @router.get("/workloads/{name}/logs", response_model=LogOut, tags=["workloads"])
    def logs(
        name: str,
        _: User,
        task: Annotated[int, Query(ge=0, le=4095)] = 0,
        offset: Annotated[int, Query(ge=0)] = 0,
        tail: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> LogOut:
        store.get_workload(name)
        return read_log(data_dir, name, task, offset, tail)

    @router.get("/workloads/{name}/why", response_model=WhyOut, tags=["workloads"])
    def why(name: str, _: User) -> WhyOut:
        return explain(store, name)

    # -- nodes -------------------------------------------------------------------------

    @router.get("/nodes", response_model=list[NodeOut], tags=["nodes"])
    def list_nodes(_: User) -> list[NodeOut]:
        return [node_out(record) for record in store.list_nodes()]

    @router.post("/nodes", response_model=NodeOut, status_code=201, tags=["nodes"])
    def register_node(body: NodeIn, _: Admin) -> NodeOut:
        record = store.register_node(body.to_spec())
        loop.trigger()
        return node_out(record)

    @router.get("/nodes/{name}", response_model=NodeOut, tags=["nodes"])
    def get_node(name: str, _: User) -> NodeOut:
        return node_out(store.get_node(name))

    @router.delete("/nodes/{name}", status_code=204, tags=["nodes"])
    def remove_node(name: str, _: Admin) -> Response:
        store.remove_node(name)
        loop.trigger()
        return Response(status_code=204)

    @router.post("/nodes/{name}/cordon", response_model=NodeOut, tags=["nodes"])
    def cordon(name: str, _: Admin) -> NodeOut:
        record = store.set_schedulable(name, False)
        loop.trigger()
        return node_out(record)

    @router.post("/nodes/{name}/uncordon", response_model=NodeOut, tags=["nodes"])
    def uncordon(name: str, _: Admin) -> NodeOut:
        record = store.set_schedulable(name, True)
        loop.trigger()
        return node_out(record)

    # -- cluster, users ----------------------------------------------------------------

    @router.get("/cluster", response_model=ClusterOut, tags=["cluster"])
    def cluster_summary(_: User) -> ClusterOut:
        counts = store.counts()
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

    @router.get("/users", response_model=list[UserOut], tags=["users"])
    def list_users(_: Admin) -> list[UserOut]:
        return [UserOut(name=u.name, role=u.role, project=u.project) for u in store.list_users()]

    @router.post("/users", response_model=TokenOut, status_code=201, tags=["users"])
    def create_user(body: UserIn, _: Admin) -> TokenOut:
        record, token = store.create_user(body.name, body.role, body.project)
        return TokenOut(user=record.name, token=token)

    @router.post("/users/{name}/tokens", response_model=TokenOut, status_code=201, tags=["users"])
    def create_token(name: str, _: Admin) -> TokenOut:
        return TokenOut(user=name, token=store.create_token(name))

    @router.get("/whoami", response_model=UserOut, tags=["users"])
    def whoami(current: User) -> UserOut:
        return UserOut(name=current.name, role=current.role, project=current.project)

    app.include_router(router)

    @app.get("/healthz", tags=["cluster"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    install_visibility(app, store, loop, dispatcher)
    install_dashboard(app)
    return app


# -- responses ----------------------------------------------------------------------------


def vars_of(record: Any) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__slots__}


def workload_out(record: WorkloadRecord) -> WorkloadOut:
    spec = record.spec
    return WorkloadOut(
        name=spec.name,
        project=spec.project,
        user=spec.user,
        status=record.status,  # type: ignore[arg-type]
        reason=record.reason,
        priority=spec.priority,
        preemptible=spec.preemptible,
        tasks=[TaskGroupOut(**vars_of(group)) for group in spec.task_groups],
        min_available=spec.min_available,
        node_selector={key: list(values) for key, values in spec.node_selector.items()},
        topology=(
            TopologyOut(key=spec.topology.key, required=spec.topology.required)
            if spec.topology
            else None
        ),
        command=list(spec.command),
        env=dict(spec.env),
        workdir=spec.workdir,
        max_runtime=spec.max_runtime,
        backoff_limit=spec.backoff_limit,
        grace_period=spec.grace_period,
        attempts=record.attempts,
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        placements=[PlacementOut.of(placement) for placement in record.placements],
    )


def node_out(record: NodeRecord) -> NodeOut:
    node = record.node
    return NodeOut(
        name=node.name,
        gpus=node.gpus,
        gpu_model=node.gpu_model,
        gpu_memory=node.gpu_memory,
        cpu=node.cpu,
        memory=node.memory,
        labels=dict(node.labels),
        schedulable=node.schedulable,
        state=record.state,
        virtual=record.virtual,
        devices=[DeviceOut(**vars_of(device)) for device in record.devices],
        tasks=[
            TaskOnNodeOut(
                workload=t.workload,
                project=t.project,
                task=t.task,
                devices=list(t.devices),
                gpu=t.gpu,
            )
            for t in record.tasks
        ],
        allocated_gpu=round(sum(task.gpu for task in record.tasks), 6),
        registered_at=record.registered_at,
        heartbeat_at=record.heartbeat_at,
    )


LOG_CHUNK = 1 << 20


def read_log(data_dir: Path | None, name: str, task: int, offset: int, tail: int | None) -> LogOut:
    """A task's output from `offset` (at most 1 MiB of it), or its last `tail` lines."""
    folder = data_dir / "logs" / name if data_dir is not None else None
    tasks = sorted(
        int(path.stem.split("-", 1)[1])
        for path in (folder.glob("task-*.log") if folder and folder.is_dir() else [])
        if path.stem.split("-", 1)[1].isdigit()
    )
    path = folder / f"task-{task}.log" if folder else None
    if path is None or not path.is_file():
        return LogOut(workload=name, task=task, text="", offset=offset, tasks=tasks)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if tail is not None:
            start = max(size - LOG_CHUNK, 0)
            handle.seek(start)
            lines = handle.read().splitlines(keepends=True)
            data = b"".join(lines[-tail:])
            end = size
        else:
            start = min(offset, size)
            handle.seek(start)
            data = handle.read(LOG_CHUNK)
            end = start + len(data)
    return LogOut(
        workload=name, task=task, text=data.decode("utf-8", "replace"), offset=end, tasks=tasks
    )


def explain(store: Store, name: str) -> WhyOut:
    """Why a workload waits: the engine's reason, its place in its project, and who holds
    the GPUs it could use."""
    record = store.get_workload(name)
    spec = record.spec
    position = None
    ahead: list[str] = []
    if record.status == "pending":
        pending = store.list_workloads(project=spec.project, status="pending")
        ordered = sorted(pending, key=lambda r: (-r.spec.priority, r.id))
        names = [r.name for r in ordered]
        position = names.index(name) + 1
        ahead = names[: position - 1]
    holders = []
    selector = spec.node_selector
    running = {r.name: r for r in store.list_workloads(status="running")}
    for node in sorted(store.list_nodes(), key=lambda n: natural_key(n.node.name)):
        if any(node.node.label(key) not in values for key, values in selector.items()):
            continue
        for task in node.tasks:
            holder = running.get(task.workload)
            if holder is None or holder.name == name:
                continue
            holders.append(
                HolderOut(
                    workload=task.workload,
                    project=task.project,
                    priority=holder.spec.priority,
                    preemptible=holder.spec.preemptible,
                    node=node.node.name,
                    gpu=task.gpu,
                )
            )
    return WhyOut(
        workload=name,
        status=record.status,
        reason=record.reason,
        position=position,
        ahead=ahead,
        holders=holders,
    )


# -- errors -------------------------------------------------------------------------------


def flatten_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic's errors with the names of union alternatives taken out of `loc`.

    A field that accepts several shapes ("deserved": a number or a map) gets one error per
    shape, each under a tag like "constrained-float". A client wants the field's path and
    what was wrong with the shape it sent: the alternatives of that shape are kept, and
    only when none matches are all of them listed."""
    groups: dict[tuple[Any, ...], list[tuple[str | None, Any]]] = {}
    for item in errors:
        tags = [part for part in item["loc"] if _is_tag(part)]
        loc = tuple(part for part in item["loc"] if not _is_tag(part))
        groups.setdefault(loc, []).append((tags[-1] if tags else None, item))
    flat = []
    for loc, items in groups.items():
        sent = _shape(items[0][1].get("input"))
        meant = [item for tag, item in items if tag is None or _tag_shape(tag) == sent]
        chosen = meant or [item for _, item in items]
        messages = list(dict.fromkeys(item["msg"] for item in chosen))
        flat.append({"loc": list(loc), "msg": "; or ".join(messages), "type": chosen[0]["type"]})
    return flat


def _is_tag(part: Any) -> bool:
    if not isinstance(part, str):
        return False
    return (
        part in {"int", "str", "float", "bool", "dict", "list"}
        or any(c in part for c in "-[")
        or part[:1].isupper()
    )


def _shape(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "map" if isinstance(value, dict) else "other"


def _tag_shape(tag: str) -> str:
    if tag == "str" or tag.startswith("constrained-str"):
        return "str"
    if tag == "bool":
        return "bool"
    if tag in {"int", "float"} or tag.startswith(("constrained-int", "constrained-float")):
        return "number"
    if tag.startswith("list"):
        return "list"
    return "map"


class _Unauthorized(Exception):
    pass


class _Forbidden(Exception):
    pass


def _install_error_handlers(app: FastAPI) -> None:
    def handler(
        status: int, headers: dict[str, str] | None = None
    ) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def respond(_request: Request, error: Exception) -> JSONResponse:
            return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)

        return respond

    app.add_exception_handler(NotFound, handler(404))
    app.add_exception_handler(Conflict, handler(409))
    app.add_exception_handler(_Unauthorized, handler(401, {"WWW-Authenticate": "Bearer"}))
    app.add_exception_handler(_Forbidden, handler(403))

    async def invalid(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, Invalid)
        loc = ["body", *error.at, error.field]
        detail = [{"loc": loc, "msg": error.message, "type": "value_error"}]
        return JSONResponse({"detail": detail}, status_code=422)

    app.add_exception_handler(Invalid, invalid)

    async def validation(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return JSONResponse({"detail": flatten_errors(error.errors())}, status_code=422)

    app.add_exception_handler(RequestValidationError, validation)

    async def http_error(_request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        return JSONResponse(
            {"detail": str(error.detail)}, status_code=error.status_code, headers=error.headers
        )

    app.add_exception_handler(StarletteHTTPException, http_error)

    async def unexpected(_request: Request, error: Exception) -> JSONResponse:
        # The traceback goes to the server's log, never to the client.
        log.error("unhandled error", exc_info=error)
        return JSONResponse({"detail": "internal error; see the server log"}, status_code=500)

    app.add_exception_handler(Exception, unexpected)
