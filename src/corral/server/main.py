"""Starting the server: the data directory, the first admin token, uvicorn."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from pathlib import Path

import uvicorn

from corral.model import Node, format_memory
from corral.model.spec import NodeSpec
from corral.store import Store, database_url

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "corral"
ADMIN_TOKEN_FILE = "admin-token"


def open_store(data_dir: Path, db_url: str | None) -> tuple[Store, str | None]:
    """Open (and migrate) the store. On the very first start, create the admin token and
    write it to DATA_DIR/admin-token, readable by the owner only; return it then."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(database_url(data_dir, db_url))
    token = store.ensure_admin()
    if token is not None:
        path = data_dir / ADMIN_TOKEN_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
        os.chmod(path, 0o600)
    return store, token


def serve(data_dir: Path, db_url: str | None, host: str, port: int) -> None:
    """Run the server until interrupted."""
    from corral.server.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store, token = open_store(data_dir, db_url)
    print(f"corral server on http://{host}:{port} (API http://{host}:{port}/api/v1)", flush=True)
    print(f"store: {store.url.split('@')[-1]}", flush=True)
    show_first_token(token, data_dir)
    switch_interval()
    uvicorn.run(create_app(store), host=host, port=port, log_level="warning")


def show_first_token(token: str | None, data_dir: Path) -> None:
    """Print the first admin token, made on this start, only to a terminal: stdout sent to
    a file or a log collector would keep the credential where others may read it."""
    if token is None:
        return
    path = data_dir / ADMIN_TOKEN_FILE
    if sys.stdout.isatty():
        print(f"admin token (shown once; also in {path}): {token}", flush=True)
    else:
        print(f"admin token written to {path} (readable by its owner only)", flush=True)


def switch_interval() -> None:
    """The scheduler, the submission writer and the API share one interpreter. Python hands
    the GIL to a waiting thread every 5 ms by default, so a woken scheduler could wait
    several of those behind request handlers; 1 ms keeps submit-to-bound short."""
    sys.setswitchinterval(0.001)


def node_name() -> str:
    """This machine's name, made a valid corral name."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-")
    return name[:63] or "localhost"


def up(
    data_dir: Path,
    db_url: str | None,
    host: str,
    port: int,
    virtual_gpus: int | None,
    virtual_model: str,
    virtual_memory: int,
    labels: dict[str, str],
) -> None:
    """The server and an agent for this machine, in one process."""
    from corral.agent import Agent, discover
    from corral.cluster.local import LocalCluster
    from corral.server.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store, token = open_store(data_dir, db_url)
    found = discover(virtual_gpus, virtual_model, virtual_memory)
    name = node_name()
    store.register_node(
        NodeSpec(
            Node(
                name=name,
                gpus=len(found.devices),
                gpu_memory=found.memory,
                gpu_model=found.model,
                cpu=float(os.cpu_count() or 1),
                memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                labels=labels,
            ),
            found.devices,
            virtual=found.source == "virtual",
        ),
        replace_existing=True,
    )
    # The agent samples its devices every CORRAL_SAMPLE_INTERVAL seconds (5 by default).
    cluster = LocalCluster([Agent(name, data_dir, devices=found.devices)])
    app = create_app(store, cluster=cluster, data_dir=data_dir)
    print(f"corral is up on http://{host}:{port} (API http://{host}:{port}/api/v1)", flush=True)
    print(f"node {name}: {found.note}", flush=True)
    for device in found.devices:
        kind = "virtual" if device.virtual else "NVML"
        print(f"  GPU {device.index}: {device.model}, {format_memory(device.memory)} ({kind})")
    print(f"admin token file: {data_dir / ADMIN_TOKEN_FILE}", flush=True)
    show_first_token(token, data_dir)
    switch_interval()
    uvicorn.run(app, host=host, port=port, log_level="warning")
