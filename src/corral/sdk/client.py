"""A typed client for the corral REST API (/api/v1), for the CLI and for users' own code.

    from corral.sdk import Client

    with Client("http://127.0.0.1:8700", token) as corral:
        job = corral.submit({"project": "vision", "tasks": [{"gpu": 1}], "command": ["nvidia-smi"]})
        print(corral.why(job["name"])["reason"])

Every method is one request. Answers are the API's JSON, typed by `corral.sdk.types`.
A refused request raises `ApiError` (its status and the server's message, with a field
path for each invalid field); a server that cannot be reached raises `ServerUnreachable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import httpx

from corral.sdk.types import (
    AuditOut,
    ClusterOut,
    EventOut,
    HistoryOut,
    LogOut,
    NodeOut,
    QueueOut,
    SecretOut,
    StartOut,
    TokenInfoOut,
    TokenOut,
    UsageRowOut,
    UserOut,
    WhyOut,
    WorkloadOut,
    WorkloadStatus,
    WorkspaceOut,
)

API_PREFIX = "/api/v1"


class CorralError(Exception):
    """Base of the errors the client raises."""


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One invalid field of a request: `tasks[0].gpu` and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ApiError(CorralError):
    """The server refused a request. `message` is its explanation on one line; for a 422,
    `problems` holds each invalid field and `message` joins them."""

    def __init__(self, status: int, message: str, problems: Sequence[FieldProblem] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = tuple(problems)


class ServerUnreachable(CorralError):
    """No answer from the server: it is down, the URL is wrong, or it was too slow."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach the corral server at {server}: {reason}")
        self.server = server
        self.reason = reason


def server_url(url: str) -> str:
    """The server's base URL as users give it: no trailing slash, no /api/v1 suffix.

    Raises ValueError when it is not an http(s) URL.
    """
    base = url.strip().rstrip("/").removesuffix(API_PREFIX)
    parsed = httpx.URL(base)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return base


