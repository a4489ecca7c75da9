"""What the API's handlers share, as FastAPI dependencies: the store and the control
plane (kept on `app.state` by `create_app`), and who is asking (the bearer token's user)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Annotated, TypeVar

from fastapi import Depends, Query, Request
from fastapi.security import HTTPBearer

from corral.api import tokens_cache
from corral.api.errors import Forbidden, Unauthorized
from corral.control.plane import ControlPlane, Loop
from corral.model.spec import short_name, split_key, workload_key
from corral.store import Conflict, Invalid, NotFound, Store, UserRecord, WorkloadRecord

API = "/api/v1"
T = TypeVar("T")

# The dependencies below are async although they do no I/O of their own: FastAPI runs a
# sync dependency in a worker thread, which would cost every request a thread hop.


async def get_store(request: Request) -> Store:
    """The application's store."""
    store: Store = request.app.state.store
    return store


async def get_control(request: Request) -> ControlPlane:
    """The application's control plane: the loop, submissions, the dispatcher."""
    control: ControlPlane = request.app.state.control
    return control


async def get_loop(request: Request) -> Loop:
    """The application's scheduler loop."""
    control: ControlPlane = request.app.state.control
    return control.loop


def application(request: Request) -> tuple[Store, ControlPlane]:
    """The application's store and control plane, for a busy handler: each dependency
    FastAPI solves costs every request about 10 us."""
    return request.app.state.store, request.app.state.control


StoreDep = Annotated[Store, Depends(get_store)]
# The project of the workload a path names: a workload's name is unique within its
# project (a path may also name it PROJECT/NAME, with the "/" escaped as %2F).
ProjectQuery = Annotated[
    str | None,
    Query(
        max_length=63,
        description="the workload's project: needed only where its name is used in more "
        "than one project you may read",
    ),
]
ControlDep = Annotated[ControlPlane, Depends(get_control)]
LoopDep = Annotated[Loop, Depends(get_loop)]


class BearerUser(HTTPBearer):
    """The user of the request's bearer token; 401 without a valid one.

    The security scheme and the user in one dependency: FastAPI solves each dependency of
    every request in a call of its own, and every request solves this one."""

    async def __call__(self, request: Request) -> UserRecord:  # type: ignore[override]
        # Async so that a token seen lately costs no trip to a worker thread; the database
        # is read in one only when the token is not remembered.
        credentials = await super().__call__(request)
        if credentials is None:
            raise Unauthorized("a bearer token is required")
        store, _ = application(request)
        found = await tokens_cache.of(store).user(credentials.credentials)
        if found is None:
            raise Unauthorized("the token is not valid")
        # Who made the request, for its audit record (corral.api.audit).
        request.state.user = found
        return found


# Named as FastAPI names HTTPBearer's scheme, the name the OpenAPI document has always had.
current_user = BearerUser(scheme_name="HTTPBearer", auto_error=False)
User = Annotated[UserRecord, Depends(current_user)]


async def admin(current: User) -> UserRecord:
    """The request's user, who must be an admin; 403 otherwise."""
    if current.role != "admin":
        raise Forbidden(f"{current.name} is a {current.role}; this needs an admin")
    return current


Admin = Annotated[UserRecord, Depends(admin)]


def may_read(current: UserRecord, project: str) -> bool:
    """Whether `current` may read `project`'s work: admins and viewers every project's,
    members their projects' only."""
    return current.reads_all or project in current.projects


def readable_projects(current: UserRecord) -> frozenset[str] | None:
    """The projects whose work `current` may read, or None for every project."""
    return None if current.reads_all else current.projects


def visible_workload(
    store: Store, current: UserRecord, name: str, project: str | None = None
) -> WorkloadRecord:
    """The workload `name` (NAME, or PROJECT/NAME) of `project` when given, if `current`
    may read it. Another project's workload is 404 with the very answer of a workload that
    does not exist, so that names do not leak; a name that two projects `current` reads
    both use is 409, naming them (give the project)."""
    return _the_one(
        current,
        name,
        project,
        store.find_named,
        lambda r: workload_key(r.spec.project, short_name(r.name)),
    )


