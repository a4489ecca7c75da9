"""Starting the server: the data directory, the first admin token, uvicorn."""

from __future__ import annotations

import dataclasses
import errno
import gc
import logging
import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from corral.agent.planted import own_directory, write_private
from corral.model import Node, format_memory
from corral.model.spec import CONTAINERS_LABEL, CONTAINERS_VALUE, NodeSpec
from corral.store import Store, database_url
from corral.store.secrets import load_key

if TYPE_CHECKING:
    from corral.agent import Agent
    from corral.agent.prepare import NodeIndex
    from corral.agent.walls import WallOptions
    from corral.cluster import Cluster

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "corral"
ADMIN_TOKEN_FILE = "admin-token"


class PortBusy(Exception):
    """The address to listen on is taken (another corral, most often)."""


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before anything else happens: a second server
    on a busy port must stop before it prints a banner or makes a token."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise PortBusy(f"cannot listen on {host}:{port}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    # As uvicorn does: a port left in TIME_WAIT by a stopped server is free to take.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise PortBusy(
                f"port {port} on {host} is already in use (another corral?); "
                "stop it or choose another with --port"
            ) from None
        raise PortBusy(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.set_inheritable(True)
    return sock


def server_logging() -> None:
    """The server's log: corral's own lines at INFO. Alembic's plugin set-up is left out,
    and each migration it runs is one line (the first of its description)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("alembic.runtime.migration").addFilter(_first_line)


def _first_line(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if "\n" in message:
        record.msg, record.args = message.split("\n", 1)[0], None
    return True


def run_uvicorn(app: object, sock: socket.socket) -> None:
    """Serve `app` on the socket `listen` bound, until interrupted, in an interpreter set
    up for a server (`tune_interpreter`)."""
    tune_interpreter()
    # No access log: at level warning it was never written, but uvicorn still formatted
    # each request's client address and path for it.
    config = uvicorn.Config(app, log_level="warning", access_log=False)  # type: ignore[arg-type]
    uvicorn.Server(config).run(sockets=[sock])


def private_data_dir(data_dir: Path) -> None:
    """Make the data directory 0700 and everything this process writes from now on (the
    database, its WAL, tokens, logs) private to its owner: tasks must not reach them. A
    directory another account could have planted is refused (Planted) before anything is
    written: corral would write the admin token into that account's hands."""
    os.umask(0o077)
    own_directory(data_dir, 0o700, "--data-dir")


def open_store(
    data_dir: Path,
    db_url: str | None,
    admin_unix_user: str | None = None,
    secret_key_file: Path | None = None,
) -> tuple[Store, str | None]:
    """Open (and migrate) the store, with the key of project secrets (see
    corral.store.secrets.load_key). On the very first start, create the admin token and
    write it to DATA_DIR/admin-token, readable by the owner only; return it then.
    `admin_unix_user`, when given, is the Unix account the admin's tasks run as on a root
    agent (it has none otherwise, and they are refused there)."""
    private_data_dir(data_dir)
    store = Store(database_url(data_dir, db_url))
    store.use_secret_key(load_key(data_dir, secret_key_file))
    token = store.ensure_admin()
    if token is not None:
        write_private(data_dir / ADMIN_TOKEN_FILE, (token + "\n").encode())
    if admin_unix_user is not None:
        store.set_unix_user("admin", admin_unix_user)
    return store, token


@dataclass(frozen=True, slots=True)
class RayOptions:
    """`--ray ADDRESS` and what goes with it (docs/multi-node.md)."""

    address: str
    checkpoint_root: Path | None = None
    # A node whose agent has not answered for this long is lost and its work requeued.
    loss_timeout: float = 10.0
    # Tasks of a node cut off from the cluster stop by themselves after this long; shorter
    # than the loss timeout, so no task runs twice.
    fence_timeout: float = 4.0
    agent_root: str = "~/.local/share/corral-agent"
    # Tasks of a node still in the cluster run on this long without a word from the server.
    server_absence: float = 600.0
    # The walls of the tasks on every node (None: the defaults).
    walls: WallOptions | None = None
    # Where the nodes' environments take packages from (None: PyPI).
    index: NodeIndex | None = None


# How often the dispatcher looks for lost nodes (its reconcile interval).
EXPIRY_CHECK = 2.0
# The most a lease may be older than the agent's last answer (its watchdog renews it every
# second) plus how often a launcher looks at it, and some slack on a loaded machine.
FENCE_SLACK = 1.0 + 0.5 + 2.0


def ray_cluster(data_dir: Path, options: RayOptions) -> tuple[Cluster, float]:
    """Connect to Ray and make the cluster of its nodes' agents; also the node timeout
    the dispatcher needs for a node to be lost within the loss timeout."""
    from corral.agent.walls import WallOptions
    from corral.cluster.ray import RayCluster, connect, own_address
    from corral.messages import AgentSettings

    # A node is declared lost (and its work placed elsewhere) a node timeout after its
    # agent's last answer; its tasks must have stopped by then.
    node_timeout = options.loss_timeout - EXPIRY_CHECK
    if options.fence_timeout + FENCE_SLACK > node_timeout:
        raise ValueError(
            f"the fence timeout ({options.fence_timeout:g} s) must be shorter than the loss"
            f" timeout ({options.loss_timeout:g} s) by {EXPIRY_CHECK + FENCE_SLACK:g} s"
            " at least"
        )

    connect(options.address)
    walls = options.walls or WallOptions()
    settings = AgentSettings(
        fence_timeout=options.fence_timeout,
        loss_timeout=options.loss_timeout,
        server_absence=options.server_absence,
        log_cap=walls.log_cap,
        task_pids=walls.pids,
        task_limits=walls.limits,
        server_addresses=(own_address(),),
        index_url=options.index.index_url if options.index else None,
        find_links=options.index.find_links if options.index else (),
    )
    cluster = RayCluster(
        data_dir,
        agent_root=options.agent_root,
        settings=settings,
        checkpoint_root=options.checkpoint_root,
    )
    return cluster, node_timeout


def serve(
    data_dir: Path,
    db_url: str | None,
    host: str,
    port: int,
    ray: RayOptions | None = None,
    admin_unix_user: str | None = None,
    secret_key_file: Path | None = None,
) -> None:
    """Run the server until interrupted; with `ray`, with an agent on every Ray node."""
    from corral.server.app import create_app

    sock = listen(host, port)
    server_logging()
    store, token = open_store(data_dir, db_url, admin_unix_user, secret_key_file)
    if ray is not None:
        cluster, node_timeout = ray_cluster(data_dir, ray)
        print(f"Ray cluster at {ray.address}: an agent on every node", flush=True)
        app = create_app(
            store,
            cluster=cluster,
            data_dir=data_dir,
            node_timeout=node_timeout,
            scheduler_process=True,
        )
    else:
        app = create_app(store, scheduler_process=True, data_dir=data_dir)
    print(f"corral server on http://{host}:{port} (API http://{host}:{port}/api/v1)", flush=True)
    print(f"store: {store.url.split('@')[-1]}", flush=True)
    show_first_token(token, data_dir)
    run_uvicorn(app, sock)


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


def tune_interpreter() -> None:
    """The interpreter settings of a server process: `switch_interval`, `tune_collector`."""
    switch_interval()
    tune_collector()


def switch_interval() -> None:
    """The scheduler, the submission writer and the API share one interpreter. Python hands
    the GIL to a waiting thread every 5 ms by default, so a woken scheduler could wait
    several of those behind request handlers; 1 ms keeps submit-to-bound short."""
    sys.setswitchinterval(0.001)


# Allocations (less deallocations) between two passes over the youngest objects: Python's
# default, 700, made a burst of submissions spend a quarter of its time in the collector.
COLLECTOR_THRESHOLD = 10_000


def tune_collector() -> None:
    """Python's cycle collector, for a server that makes many short-lived objects a
    request and keeps many long-lived ones (the scheduler's snapshot and state): what
    exists once started (modules, the application, the schema) lives as long as the
    process and is left out of the collector's passes, and the youngest objects are
    collected every COLLECTOR_THRESHOLD allocations, not 700. Each pass over them looks
    at more, but the passes over older objects, which look at everything the server
    keeps, come 14 times less often."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(COLLECTOR_THRESHOLD, older, oldest)


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
    workloads_dir: Path | None = None,
    admin_unix_user: str | None = None,
    ray: RayOptions | None = None,
    walls: WallOptions | None = None,
    index: NodeIndex | None = None,
) -> None:
    """The server and an agent for this machine, in one process; with `ray`, the server
    and an agent on every node of the Ray cluster (this machine's among them). `walls`:
    the limits of this machine's tasks (corral.agent.walls); `index`: where their
    environments take packages from (corral.agent.prepare)."""
    from corral.agent import Agent, discover
    from corral.agent.containers import look
    from corral.cluster.local import LocalCluster
    from corral.server.app import create_app

    sock = listen(host, port)
    server_logging()
    store, token = open_store(data_dir, db_url, admin_unix_user)
    if ray is not None:
        ray_cluster_, node_timeout = ray_cluster(data_dir, ray)
        app = create_app(
            store,
            cluster=ray_cluster_,
            data_dir=data_dir,
            node_timeout=node_timeout,
            scheduler_process=True,
        )
        print(f"corral is up on http://{host}:{port} (API http://{host}:{port}/api/v1)")
        print(f"Ray cluster at {ray.address}: an agent on every node", flush=True)
        print(f"admin token file: {data_dir / ADMIN_TOKEN_FILE}", flush=True)
        show_first_token(token, data_dir)
        run_uvicorn(app, sock)
        return
    found = discover(virtual_gpus, virtual_model, virtual_memory)
    name = node_name()
    spec = NodeSpec(
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
    )
    # Whether this node may run tasks in images (the agent makes sure by starting one
    # before its first such task): a workload with an image selects it by this label.
    containers = look()
    if containers.available:
        spec = dataclasses.replace(
            spec,
            node=dataclasses.replace(
                spec.node, labels={**labels, CONTAINERS_LABEL: CONTAINERS_VALUE}
            ),
        )
    store.register_node(spec, replace_existing=True)
    # The agent samples its devices every CORRAL_SAMPLE_INTERVAL seconds (5 by default).
    agent = Agent(
        name,
        data_dir,
        devices=found.devices,
        workloads_dir=workloads_dir,
        walls=walls,
        index=index,
    )
    cluster = LocalCluster([agent])
    app = create_app(store, cluster=cluster, data_dir=data_dir, scheduler_process=True)
    print(f"corral is up on http://{host}:{port} (API http://{host}:{port}/api/v1)", flush=True)
    print(f"node {name}: {found.note}", flush=True)
    for device in found.devices:
        kind = "virtual" if device.virtual else "NVML"
        print(f"  GPU {device.index}: {device.model}, {format_memory(device.memory)} ({kind})")
    for line in identity_lines(agent, store) + agent.walls.describe():
        print(line, flush=True)
    print(containers.describe(), flush=True)
    print(f"admin token file: {data_dir / ADMIN_TOKEN_FILE}", flush=True)
    show_first_token(token, data_dir)
    run_uvicorn(app, sock)


def identity_lines(agent: Agent, store: Store) -> list[str]:
    """What `corral up` says about who tasks run as, and where their directories are."""
    from corral.agent.identity import own_identity, unreachable_parent

    lines = [f"workload directories: {agent.workloads_dir} (one per workload, 0700)"]
    if not agent.run_as_submitter:
        me = own_identity().name
        lines.append(
            f"tasks run as {me}: every task, whoever submits it, runs as this Unix account "
            "with its rights (run corral as root to run each task as its submitter)"
        )
        return lines
    admin = next((u.unix_user for u in store.list_users() if u.name == "admin"), None)
    lines.append(
        "tasks run as their submitter's Unix account (corral user create NAME --unix-user "
        f"ACCOUNT); the admin's {f'as {admin}' if admin else 'are refused (--admin-unix-user)'}"
    )
    blocked = unreachable_parent(agent.workloads_dir)
    if blocked is not None:
        lines.append(
            f"warning: other accounts cannot pass through {blocked}, so tasks cannot reach "
            "their directories; choose another --workloads-dir"
        )
    return lines
