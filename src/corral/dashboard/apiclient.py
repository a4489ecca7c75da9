"""The dashboard's way to the REST API: in-process requests that carry the user's token, so
that pages see exactly what the API shows that user, with the same checks."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

import httpx
from starlette.types import ASGIApp

API = "/api/v1"


class ApiError(Exception):
    """The API refused or failed a request the page needs."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class ApiClient:
    """GET requests to the API of `app`, as the holder of `token`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url=f"http://corral{API}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._client.aclose()

    async def raw(self, path: str, params: Any = None) -> httpx.Response:
        return await self._client.get(path, params=params)

    async def post(self, path: str) -> httpx.Response:
        """A POST without a body (suspend, resume)."""
        return await self._client.post(path)

    async def get(self, path: str, **params: Any) -> Any:
        """The JSON of a GET; ApiError when the API answers anything but 200."""
        response = await self.raw(path, {k: v for k, v in params.items() if v not in (None, "")})
        if response.status_code != 200:
            raise ApiError(response.status_code, _detail(response))
        return response.json()

    async def optional(self, path: str, **params: Any) -> Any:
        """Like `get`, but None when the API has no such resource (404)."""
        try:
            return await self.get(path, **params)
        except ApiError as error:
            if error.status == 404:
                return None
            raise


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:200]
    return detail if isinstance(detail, str) else str(detail)


async def together(*calls: Coroutine[Any, Any, Any]) -> list[Any]:
    """Run the calls at once; on the first failure cancel the rest and raise that failure."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]
