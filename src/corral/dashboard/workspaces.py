"""The dashboard's stop and start buttons of the workspaces page: a form post with the
login cookie, sent on to the API's suspend and resume as the logged-in user."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from corral.api.routes import PrefixedRoute
from corral.dashboard.apiclient import ApiClient
from corral.dashboard.routes import COOKIE, same_origin

router = APIRouter(include_in_schema=False, route_class=PrefixedRoute)
ACTIONS = {"stop": "suspend", "start": "resume"}


@router.post("/workspaces/{name}/{action}")
async def act(request: Request, name: str, action: str) -> Response:
    """Stop (suspend) or start (resume) a workspace, then back to the list."""
    if action not in ACTIONS:
        return JSONResponse({"detail": f"no action {action!r}: stop or start"}, status_code=404)
    if not same_origin(request):
        return JSONResponse({"detail": "cross-site request refused"}, status_code=403)
    token = request.cookies.get(COOKIE)
    if not token:
        return RedirectResponse("/login?next=%2Fworkspaces", status_code=303)
    async with ApiClient(request.app, token) as api:
        answer = await api.post(f"/workloads/{quote(name, safe='')}/{ACTIONS[action]}")
    if answer.status_code != 200:
        try:
            detail = answer.json().get("detail", answer.text)
        except ValueError:
            detail = answer.text
        return JSONResponse({"detail": detail}, status_code=answer.status_code)
    return RedirectResponse("/workspaces", status_code=303)