class Client:
    """One server and one token; methods per endpoint. Use it as a context manager, or
    call `close()`, to release its connections."""

    def __init__(self, server: str, token: str, *, timeout: float = 30.0) -> None:
        self.server = server_url(server)
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.server + API_PREFIX,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- users ---------------------------------------------------------------------------

    def whoami(self) -> UserOut:
        """The user the token belongs to: name, role and (for a member) project."""
        return cast(UserOut, self._request("GET", "/whoami"))

    def list_users(self) -> list[UserOut]:
        """Every user (admins only)."""
        return cast(list[UserOut], self._request("GET", "/users"))

    def create_user(
        self,
        name: str,
        role: str = "member",
        project: str | None = None,
        unix_user: str | None = None,
    ) -> TokenOut:
        """Create a user and their first token, which is shown only in this answer.
        `unix_user`: the Unix account their tasks run as on a root agent (default: `name`)."""
        body = {"name": name, "role": role, "project": project}
        if unix_user is not None:
            body["unix_user"] = unix_user
        return cast(TokenOut, self._request("POST", "/users", body))

    def set_membership(self, user: str, project: str, role: str = "member") -> UserOut:
        """Make a member belong to `project` with `role` (member or project-admin)."""
        path = f"/users/{_segment(user)}/projects/{_segment(project)}"
        return cast(UserOut, self._request("PUT", path, {"role": role}))

    def remove_membership(self, user: str, project: str) -> None:
        """Take a member out of `project`."""
        self._request("DELETE", f"/users/{_segment(user)}/projects/{_segment(project)}")

    def create_token(
        self, user: str, name: str | None = None, expires_in: str | float | None = None
    ) -> TokenOut:
        """A new token for an existing user, named and expiring after `expires_in`
        ("30d", seconds) when given; earlier tokens stay valid."""
        body = {"name": name, "expires_in": expires_in}
        return cast(TokenOut, self._request("POST", f"/users/{_segment(user)}/tokens", body))

    def delete_user(self, name: str) -> None:
        """Delete a user; their tokens stop working at once."""
        self._request("DELETE", f"/users/{_segment(name)}")

    def list_tokens(self, user: str | None = None) -> list[TokenInfoOut]:
        """Tokens with names, expiry and last use (never their values): of `user`, or
        every one an admin may see; one's own for others."""
        params = {"user": user} if user is not None else None
        return cast(list[TokenInfoOut], self._request("GET", "/tokens", params=params))

    def revoke_token(self, token_id: int) -> None:
        """Revoke a token by its id; it stops working at once."""
        self._request("DELETE", f"/tokens/{int(token_id)}")

    # -- audit ---------------------------------------------------------------------------

    def audit(self, **filters: str | float | int | None) -> list[AuditOut]:
        """Write requests, oldest first (admins only). Filters: user, action, since,
        until (seconds since the epoch), outcome ("403", "4xx"), limit."""
        return cast(list[AuditOut], self._request("GET", "/audit", params=_params(filters)))

    def audit_export(self, **filters: str | float | int | None) -> str:
        """The same records as `audit`, as JSON lines."""
        return cast(str, self._request("GET", "/audit/export", params=_params(filters), text=True))

    # -- project secrets -------------------------------------------------------------------

    def set_secret(self, project: str, name: str, value: str) -> None:
        """Set (or replace) a secret of the project; the value is never returned."""
        path = f"/projects/{_segment(project)}/secrets/{_segment(name)}"
        self._request("PUT", path, {"value": value})

    def list_secrets(self, project: str) -> list[SecretOut]:
        """The project's secrets: names and times, never values."""
        path = f"/projects/{_segment(project)}/secrets"
        return cast(list[SecretOut], self._request("GET", path))

    def delete_secret(self, project: str, name: str) -> None:
        """Delete a secret of the project."""
        self._request("DELETE", f"/projects/{_segment(project)}/secrets/{_segment(name)}")

    # -- code snapshots ----------------------------------------------------------------

    def upload_code(self, project: str, digest: str, data: bytes) -> int:
        """Make the snapshot `digest` (corral.sdk.snapshot.pack's .tar.gz, `data`) the
        project's, sending it only when the server lacks it: the bytes sent (0 when the
        project had it)."""
        path = f"/projects/{_segment(project)}/code/{_segment(digest)}"
        try:
            self._request("HEAD", path)
            return 0
        except ApiError as error:
            if error.status != 404:
                raise
        # An upload of up to the cap is given time beyond a request's usual.
        self._request(
            "PUT",
            path,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=max(self.timeout, 300.0),
        )
        return len(data)

    # -- queues (projects and departments) -----------------------------------------------

    def list_queues(self) -> list[QueueOut]:
        return cast(list[QueueOut], self._request("GET", "/queues"))

    def get_queue(self, name: str) -> QueueOut:
        return cast(QueueOut, self._request("GET", f"/queues/{_segment(name)}"))

    def create_queue(self, queue: Mapping[str, Any]) -> QueueOut:
        """Create a queue from the API's QueueIn fields (name, parent, deserved, limit,
        over_quota_weight, priority)."""
        return cast(QueueOut, self._request("POST", "/queues", queue))

    def update_queue(self, name: str, changes: Mapping[str, Any]) -> QueueOut:
        """Change the given fields only; a quota given replaces that quota whole, and
        `limit: None` removes the limit."""
        return cast(QueueOut, self._request("PATCH", f"/queues/{_segment(name)}", changes))

    def delete_queue(self, name: str) -> None:
        self._request("DELETE", f"/queues/{_segment(name)}")

    # -- workloads -----------------------------------------------------------------------

    def list_workloads(
        self,
        project: str | None = None,
        status: WorkloadStatus | None = None,
        user: str | None = None,
        array: str | None = None,
    ) -> list[WorkloadOut]:
        """Workloads, oldest first, optionally only one project's, status's, user's or
        array's."""
        params = {
            key: value
            for key, value in (
                ("project", project),
                ("status", status),
                ("user", user),
                ("array", array),
            )
            if value is not None
        }
        return cast(list[WorkloadOut], self._request("GET", "/workloads", params=params))

    def submit(
        self, workload: Mapping[str, Any], idempotency_key: str | None = None
    ) -> WorkloadOut:
        """Submit a workload from the API's WorkloadIn fields (project, tasks, command, ...);
        the server names it when `name` is left out. Resent with the same
        `idempotency_key` (within 24 h), it gives the first answer instead of a second
        workload."""
        headers = _idempotency(idempotency_key)
        return cast(WorkloadOut, self._request("POST", "/workloads", workload, headers=headers))

    def submit_all(
        self, workloads: Sequence[Mapping[str, Any]], idempotency_key: str | None = None
    ) -> list[WorkloadOut]:
        """Submit several workloads together: all of them are stored, or none. A 422
        names the bad field by its place (`workloads[1].tasks[0].gpu`). With
        `idempotency_key`, as `submit`."""
        body = {"workloads": list(workloads)}
        headers = _idempotency(idempotency_key)
        return cast(
            list[WorkloadOut], self._request("POST", "/workloads/batch", body, headers=headers)
        )

    def get_workload(self, name: str) -> WorkloadOut:
        """The workload NAME, or PROJECT/NAME (a name is unique within its project)."""
        path, params = _workload(name)
        return cast(WorkloadOut, self._request("GET", path, params=params))

    def wait_workload(self, name: str, until: str, wait: float = 30.0) -> WorkloadOut:
        """The workload as soon as its status is `until` or it has ended, else after `wait`
        seconds (at most 60): its status tells which. The server answers when the change
        happens, so this is quicker and lighter than reading the workload again and again."""
        path, params = _workload(name)
        params.update(until=until, wait=f"{wait:g}")
        return cast(
            WorkloadOut,
            self._request(
                "GET",
                path,
                params=params,
                # The wait, and the usual time for an answer after it.
                timeout=wait + self.timeout,
            ),
        )

    def list_workspaces(self, project: str | None = None) -> list[WorkspaceOut]:
        """Workloads that declare ports, of the projects the caller may enter."""
        params = {"project": project} if project else None
        return cast(list[WorkspaceOut], self._request("GET", "/workspaces", params=params))

    def get_workspace(self, name: str) -> WorkspaceOut:
        """One workspace: status, node, ports (path, ready) and idle time."""
        path, params = _workload(name, "/workspaces")
        return cast(WorkspaceOut, self._request("GET", path, params=params))

    def delete_workload(self, name: str) -> None:
        """Delete a workload; its tasks are stopped if they run."""
        path, params = _workload(name)
        self._request("DELETE", path, params=params)

    def suspend(self, name: str) -> WorkloadOut:
        """Take a pending or running workload out of scheduling; it gives its GPUs back."""
        path, params = _workload(name, then="/suspend")
        return cast(WorkloadOut, self._request("POST", path, params=params))

    def resume(self, name: str) -> WorkloadOut:
        """Put a suspended workload back in its queue."""
        path, params = _workload(name, then="/resume")
        return cast(WorkloadOut, self._request("POST", path, params=params))

    def cancel(self, name: str) -> list[WorkloadOut]:
        """Cancel a workload, or every unfinished member of the array `name`; each keeps
        its record as `cancelled`. Returns what was cancelled."""
        path, params = _workload(name, then="/cancel")
        return cast(list[WorkloadOut], self._request("POST", path, params=params))

    def update_workload(self, name: str, changes: Mapping[str, Any]) -> WorkloadOut:
        """Change a pending or suspended workload (priority, preemptible, max_runtime,
        backoff_limit, grace_period, node_selector, node_pools)."""
        path, params = _workload(name)
        return cast(WorkloadOut, self._request("PATCH", path, changes, params=params))

    def history(self, **filters: str | float | int | None) -> list[HistoryOut]:
        """Workloads with wait and run time, GPU-hours, exit code, attempts, evictions;
        filters: project, user, state, since (seconds since the epoch), limit."""
        return cast(list[HistoryOut], self._request("GET", "/history", params=_params(filters)))

    def starts(self, project: str | None = None) -> list[StartOut]:
        """The estimated start of each pending workload (of `project` when given)."""
        params = {"project": project} if project is not None else None
        return cast(list[StartOut], self._request("GET", "/starts", params=params))

    def events(self, name: str) -> list[EventOut]:
        """What happened to a workload, oldest first."""
        path, params = _workload(name, then="/events")
        return cast(list[EventOut], self._request("GET", path, params=params))

    def logs(self, name: str, task: int = 0, offset: int = 0, tail: int | None = None) -> LogOut:
        """A task's output from byte `offset`, or its last `tail` lines; the answer's
        `offset` is where to continue."""
        path, params = _workload(name, then="/logs")
        params.update(task=str(task), offset=str(offset))
        if tail is not None:
            params["tail"] = str(tail)
        return cast(LogOut, self._request("GET", path, params=params))

    def why(self, name: str) -> WhyOut:
        """Why a workload waits, its place in its project, and who holds the GPUs."""
        path, params = _workload(name, then="/why")
        return cast(WhyOut, self._request("GET", path, params=params))

    # -- nodes and the cluster -----------------------------------------------------------

    def list_nodes(self) -> list[NodeOut]:
        return cast(list[NodeOut], self._request("GET", "/nodes"))

    def get_node(self, name: str) -> NodeOut:
        return cast(NodeOut, self._request("GET", f"/nodes/{_segment(name)}"))

    def register_node(self, node: Mapping[str, Any]) -> NodeOut:
        """Register a node from the API's NodeIn fields (admins only)."""
        return cast(NodeOut, self._request("POST", "/nodes", node))

    def remove_node(self, name: str) -> None:
        """Remove a node; work bound to it goes back to its queue."""
        self._request("DELETE", f"/nodes/{_segment(name)}")

    def cordon(self, name: str) -> NodeOut:
        """Place nothing new on the node; what runs there keeps running."""
        return cast(NodeOut, self._request("POST", f"/nodes/{_segment(name)}/cordon"))

    def uncordon(self, name: str) -> NodeOut:
        return cast(NodeOut, self._request("POST", f"/nodes/{_segment(name)}/uncordon"))

    def cluster(self) -> ClusterOut:
        """Counts of nodes, GPUs and workloads, and when the scheduler last ran."""
        return cast(ClusterOut, self._request("GET", "/cluster"))

    def usage(
        self, since: str | float = "7d", by: str = "project", until: float | None = None
    ) -> list[UsageRowOut]:
        """GPU-hours allocated, used and idle since `since` (seconds, or "24h", "7d"), by
        project, department, user or workload; largest allocation first."""
        params = {"since": str(since), "by": by}
        if until is not None:
            params["until"] = str(until)
        return cast(list[UsageRowOut], self._request("GET", "/usage", params=params))

    # -- transport -----------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        text: bool = False,
        timeout: float | None = None,
        content: bytes | None = None,
    ) -> Any:
        seconds = self.timeout if timeout is None else timeout
        try:
            response = self._http.request(
                method,
                path,
                json=dict(body) if body is not None else None,
                content=content,
                params=params,
                headers=headers,
                timeout=seconds,
            )
        except httpx.TimeoutException as error:
            raise ServerUnreachable(self.server, f"no answer within {seconds:g} s") from error
        except httpx.TransportError as error:
            reason = _one_line(str(error)) or type(error).__name__
            raise ServerUnreachable(self.server, reason) from error
        if response.status_code >= 400:
            raise _api_error(response, body)
        if text:
            return response.text
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                response.status_code, f"the server answered {path} with something not JSON"
            ) from None