def _the_one(
    current: UserRecord,
    name: str,
    project: str | None,
    find: Callable[[str, Collection[str] | None], list[T]],
    key_of: Callable[[T], str],
    what: str = "workloads",
) -> T:
    """What `find` finds named `name` (NAME or PROJECT/NAME) in `project`, or in the
    projects `current` may read: 404 for none (whatever the reason), 409 for several."""
    given, short = split_key(name)
    if given is not None:
        if project is not None and project != given:
            raise Invalid("project", f"{project!r} is not the project of {name!r}")
        project = given
    if project is not None:
        found = find(short, [project]) if may_read(current, project) else []
    else:
        found = find(short, readable_projects(current))
    if not found:
        raise NotFound(f"workload {name!r} not found")
    if len(found) > 1:
        keys = ", ".join(key_of(item) for item in found)
        raise Conflict(
            f"{len(found)} {what} are named {short!r} ({keys}): give its project "
            "(PROJECT/NAME, `-p PROJECT`, or ?project=)"
        )
    return found[0]


def may_submit(current: UserRecord, project: str) -> None:
    """Raise Forbidden unless `current` may submit to `project`: admins to any, members
    to their projects, viewers to none."""
    if current.role == "admin" or project in current.projects:
        return
    if current.role == "viewer":
        raise Forbidden(f"{current.name} is a viewer and may only read")
    raise Forbidden(_outsider(current, project))


def _outsider(current: UserRecord, project: str) -> str:
    """Why a member may not act in `project`: the projects they do belong to."""
    if not current.memberships:
        return f"{current.name} is not a member of {project}"
    return f"{current.name} is a member of {', '.join(sorted(current.projects))}, not of {project}"


def may_use_secrets(current: UserRecord, project: str) -> None:
    """Raise Forbidden unless `current` may set, list and delete `project`'s secrets:
    admins and the project's members (either role in it)."""
    if current.role == "admin" or project in current.projects:
        return
    raise Forbidden(f"{current.name} may not use the secrets of {project}")


# What `may_act_on` refuses, as its refusals say it.
MANAGE = "manage it"
ENTER = "reach its tasks (exec, shell, port-forward, its URLs)"


def may_manage(current: UserRecord, record: WorkloadRecord) -> None:
    """Raise Forbidden unless `current` may stop, delete, suspend or resume the workload:
    admins any, a project's project-admins all of its workloads, its members their own."""
    may_act_on(current, record.name, record.spec.project, record.spec.user, MANAGE)


def may_act_on(current: UserRecord, name: str, project: str, owner: str, action: str) -> None:
    """Raise Forbidden unless `current` may act on the workload `name` of `project`,
    submitted by `owner`: admins on any, the project's project-admins on all of its
    workloads, its members on their own. The one rule for managing a workload and for
    entering its tasks, which run as its owner's account: a member who may not cancel a
    teammate's work may not run commands as the teammate either. `action` (MANAGE, ENTER)
    says what was refused."""
    if current.role == "admin":
        return
    if current.role == "viewer":
        raise Forbidden(f"{current.name} is a viewer and may only read")
    role = current.role_in(project)
    if role == "project-admin" or (role == "member" and owner == current.name):
        return
    if role is None:
        raise Forbidden(_outsider(current, project))
    raise Forbidden(
        f"{name} is {owner}'s: only {owner}, the project-admins of {project} and admins "
        f"may {action}"
    )


def array_key(store: Store, current: UserRecord, name: str, project: str | None) -> str:
    """The key of the array `name` (NAME or PROJECT/NAME) of `project` when given, among
    the arrays `current` may read: 404 for none (whatever the reason), 409 for several."""
    return _the_one(current, name, project, store.find_arrays, lambda key: key, "arrays")


def workload_by_key(store: Store, current: UserRecord, key: str) -> WorkloadRecord:
    """The workload whose key is `key` (as `visible_workload` found it), read again."""
    record = store.get_workload(key)
    if not may_read(current, record.spec.project):
        raise NotFound(f"workload {short_name(key)!r} not found")
    return record


def managed_workload(
    store: Store, current: UserRecord, name: str, project: str | None = None
) -> WorkloadRecord:
    """The workload `name` of `project`, which `current` must be allowed to manage: 404
    when they may not even read it (see `visible_workload`), 403 when they may read but not
    manage it."""
    record = visible_workload(store, current, name, project)
    may_manage(current, record)
    return record


def lists_workspaces(user: UserRecord, project: str) -> bool:
    """Admins and members of `project` (either role) see its workspaces listed; which of
    them a user may enter is `check_access`'s."""
    return user.role == "admin" or project in user.projects
