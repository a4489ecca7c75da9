"""A project's code snapshots (corral.control.snapshots): `corral submit --code DIR` asks
whether the project has its tree's digest (HEAD) and uploads it only when not (PUT, the
.tar.gz as the body); a workload then names it by its digest (`code`).

Only who may submit to the project may ask or upload: a viewer or another project's
member gets 403 before anything is read, and never learns whether a tree is there."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request, Response

from corral.api.deps import API, ControlDep, User, may_submit
from corral.api.errors import ERRORS
from corral.api.routes import PrefixedRoute
from corral.api.schemas.common import NAME_PATTERN
from corral.control.plane import ControlPlane
from corral.control.snapshots import CodeStore, SnapshotRefused
from corral.model.spec import DIGEST_PATTERN
from corral.store import Invalid, NotFound

router = APIRouter(prefix=API, responses=ERRORS, tags=["code"], route_class=PrefixedRoute)
ProjectPath = Path(pattern=NAME_PATTERN, max_length=63)
DigestPath = Path(pattern=DIGEST_PATTERN, description="sha256: and the hex of the .tar.gz's hash")


def code_store(control: ControlPlane) -> CodeStore:
    """The server's snapshots; 422 on a server that keeps none (it has no data directory)."""
    if control.code is None:
        raise Invalid("code", "this server keeps no code snapshots (it has no data directory)")
    return control.code


@router.head("/projects/{project}/code/{digest}", status_code=200)
def has_code(
    current: User, control: ControlDep, project: str = ProjectPath, digest: str = DigestPath
) -> Response:
    """Whether the project has the code snapshot: 200, or 404."""
    may_submit(current, project)
    if not code_store(control).has(project, digest):
        raise NotFound(f"project {project} has no code snapshot {digest}")
    return Response(status_code=200)


@router.put(
    "/projects/{project}/code/{digest}",
    status_code=201,
    responses={200: {"description": "the project had it already"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def put_code(
    request: Request,
    current: User,
    control: ControlDep,
    project: str = ProjectPath,
    digest: str = DigestPath,
) -> Response:
    """Upload a code snapshot of the project: a gzipped tar of its files, named by the
    sha256 of those bytes. 201 when it is new, 200 when the project had it; 422 when the
    body is not what its digest says or not a snapshot a node may unpack."""
    may_submit(current, project)
    store = code_store(control)
    try:
        made = await store.put(project, digest, request.stream())
    except SnapshotRefused as refused:
        raise Invalid("body", str(refused)) from None
    return Response(status_code=201 if made else 200)