def _params(filters: Mapping[str, str | float | int | None]) -> dict[str, str]:
    """Query parameters from the filters that are set."""
    return {key: str(value) for key, value in filters.items() if value is not None}


def _idempotency(key: str | None) -> dict[str, str] | None:
    return {"Idempotency-Key": key} if key is not None else None


def _segment(name: str) -> str:
    """A name as one URL path segment, so that a name with "/" cannot reach another path."""
    return quote(name, safe="")


def workload_address(name: str) -> tuple[str, dict[str, str]]:
    """The path segment and query of a workload given as NAME or PROJECT/NAME."""
    project, separator, short = name.rpartition("/")
    return _segment(short if separator else name), ({"project": project} if separator else {})


def _workload(name: str, under: str = "/workloads", then: str = "") -> tuple[str, dict[str, str]]:
    """The path (under `under`, followed by `then`) and query of a workload given as NAME
    or PROJECT/NAME: a name is unique within its project, `?project=` says which."""
    segment, params = workload_address(name)
    return f"{under}/{segment}{then}", params


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _api_error(response: httpx.Response, body: Mapping[str, Any] | None) -> ApiError:
    status = response.status_code
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list):
        problems = _problems(detail, body)
        return ApiError(status, "; ".join(map(str, problems)) or "invalid request", problems)
    if isinstance(detail, str) and detail:
        return ApiError(status, _one_line(detail))
    return ApiError(status, f"HTTP {status} {response.reason_phrase}".strip())


