"""The in-process transport: agents that live in the server's own process, for one machine."""

from __future__ import annotations

from collections import defaultdict

from corral.agent import Agent
from corral.agent.exec import ExecSession
from corral.messages import Reports, TaskLaunch, TaskStop


class LocalCluster:
    """Agents by node name, called directly."""

    def __init__(self, agents: list[Agent]) -> None:
        self.agents = {agent.node: agent for agent in agents}

    @property
    def run_as_submitter(self) -> bool:
        """True when its agents run tasks as their submitters (they run as root)."""
        return any(agent.run_as_submitter for agent in self.agents.values())

    def connect(self, reports: Reports) -> None:
        for agent in self.agents.values():
            agent.reports = reports
            agent.start_thread()

    def start(self, launches: list[TaskLaunch]) -> None:
        by_node: dict[str, list[TaskLaunch]] = defaultdict(list)
        for launch in launches:
            by_node[launch.node].append(launch)
        for node, group in by_node.items():
            agent = self.agents.get(node)
            if agent is not None:
                agent.start(group)

    def stop(self, stops: list[TaskStop]) -> None:
        by_node: dict[str, list[TaskStop]] = defaultdict(list)
        for stop in stops:
            by_node[stop.node].append(stop)
        for node, group in by_node.items():
            agent = self.agents.get(node)
            if agent is not None:
                agent.stop(group)

    def forget(self, directory: str) -> None:
        """A deleted workload's files go, from every agent here, once its tasks have gone
        (see Agent.forget): on one machine its logs are the server's too."""
        for agent in self.agents.values():
            agent.forget(directory)

    def open_session(
        self, node: str, workload: str, task: int, command: list[str], tty: bool
    ) -> ExecSession:
        """Run a command beside a task on `node` (see Agent.open_session); LookupError
        when no agent of this cluster runs it."""
        agent = self.agents.get(node)
        if agent is None:
            raise LookupError(f"node {node} has no agent here")
        return agent.open_session(workload, task, command, tty)

    def forget_session(self, node: str, session: ExecSession) -> None:
        """The session's bridge is over; its agent stops tracking it."""
        agent = self.agents.get(node)
        if agent is not None:
            agent.sessions.forget(session)

    def running(self, node: str) -> set[tuple[str, int]] | None:
        agent = self.agents.get(node)
        return agent.running() if agent is not None else None

    def strays(self, node: str) -> set[tuple[str, int]]:
        agent = self.agents.get(node)
        return agent.strays() if agent is not None else set()

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
