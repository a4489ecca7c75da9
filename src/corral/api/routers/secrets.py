"""A project's secrets: set, listed by name, deleted by the project's members and admins.

A value goes in once (PUT) and never comes out of the API: it is stored encrypted and
decrypted only into the environment of the project's tasks that name it (`secrets` of a
workload). Viewers and other projects' members get 403: the project names are public
(queues), their secrets' names are not.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Response

from corral.api.deps import API, StoreDep, User, may_use_secrets
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.accounts import SecretIn, SecretOut
from corral.api.schemas.common import ENV_PATTERN

router = APIRouter(prefix=API, responses=ERRORS, tags=["secrets"], route_class=PrefixedRoute)
SecretPath = Path(pattern=ENV_PATTERN, max_length=63)


@router.get("/projects/{project}/secrets", response_model=list[SecretOut])
def list_secrets(project: str, current: User, store: StoreDep) -> list[SecretOut]:
    """The project's secrets, by name: names and times only, never values."""
    may_use_secrets(current, project)
    return [SecretOut(name=n, updated_at=t) for n, t in store.list_secrets(project)]


@router.put("/projects/{project}/secrets/{name}", status_code=204)
def set_secret(
    project: str, body: SecretIn, current: User, store: StoreDep, name: str = SecretPath
) -> Response:
    """Set (or replace) a secret of the project. Its value is not returned, ever."""
    may_use_secrets(current, project)
    store.set_secret(project, name, body.value)
    return Response(status_code=204)


@router.delete("/projects/{project}/secrets/{name}", status_code=204)
def delete_secret(project: str, current: User, store: StoreDep, name: str = SecretPath) -> Response:
    """Delete a secret of the project; workloads that name it start without it."""
    may_use_secrets(current, project)
    store.delete_secret(project, name)
    return Response(status_code=204)