# Pydantic's error types for a value of the wrong kind (a string where a number belongs).
_WRONG_KIND = ("_type", "_parsing")


def _problems(detail: list[Any], body: Mapping[str, Any] | None) -> list[FieldProblem]:
    """FieldProblems from a 422's `detail`, one per field, in the order the server gave.

    A field that accepts several shapes (a number, or an object with gpu/cpu/memory) is
    checked against each, and each reports an error. When one shape matched the kind of
    value but a constraint failed, the others' "wrong kind" errors only distract.
    """
    by_path: dict[str, list[tuple[str, str]]] = {}
    for item in detail:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("type", ""))
        message = str(item.get("msg", "invalid"))
        if kind == "value_error":
            message = message.removeprefix("Value error, ")
        loc = item.get("loc")
        path = _field_path(loc if isinstance(loc, list) else [], kind, body)
        by_path.setdefault(path, []).append((kind, message))
    problems: list[FieldProblem] = []
    for path, found in by_path.items():
        specific = [message for kind, message in found if not kind.endswith(_WRONG_KIND)]
        messages = specific or [message for _, message in found]
        for message in dict.fromkeys(messages):
            problems.append(FieldProblem(path, message))
    return problems


def _field_path(loc: list[Any], kind: str, body: Mapping[str, Any] | None) -> str:
    """`tasks[0].gpu` from a loc such as ["body", "tasks", 0, "gpu"].

    Pydantic puts the name of a union's alternative into the loc ("Quota",
    "constrained-float"); walking the body that was sent tells field names from those:
    a part that is not a key or index of the value at that point is dropped, unless it
    names a required field that is missing.
    """
    parts = list(loc)
    source = parts.pop(0) if parts and parts[0] in ("body", "query", "path") else "body"
    walk = source == "body" and body is not None
    value: Any = body
    path = ""
    for position, part in enumerate(parts):
        if walk:
            if _has(value, part):
                value = value[part]
            elif not (kind == "missing" and position == len(parts) - 1):
                continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _has(value: Any, part: Any) -> bool:
    """Whether `part` is a key of `value` (a JSON object) or an index of it (an array)."""
    if isinstance(value, Mapping):
        return isinstance(part, str) and part in value
    if isinstance(value, list):
        return isinstance(part, int) and 0 <= part < len(value)
    return False
