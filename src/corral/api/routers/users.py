"""Users, the projects they belong to and their tokens (an admin's), and who the caller is.

A user's `role` is global: an admin does everything, a viewer reads every project and
writes nothing, a member reads and submits in the projects they belong to. A member
belongs to one project or more, as a `member` (manages their own workloads there) or a
`project-admin` (manages all of the project's workloads).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from corral.api.deps import API, Admin, StoreDep, User
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.accounts import MembershipIn, TokenIn, TokenOut, UserIn, UserOut
from corral.store import Conflict

router = APIRouter(prefix=API, responses=ERRORS, tags=["users"], route_class=PrefixedRoute)


@router.get("/users", response_model=list[UserOut])
def list_users(_: Admin, store: StoreDep) -> list[UserOut]:
    return [UserOut.of(record) for record in store.list_users()]


@router.post("/users", response_model=TokenOut, status_code=201)
def create_user(body: UserIn, _: Admin, store: StoreDep) -> TokenOut:
    record, token = store.create_user(body.name, body.role, body.project, body.account())
    return TokenOut(user=record.name, token=token)


@router.put("/users/{name}/projects/{project}", response_model=UserOut)
def set_membership(
    name: str, project: str, body: MembershipIn, _: Admin, store: StoreDep
) -> UserOut:
    """Make a member belong to another project, or change their role in one."""
    return UserOut.of(store.set_membership(name, project, body.role))


@router.delete("/users/{name}/projects/{project}", status_code=204)
def remove_membership(name: str, project: str, _: Admin, store: StoreDep) -> Response:
    """Take a member out of a project; their workloads there stay."""
    store.remove_membership(name, project)
    return Response(status_code=204)


@router.delete("/users/{name}", status_code=204)
def delete_user(name: str, current: Admin, store: StoreDep) -> Response:
    """Delete a user; their tokens stop working at once. Their workloads stay."""
    if name == current.name:
        raise Conflict("you cannot delete yourself")
    store.delete_user(name)
    return Response(status_code=204)


@router.post("/users/{name}/tokens", response_model=TokenOut, status_code=201)
def create_token(name: str, _: Admin, store: StoreDep, body: TokenIn | None = None) -> TokenOut:
    """A new token for the user, named and expiring when the body says so."""
    body = body or TokenIn()
    expires_at = body.expires_at(time.time())
    token, token_id = store.create_token(name, body.name, expires_at)
    return TokenOut(user=name, token=token, id=token_id, name=body.name, expires_at=expires_at)


# Async, as it does no I/O (see `corral.api.routers.cluster.healthz`).
@router.get("/whoami", response_model=UserOut)
async def whoami(current: User) -> UserOut:
    return UserOut.of(current)
