"""The ports of a workspace's task: a free number on this node for each declared name,
and the variables that tell the task where to listen and under which URL it is served."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from corral.model.spec import MAIN_PORT


def allocate(names: Sequence[str], host: str) -> dict[str, int]:
    """A port free on `host` for each name. The numbers are found by binding port 0 and
    are free when returned; the task binds them moments later (another process could take
    one in between, as with any port picked this way, and the task then fails to listen)."""
    found: dict[str, int] = {}
    sockets: list[socket.socket] = []
    try:
        for name in names:
            # All held open together, so that two names never get the same number.
            sock = socket.socket()
            sockets.append(sock)
            sock.bind((host, 0))
            found[name] = int(sock.getsockname()[1])
    finally:
        for sock in sockets:
            sock.close()
    return found


def suffix(name: str) -> str:
    """The variable suffix of a port name: `tensorboard` -> `TENSORBOARD`, `a-b` -> `A_B`."""
    return name.upper().replace("-", "_")


def port_variables(workload: str, host: str, numbers: Mapping[str, int]) -> dict[str, str]:
    """CORRAL_HOST (the address to listen on), and per port CORRAL_PORT_<NAME> and
    CORRAL_BASE_URL_<NAME> (its path on the server); `main`'s also as CORRAL_PORT and
    CORRAL_BASE_URL."""
    variables = {"CORRAL_HOST": host}
    for name, number in numbers.items():
        base = f"/w/{workload}/" if name == MAIN_PORT else f"/w/{workload}/{name}/"
        variables[f"CORRAL_PORT_{suffix(name)}"] = str(number)
        variables[f"CORRAL_BASE_URL_{suffix(name)}"] = base
        if name == MAIN_PORT:
            variables["CORRAL_PORT"] = str(number)
            variables["CORRAL_BASE_URL"] = base
    return variables
