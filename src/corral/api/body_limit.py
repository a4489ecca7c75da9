"""The cap on request bodies: 1 MiB, declared or streamed, refused before the app reads it;
and, since the body is read here, a JSON body with a NUL or a lone surrogate in a string
is refused too (corral.api.nul). The one body that is not JSON, an upload of a code
snapshot, is passed on as it comes: its handler streams it to disk under a cap of its own
(corral.control.snapshots)."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.nul import body_problem

MAX_BODY = 1 << 20
# PUT /api/v1/projects/PROJECT/code/DIGEST (corral.api.routers.code).
STREAMED = re.compile(r"^/api/v1/projects/[^/]+/code/[^/]+$")


class BodyLimit:
    """Refuse request bodies over MAX_BODY, declared or streamed, before the app reads them.

    The body is read here first (at most MAX_BODY + 1 bytes), then handed to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            scope["method"] == "PUT" and STREAMED.match(scope["path"]) is not None
        ):
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
        problem = body_problem(body)
        if problem is not None:
            response = JSONResponse({"detail": [problem]}, status_code=422)
            await response(scope, _replay([]), send)
            return
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
