"""What the API's handlers share, as FastAPI dependencies: the store and the background
work (kept on `app.state` by `create_app`), and who is asking (the bearer token's user)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from corral.server.background import Background
from corral.server.errors import Forbidden, Unauthorized
from corral.server.scheduler import SchedulerLoop
from corral.store import Store, UserRecord

API = "/api/v1"
bearer = HTTPBearer(auto_error=False)

# The dependencies below are async although they do no I/O of their own: FastAPI runs a
# sync dependency in a worker thread, which would cost every request a thread hop.


async def get_store(request: Request) -> Store:
    """The application's store."""
    store: Store = request.app.state.store
    return store


async def get_background(request: Request) -> Background:
    """The application's background work: the loop, submissions, the dispatcher."""
    background: Background = request.app.state.background
    return background


async def get_loop(request: Request) -> SchedulerLoop:
    """The application's scheduler loop."""
    background: Background = request.app.state.background
    return background.loop


StoreDep = Annotated[Store, Depends(get_store)]
BackgroundDep = Annotated[Background, Depends(get_background)]
LoopDep = Annotated[SchedulerLoop, Depends(get_loop)]


async def current_user(
    request: Request,
    store: StoreDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> UserRecord:
    """The user of the request's bearer token; 401 without a valid one."""
    # Async so that a token seen lately costs no trip to a worker thread; the database is
    # read in one only when the token is not remembered.
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("a bearer token is required")
    found = store.remembered(credentials.credentials)
    if found is None:
        found = await run_in_threadpool(store.authenticate, credentials.credentials)
    if found is None:
        raise Unauthorized("the token is not valid")
    # Who made the request, for its audit record (corral.server.audit).
    request.state.user = found
    return found


User = Annotated[UserRecord, Depends(current_user)]


async def admin(current: User) -> UserRecord:
    """The request's user, who must be an admin; 403 otherwise."""
    if current.role != "admin":
        raise Forbidden(f"{current.name} is a {current.role}; this needs an admin")
    return current


Admin = Annotated[UserRecord, Depends(admin)]


def may_manage(current: UserRecord, project: str) -> None:
    """Raise Forbidden unless `current` may change the work of `project`: admins may
    change any, members their own project's, viewers none."""
    if current.role == "admin":
        return
    if current.role == "member" and current.project == project:
        return
    if current.role == "viewer":
        raise Forbidden(f"{current.name} is a viewer and may only read")
    raise Forbidden(f"{current.name} is a member of {current.project}, not of {project}")
