"""Many machines: the agents are Ray actors, one per Ray node (`corral.cluster.ray_agent`).

The control plane connects to Ray as a driver. Ray tells which nodes are alive and
carries the messages; corral decides everything else. On every alive node runs one
detached actor, named `agent-<node id>` in namespace `corral`, pinned to its node (hard
node affinity, `num_cpus=0`), so that a restarted server finds it again by name and
adopts its tasks. Ray's `GPU` resource is never used to place corral tasks: the agent
finds its devices itself (NVML, or the node's `corral_virtual_gpus` resource).

A poller keeps one `drain(wait)` call outstanding per agent: the agent answers as soon
as it has a report, else after the poll interval, and the poller asks again at once. The
call carries the server's current settings (`AgentSettings`); the answer carries the
agent's reports, what it runs, new log output and telemetry; a successful answer is the
node's heartbeat. The actors are threaded, so that orders do not wait behind a drain. An
agent that stops answering is declared lost by the dispatcher after the loss timeout; its
tasks were fenced by their own launchers before that (the fence timeout is shorter), or
are killed by its agent as soon as it reads the declaration (`corral.cluster.ray_lost`),
so no task runs twice.

Importing this module imports Ray; the rest of corral never does unless `--ray` is given.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.cluster.exec_relay import Ticket, ticket_of
from corral.cluster.log_shipping import Inbox
from corral.cluster.ray_agent import PROTOCOL, NodeAgent
from corral.cluster.ray_lost import LostMarker, declare_lost
from corral.messages import CAUSES, AgentSettings, Reports, TaskLaunch, TaskStop
from corral.model import Node
from corral.model.spec import NodeSpec

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError("corral on Ray needs Ray: pip install 'corral[ray]'") from error

log = logging.getLogger("corral.cluster.ray")
ray_log = logging.getLogger("ray.cluster")

# One corral per Ray cluster uses the namespace `corral`; another one (a test, a second
# team) sets CORRAL_RAY_NAMESPACE so that it gets agents of its own.
NAMESPACE = os.environ.get("CORRAL_RAY_NAMESPACE", "corral")
LABEL_PREFIX = "corral.io/"
VIRTUAL_GPUS = "corral_virtual_gpus"
# An answer is a heartbeat, but each is a write to the store: one per node this often is
# enough for a loss timeout of several seconds (1,000 nodes, 500 writes/s; one a second
# would be 1,000).
HEARTBEAT_EVERY = 2.0
# Calls an agent actor serves at once: a waiting drain, and starts, stops and port
# requests beside it.
AGENT_CONCURRENCY = 4
# Seconds an exec session's actor call may take (it starts the command).
SESSION_TIMEOUT = 15.0
# An agent that has not answered for this many seconds is said to be late in the log.
LATE = 3.0
# Code snapshots kept in the object store for the launches that bring them (each up to
# the server's cap of 128 MiB; a snapshot dropped is put again by its next launch).
CODE_REFS = 8


def connect(address: str, timeout: float = 30.0) -> None:
    """Connect this process to the Ray cluster at `address` ("auto" as Ray understands it)
    as a driver. `ray.init` against a dead head hangs for minutes, so it runs in a thread
    and is given up after `timeout` seconds."""
    if ray.is_initialized():
        return
    failure: list[BaseException] = []
    host = address.rpartition(":")[0]
    local: dict[str, Any] = {}
    if host.startswith("127.") or host == "localhost":
        # Ray rewrites a loopback head address into this machine's outward address, where
        # a head listening on loopback (one machine, tests) does not answer: keep it.
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
        local["_node_ip_address"] = "127.0.0.1"

    def init() -> None:
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                **local,
            )
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=init, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RuntimeError(f"no Ray cluster answered at {address} within {timeout:g} s")
    if failure:
        raise RuntimeError(f"cannot connect to Ray at {address}: {failure[0]}")
    _summarize_ray_errors()


def own_address() -> str:
    """This process's address in the Ray cluster (a connected driver's): where the server
    connects to the nodes from."""
    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _summarize_ray_errors() -> None:
    """Ray prints the errors of the whole cluster to a driver's stdout, a dead raylet's
    with its last state dumps (dozens of lines each); corral's log keeps the first line
    of each, as a warning of `ray` (corral's own lines say what it means for the work).
    Ray offers no setting for it: its driver looks this function up each time."""
    worker_module: Any = ray._private.worker
    if not hasattr(worker_module, "print_to_stdstream"):
        return
    original = worker_module.print_to_stdstream

    def summarize(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            original(data, ignore_prefix)
            return
        for message in data.get("lines") or ():
            first = str(message).strip().splitlines()[:1]
            if first:
                ray_log.warning("%s", first[0][:300])

    worker_module.print_to_stdstream = summarize


def node_name(node: dict[str, Any]) -> str:
    """The corral name of a Ray node: its `corral.io/name` label, else its hostname and a
    short node id (several Ray nodes may share one hostname)."""
    labels = node.get("Labels") or {}
    given = labels.get(LABEL_PREFIX + "name")
    raw = given or f"{node.get('NodeManagerHostname', 'node')}-{node['NodeID'][:6]}"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    return name[:63] or node["NodeID"][:12]


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    """Ray labels under `corral.io/` (but the name), without the prefix."""
    labels = node.get("Labels") or {}
    return {
        key.removeprefix(LABEL_PREFIX): str(value)
        for key, value in labels.items()
        if key.startswith(LABEL_PREFIX) and key != LABEL_PREFIX + "name"
    }


@dataclass
class _Agent:
    """One node's agent, as the server tracks it."""

    node_id: str
    name: str
    address: str
    handle: Any
    labels: dict[str, str]
    hello: Any = None  # the pending hello() call, until registered
    registered: bool = False
    draining: Any = None  # the pending drain() call
    drain_sent: float = 0.0
    # What the agent understands (see NodeAgent.hello): 2 and up, a drain that waits for
    # reports; 3 and up, the server's settings with every call.
    protocol: int = 1
    # An agent of an older corral, replaced once it runs no task.
    outdated: bool = False
    last_answer: float = 0.0
    # Whether the server said the agent is late (no answer for a while).
    late: bool = False
    last_heartbeat: float = 0.0
    running: set[tuple[str, int]] = field(default_factory=set)
    strays: set[tuple[str, int]] = field(default_factory=set)
    # What the server stored of the agent's answers (see NodeAgent.drain), sent with
    # every drain until a newer answer is stored.
    receipt: dict[str, Any] | None = None


def _agent_labels(hello: dict[str, Any]) -> dict[str, str]:
    """The labels an agent gave its node in its hello (an agent of before gives none)."""
    given = hello.get("labels")
    if not isinstance(given, dict):
        return {}
    return {str(key): str(value) for key, value in given.items()}


class RayCluster:
    """The `corral.cluster.Cluster` of a Ray cluster: one agent actor per alive node."""

    def __init__(
        self,
        log_dir: Path,
        *,
        agent_root: str = "~/.local/share/corral-agent",
        settings: AgentSettings | None = None,
        checkpoint_root: Path | None = None,
    ) -> None:
        """`log_dir` is the server's data directory, where the logs shipped from every
        node are written (as `corral logs` reads them); `agent_root` the directory of the
        agents on their own nodes (`~` is theirs); `settings` what every agent is told to
        follow."""
        if not ray.is_initialized():
            raise RuntimeError("connect to Ray first (corral.cluster.ray.connect)")
        self.log_dir = log_dir
        self.agent_root = agent_root
        self.settings = settings or AgentSettings()
        self.poll_interval = self.settings.poll_interval
        self.checkpoint_root = checkpoint_root
        self.reports: Reports | None = None
        self._inbox = Inbox(log_dir / "logs", self.settings.log_cap)
        # Reports were handed on since the last round: written before any receipt goes.
        self._unwritten = False
        self._actor: Any = ray.remote(NodeAgent)
        self._agents: dict[str, _Agent] = {}  # by node id
        self._by_name: dict[str, _Agent] = {}
        # The last attempt sent for each task, and where: reports of older attempts (a
        # task stopped on a node that came back) are not the current task's.
        self._latest: dict[tuple[str, int], tuple[str, int]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._discovered = -float("inf")
        # Code snapshots in the object store, by "PROJECT DIGEST", the newest last.
        self._code_refs: OrderedDict[str, Any] = OrderedDict()
        # Nodes whose outdated agent was killed, until its name is free again.
        self._replacing: set[str] = set()

    # -- corral.cluster.Cluster ------------------------------------------------------------

    def connect(self, reports: Reports) -> None:
        """Find or start the agents, wait (briefly) for the ones that run already to
        answer, so that the first reconciliation adopts their tasks, then poll them."""
        self.reports = reports
        self.poll_once()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with self._lock:
                waiting = [a for a in self._agents.values() if not a.registered]
            if not waiting:
                break
            time.sleep(0.05)
            self.poll_once()
        self._thread = threading.Thread(target=self._poll, name="corral-ray", daemon=True)
        self._thread.start()

    def start(self, launches: list[TaskLaunch]) -> None:
        by_node: dict[str, list[TaskLaunch]] = defaultdict(list)
        for launch in launches:
            by_node[launch.node].append(launch)
        with self._lock:
            for node, group in by_node.items():
                agent = self._by_name.get(node)
                if agent is None:
                    continue
                for launch in group:
                    self._latest[launch.key] = (node, launch.attempt)
                brought = self._snapshots(group) if agent.protocol >= 6 else {}
                if brought:
                    agent.handle.start.remote(group, brought)
                else:
                    agent.handle.start.remote(group)

    def _snapshots(self, launches: list[TaskLaunch]) -> dict[str, Any]:
        """Object refs of the code snapshots `launches` bring, by "PROJECT DIGEST": each
        put into the object store once while its ref is kept here (the newest few), and
        read from it only by a node that has not unpacked it. A snapshot the server cannot
        give is left out: the agent says so as the task's end."""
        refs: dict[str, Any] = {}
        for launch in launches:
            if launch.code is None or self.reports is None:
                continue
            key = f"{launch.project} {launch.code}"
            ref = self._code_refs.get(key)
            if ref is None:
                try:
                    ref = ray.put(self.reports.code(launch.project, launch.code))
                except LookupError as error:
                    log.warning("a launch of %s brings no code: %s", launch.workload, error)
                    continue
                self._code_refs[key] = ref
                while len(self._code_refs) > CODE_REFS:
                    self._code_refs.popitem(last=False)
            self._code_refs.move_to_end(key)
            refs[key] = ref
        return refs

    def stop(self, stops: list[TaskStop]) -> None:
        by_node: dict[str, list[TaskStop]] = defaultdict(list)
        for stop in stops:
            by_node[stop.node].append(stop)
        with self._lock:
            for node, group in by_node.items():
                agent = self._by_name.get(node)
                if agent is not None:
                    agent.handle.stop.remote(group)

    def forget(self, directory: str) -> None:
        """The workload whose directories are named `directory` was deleted: the server's
        copy of its logs goes now (and what of them still comes is dropped), and every
        agent removes its files on its node once its tasks there have gone. An agent of an
        older corral, which cannot, keeps them."""
        self._inbox.forget(directory)
        with self._lock:
            agents = [a for a in self._by_name.values() if a.protocol >= 4]
        for agent in agents:
            agent.handle.forget.remote(directory)

    def running(self, node: str) -> set[tuple[str, int]] | None:
        """What the node's agent said it runs at its last answer; None when the node has
        no registered agent that answered recently (the reconciler leaves it alone)."""
        with self._lock:
            agent = self._by_name.get(node)
            if agent is None or not agent.registered:
                return None
            if time.time() - agent.last_answer > max(5 * self.poll_interval, LATE):
                return None
            return set(agent.running)

    def strays(self, node: str) -> set[tuple[str, int]]:
        """What the node's agent said, at its last answer, it found running unadopted."""
        with self._lock:
            agent = self._by_name.get(node)
            return set(agent.strays) if agent is not None and agent.registered else set()

    def close(self) -> None:
        """Stop polling; the agents and their tasks keep running, for the next server."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- optional capabilities (see corral.control.dispatch) -------------------------------

    def rendezvous(self, workload: str, attempt: int, node: str) -> tuple[str, int]:
        """Rank 0's node address and a port its agent found free there."""
        with self._lock:
            agent = self._by_name.get(node)
        if agent is None:
            raise LookupError(f"node {node} has no agent")
        port: int = ray.get(agent.handle.free_port.remote(), timeout=10)
        return agent.address, port

    def open_remote_session(
        self, node: str, workload: str, task: int, command: list[str], tty: bool
    ) -> Ticket:
        """Run a command beside a task on `node`: its agent starts it and returns where
        the server connects to its streams (see corral.cluster.exec_relay). LookupError
        when the task does not run there, ValueError when the command cannot start,
        RuntimeError when the agent does not answer or cannot relay it."""
        with self._lock:
            agent = self._by_name.get(node)
        if agent is None or not agent.registered:
            raise LookupError(f"node {node} has no agent")
        try:
            call = agent.handle.open_session.remote(workload, task, command, tty)
            answer = ray.get(call, timeout=SESSION_TIMEOUT)
        except (ray.exceptions.RayError, AttributeError) as error:
            raise RuntimeError(f"the agent of {node} did not open the session: {error}") from None
        return ticket_of(answer)

    def agents(self) -> dict[str, str]:
        """The registered agents: corral node name -> Ray node id."""
        with self._lock:
            return {a.name: a.node_id for a in self._agents.values() if a.registered}

    def last_answer(self, node: str) -> float | None:
        """When the node's agent last answered (Unix time), if it has since this server
        started: the heartbeat in the store is written only every HEARTBEAT_EVERY."""
        with self._lock:
            agent = self._by_name.get(node)
            return agent.last_answer if agent is not None and agent.last_answer else None

    def declare_lost(self, nodes: list[str], at: float) -> None:
        """Tell the agents of `nodes`, should they still reach Ray, that the server declared
        them lost at `at`: they kill what they ran before then (corral.cluster.ray_lost)."""
        try:
            declare_lost(NAMESPACE, nodes, at)
        except Exception as error:
            # Their agents do not reach Ray either, then: their launchers fence by themselves.
            log.warning("could not record the loss of %s in Ray: %s", ", ".join(nodes), error)

    # -- polling ---------------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                waited = self.poll_once()
            except Exception:
                log.exception("polling the agents failed")
                waited = False
            if not waited:
                self._stop.wait(self.poll_interval)

    def poll_once(self) -> bool:
        """One round: start agents on new nodes and forget dead ones (at most once per
        poll interval), keep a drain outstanding at every agent, and handle the answers
        that came back, waiting up to the poll interval for the first. False when there
        was nothing to wait for."""
        if time.monotonic() - self._discovered >= self.poll_interval:
            self._discover()
            self._discovered = time.monotonic()
        with self._lock:
            agents = list(self._agents.values())
        pending = {}
        for agent in agents:
            if agent.hello is not None:
                pending[agent.hello] = (agent, "hello")
            if agent.draining is not None and time.time() - agent.drain_sent > 30.0:
                # A call that never came back (the node vanished): ask again.
                agent.draining = None
            if agent.registered and agent.draining is None:
                agent.draining = self._drain(agent)
                agent.drain_sent = time.time()
            if agent.draining is not None:
                pending[agent.draining] = (agent, "drain")
            self._note_lateness(agent)
        if not pending:
            return False
        refs = list(pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=self.poll_interval)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        # Whether every answer came back without waiting (failures, agents that do not
        # wait): then this round pauses, or they would be asked again in a busy loop.
        quick = bool(ready)
        for ref in ready:
            agent, kind = pending[ref]
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayError as error:
                # An agent that cannot answer is not alive: no heartbeat, and the next
                # round asks again (a restarted actor answers again by itself).
                log.debug("agent of %s did not answer %s: %s", agent.name, kind, error)
                if kind == "hello":
                    agent.hello = agent.handle.hello.remote()
                else:
                    agent.draining = None
                continue
            if kind == "hello":
                agent.hello = None
                self._register(agent, answer)
                quick = False  # its first drain follows at once
            else:
                agent.draining = None
                self._drained(agent, answer)
                quick = quick and agent.protocol < 2
        if self._unwritten:
            # The receipts sent with the next drains say these reports are stored.
            self._unwritten = False
            flush = getattr(self.reports, "flush", None)
            if flush is not None:
                flush()
        if quick:
            self._stop.wait(self.poll_interval)
        return True

    def _drain(self, agent: _Agent) -> Any:
        """The next drain call, as the agent's protocol has it."""
        if agent.protocol >= 3:
            return agent.handle.drain.remote(self.poll_interval, self.settings, agent.receipt)
        if agent.protocol == 2:
            return agent.handle.drain.remote(self.poll_interval)
        return agent.handle.drain.remote()

    def _note_lateness(self, agent: _Agent) -> None:
        """Say in the server's log when an agent stops answering, and when it is back."""
        if not agent.registered or not agent.last_answer:
            return
        silent = time.time() - agent.last_answer
        if not agent.late and silent > LATE:
            agent.late = True
            log.warning("node %s is late: no answer for %.1f s", agent.name, silent)

    def _discover(self) -> None:
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        alive = {node["NodeID"]: node for node in nodes if node.get("Alive")}
        with self._lock:
            for node_id in list(self._agents):
                if node_id not in alive:
                    # The node left Ray: stop asking; the dispatcher declares it lost when
                    # its agent has not answered for the loss timeout.
                    gone = self._agents.pop(node_id)
                    if self._by_name.get(gone.name) is gone:
                        del self._by_name[gone.name]
                    silent = time.time() - gone.last_answer if gone.last_answer else 0.0
                    log.warning(
                        "Ray says node %s (%s) is dead; its agent last answered %.1f s ago",
                        gone.name,
                        node_id,
                        silent,
                    )
            for node_id, node in alive.items():
                if node_id not in self._agents and self._name_free(node_id):
                    self._agents[node_id] = self._start_agent(node)

    def _name_free(self, node_id: str) -> bool:
        """Whether no agent actor of the node is left (one being replaced takes a moment
        to go after it was killed)."""
        if node_id not in self._replacing:
            return True
        try:
            ray.get_actor(f"agent-{node_id}", namespace=NAMESPACE)
        except ValueError:
            self._replacing.discard(node_id)
            return True
        return False

    def _start_agent(self, node: dict[str, Any]) -> _Agent:
        name = node_name(node)
        node_id = node["NodeID"]
        virtual = int((node.get("Resources") or {}).get(VIRTUAL_GPUS, 0))
        handle = self._actor.options(
            name=f"agent-{node_id}",
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
            max_concurrency=AGENT_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(
            name,
            self.agent_root,
            self.settings,
            virtual,
            workloads_root=str(self.checkpoint_root) if self.checkpoint_root else None,
            address=node.get("NodeManagerAddress", "127.0.0.1"),
            probe=LostMarker(NAMESPACE, name),
        )
        return _Agent(
            node_id,
            name,
            node.get("NodeManagerAddress", "127.0.0.1"),
            handle,
            node_labels(node),
            hello=handle.hello.remote(),
        )

    def _register(self, agent: _Agent, hello: dict[str, Any]) -> None:
        devices = hello["devices"]
        agent.last_answer = time.time()
        agent.protocol = int(hello.get("protocol", 1))
        if agent.protocol < PROTOCOL:
            agent.outdated = True
            log.warning(
                "the agent of node %s is of an older corral (protocol %d, this server's %d):"
                " it is replaced once it runs no task",
                agent.name,
                agent.protocol,
                PROTOCOL,
            )
        if devices and self.reports is not None:
            self.reports.node_joined(
                NodeSpec(
                    Node(
                        name=agent.name,
                        gpus=len(devices),
                        gpu_memory=hello["memory"],
                        gpu_model=hello["model"],
                        cpu=hello["cpu"],
                        memory=hello["ram"],
                        labels={**agent.labels, **_agent_labels(hello)},
                    ),
                    devices,
                    virtual=hello["source"] == "virtual",
                    address=agent.address,
                )
            )
            log.info("node %s joined: %s", agent.name, hello["note"])
        with self._lock:
            agent.registered = True
            self._by_name[agent.name] = agent

    def _replace(self, agent: _Agent) -> None:
        """Kill an outdated agent that runs nothing; the next discovery starts a new one."""
        log.warning("replacing the outdated agent of node %s: it runs no task", agent.name)
        with self._lock:
            self._agents.pop(agent.node_id, None)
            if self._by_name.get(agent.name) is agent:
                del self._by_name[agent.name]
            self._replacing.add(agent.node_id)
        try:
            ray.kill(agent.handle, no_restart=True)
        except Exception as error:
            log.warning("could not kill the old agent of %s: %s", agent.name, error)

    def _drained(self, agent: _Agent, answer: dict[str, Any]) -> None:
        now = time.time()
        if agent.late:
            agent.late = False
            log.info("node %s answers again after %.1f s", agent.name, now - agent.last_answer)
        agent.last_answer = now
        agent.running = {(workload, task) for workload, task in answer["running"]}
        # An older agent finds no strays.
        agent.strays = {(workload, task) for workload, task in answer.get("strays", ())}
        stored = {}
        for chunk in answer["logs"]:
            # (directory, task, offset, bytes); an agent of an older corral sends no
            # offset, and its workload's name for the directory.
            directory, task, data = chunk[0], chunk[1], chunk[-1]
            offset = chunk[2] if len(chunk) == 4 else None
            try:
                end = self._inbox.take(agent.name, directory, task, offset, data)
            except ValueError as error:
                log.warning("a log chunk of node %s is not stored: %s", agent.name, error)
                continue
            stored[(directory, task)] = end
        reports = self.reports
        if reports is None:
            return
        for item in answer["reports"]:
            self._report(agent, reports, item)
        if "answer" in answer:
            instance, number = answer["answer"]
            agent.receipt = {"instance": instance, "answer": number, "logs": stored}
            self._unwritten = True
        if agent.last_answer - agent.last_heartbeat >= HEARTBEAT_EVERY:
            agent.last_heartbeat = agent.last_answer
            reports.heartbeat(agent.name)
        if answer["samples"]:
            reports.samples(agent.name, answer["samples"])
        # An agent of before checkpoint reports sends no such key.
        checkpoints = answer.get("checkpoints")
        if isinstance(checkpoints, dict) and checkpoints:
            reports.checkpoints(agent.name, checkpoints)
        if agent.outdated and not agent.running and not agent.strays:
            self._replace(agent)

    def _report(self, agent: _Agent, reports: Reports, item: tuple[Any, ...]) -> None:
        """Pass on one report of the agent's (see NodeAgent's _Buffer for their shapes)."""
        kind, workload, task, attempt = item[:4]
        with self._lock:
            latest = self._latest.get((workload, task))
        if latest is not None and latest != (agent.name, attempt):
            # An older attempt of a task that was sent elsewhere or again since.
            return
        if kind == "started":
            reports.task_started(agent.name, workload, task, item[4], item[5])
        elif kind == "ports":
            reports.task_ports(agent.name, workload, task, item[4])
        elif kind == "preparing":
            reports.task_preparing(agent.name, workload, task, item[4])
        else:
            # Agents of older corrals send no launch (before launches were numbered), no
            # cause or no directory.
            cause = item[7] if len(item) > 7 and item[7] in CAUSES else None
            directory = item[8] if len(item) > 8 and isinstance(item[8], str) else None
            if cause is not None:
                log.warning("task %s/%d on %s %s: %s", workload, task, agent.name, cause, item[5])
            reports.task_ended(
                agent.name,
                workload,
                task,
                item[4],
                item[5],
                attempt if attempt >= 0 else None,
                item[6] if len(item) > 6 else None,
                cause,
                directory,
            )
            with self._lock:
                if self._latest.get((workload, task)) == (agent.name, attempt):
                    del self._latest[(workload, task)]  # kept only while it runs
