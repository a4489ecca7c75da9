"""What the tests of sessions (exec, shell, port-forward, WebSockets through the workspace
proxy) share: how soon the server ended one."""

from __future__ import annotations

import contextlib
import time

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

# The close code of a session whose user lost access (corral.workspaces.access).
ACCESS_ENDED = 1008


def ended_after(
    ws: ClientConnection, since: float, wait: float = 15
) -> tuple[float, int | None, str]:
    """Seconds from `since` (time.monotonic) until the server closed `ws`, reading what
    it sends meanwhile, and its close code and reason; AssertionError when it is still
    open `wait` seconds after `since`."""
    with contextlib.suppress(ConnectionClosed):
        while time.monotonic() - since < wait:
            with contextlib.suppress(TimeoutError):
                ws.recv(timeout=1)
        raise AssertionError(f"the session is still open {wait:g} s on")
    return time.monotonic() - since, ws.close_code, ws.close_reason or ""
