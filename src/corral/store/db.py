"""The durable store: the only code in corral that speaks SQL.

`Store` is a thin facade: each public method opens one transaction (`Database.write`) or
one read (`Database.read`) and hands the session to the module of its aggregate: nodes,
workloads, tasks, scheduling, events, summaries here; queues, users and tokens, audit
records and project secrets in `corral.store.db_accounts`, which `Store` extends. Rows
become records in `convert`.

The way in: code outside corral.store calls `Store`'s methods and never holds a session
of its own; an aggregate module's functions that take a session are the store's alone.
Usage accounting, telemetry (and its reads) and rules take the store itself, open
their reads and writes through the same `read`/`write`, and are called with it
directly; `Store` does not forward to them.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import corral.store.events as events
import corral.store.history as history
import corral.store.idempotency as idempotency
import corral.store.lifecycle as lifecycle
import corral.store.nodes as nodes
import corral.store.queue_usage as queue_usage
import corral.store.reports as reports
import corral.store.scheduling as scheduling
import corral.store.shapes as shapes
import corral.store.summaries as summaries
import corral.store.tasks as tasks
import corral.store.usage as usage
import corral.store.workloads as workloads
import corral.store.workspaces as workspaces
from corral.model import Decisions, Node, Queue, Snapshot, Workload
from corral.model.spec import NodeSpec, WorkloadSpec
from corral.store.audit import AuditRecord
from corral.store.convert import node_record
from corral.store.db_accounts import AccountsStore
from corral.store.idempotency import Idempotency, Replayed
from corral.store.records import (
    BoundWork,
    ClusterCounts,
    EventRecord,
    NodeRecord,
    NodeState,
    Release,
    WorkloadRecord,
)
from corral.store.workloads import Submission

# Held work is looked at again at least this often, even when nothing seems to change.
HOLDS_SECONDS = 10.0


class Store(AccountsStore):
    """Queues, nodes, workloads, events, users and tokens, durably: the way into the
    store."""

    def __init__(self, url: str, migrate: bool = True) -> None:
        super().__init__(url, migrate)
        usage.install(self)
        # (generation, newest held workload id, when) of the last look for held work.
        self._holds_seen: tuple[int, int, float] | None = None

    # -- nodes ---------------------------------------------------------------------------

    def register_node(self, spec: NodeSpec, replace_existing: bool = False) -> NodeRecord:
        """Add a node with its devices. With `replace_existing` (an agent re-registering),
        an existing node's devices and labels are updated and its work is kept."""
        nodes.check_devices(spec)
        with self.write() as session:
            return nodes.register_node(session, spec, replace_existing)

    def set_schedulable(self, name: str, schedulable: bool) -> NodeRecord:
        """Cordon (False) or uncordon (True) a node."""
        with self.write() as session:
            return nodes.set_schedulable(session, name, schedulable)

    def remove_node(self, name: str) -> list[str]:
        """Remove a node; its workloads go back to pending. Returns their names."""
        with self.write() as session:
            return nodes.remove_node(session, name)

    def get_node(self, name: str) -> NodeRecord:
        """The node; NotFound when there is none."""
        with self.read() as session:
            return node_record(session, nodes.node_row(session, name))

    def cluster_shape(self) -> tuple[tuple[Node, ...], tuple[Queue, ...]]:
        """Every node's size and labels, and every queue, without their work."""
        with self.read() as session:
            return shapes.cluster_shape(session)

    def list_nodes(self) -> list[NodeRecord]:
        """Every node, by name."""
        with self.read() as session:
            return nodes.list_nodes(session)

    def node_states(self) -> list[NodeState]:
        """Every node's name, state and last heartbeat, by name (one small select)."""
        with self.read() as session:
            return nodes.node_states(session)

    # -- workloads -----------------------------------------------------------------------

    def submit(self, spec: WorkloadSpec) -> WorkloadRecord:
        """Add a pending workload, durably, and return it as stored; raise what kept it
        out. One transaction of its own: the server's submissions share theirs
        (corral.control.submissions, `submit_many`)."""
        outcome = self.submit_many([spec])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def submit_many(
        self,
        specs: Sequence[WorkloadSpec],
        keys: Sequence[Idempotency | None] | None = None,
        audits: Sequence[AuditRecord | None] | None = None,
    ) -> list[WorkloadRecord | Exception]:
        """Add pending workloads in one transaction: for each, the stored workload or the
        error that kept it out. One bad submission fails no other: should the transaction
        fail for a reason no check foresaw, each is written alone. `keys`, one per spec:
        the request's Idempotency-Key, written with its workload; a key used before gives
        `Replayed`. `audits`, one per spec: the request's audit record, written with its
        workload."""
        now = time.time()
        nothing = [None] * len(specs)
        batch = [
            Submission(spec, now, idempotency=key, audit=audit)
            for spec, key, audit in zip(specs, keys or nothing, audits or nothing, strict=True)
        ]
        with self.holding_new_work():
            written = self._submit_batch(batch)
        self.grew(written)
        return [item.outcome() for item in batch]

    def submit_all(
        self, specs: Sequence[WorkloadSpec], key: Idempotency | None = None
    ) -> list[WorkloadRecord]:
        """Add pending workloads all together or not at all, in one transaction. The first
        submission that fails a check fails the whole; an Invalid names it by its place
        (`at=("workloads", i)`). With `key` (the request's Idempotency-Key), the key is
        written in the same transaction; a key used before raises `Replayed`."""
        now = time.time()
        batch = [Submission(spec, now) for spec in specs]
        with self.adding() as session:
            if key is not None:
                seen = idempotency.find(session, [key]).get((key.user, key.key))
                if seen is not None:
                    raise seen
            written = workloads.insert_submissions(session, batch, atomic=True)
            if key is not None:
                idempotency.remember(session, key, [spec.name for spec in specs], now)
        self.grew(len(written))
        return [record for _, record in written]

    def replayed(self, replay: Replayed) -> list[WorkloadRecord]:
        """The workloads an earlier request with the same Idempotency-Key created, as they
        are now (those deleted since are left out)."""
        with self.read() as session:
            found = {
                r.spec.name: r for r in workloads.list_workloads_named(session, replay.workloads)
            }
        return [found[name] for name in replay.workloads if name in found]

    def purge_idempotency(self) -> int:
        """Forget Idempotency-Keys older than a day; returns how many."""
        with self.write(relevant=False) as session:
            return idempotency.purge(session, time.time())

    def _submit_batch(self, batch: list[Submission]) -> int:
        """Write the batch (see `submit_many`); returns how many workloads were written."""
        # A new pending workload is not in a cycle's snapshot and changes nothing it
        # decided: submissions do not bump the generation.
        try:
            with self.adding() as session:
                written = workloads.insert_submissions(session, batch)
        except Exception as error:
            if len(batch) == 1:
                batch[0].error = error
                return 0
            # Something none of the checks foresaw: write each alone, so that only the
            # submission at fault fails.
            for item in batch:
                item.error = None
            return sum(self._submit_batch([item]) for item in batch)
        for item, record in written:
            item.record = record
        return len(written)

    def get_workload(self, name: str) -> WorkloadRecord:
        """The workload; NotFound when there is none."""
        with self.read() as session:
            return workloads.get_workload(session, name)

    def find_named(self, name: str, projects: Collection[str] | None) -> list[WorkloadRecord]:
        """The workloads called `name` in their projects (see `workloads.find_named`)."""
        with self.read() as session:
            return workloads.find_named(session, name, projects)

    def find_arrays(self, name: str, projects: Collection[str] | None) -> list[str]:
        """The keys of the arrays called `name` (see `workloads.find_arrays`)."""
        with self.read() as session:
            return workloads.find_arrays(session, name, projects)

    def list_workloads(
        self,
        project: str | None = None,
        status: str | None = None,
        user: str | None = None,
        projects: Collection[str] | None = None,
        array: str | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads, oldest first, of one project, status, user or array when given, and
        only of `projects` when given (what a member may read)."""
        with self.read() as session:
            return workloads.list_workloads(session, project, status, user, projects, array=array)

    def delete_workload(self, name: str, cause: str) -> tuple[WorkloadRecord, list[Release]]:
        """Delete a workload and free its devices. Returns what it was, and the tasks to
        stop stamped as `cancel` stamps them."""
        with self.write() as session:
            decided = time.time()
            record, stopped = lifecycle.delete_workload(session, name, cause)
            return record, tasks.stamped(stopped, decided)

    def suspend(self, name: str, cause: str) -> tuple[WorkloadRecord, list[Release]]:
        """Take a workload out of scheduling; a running one gives its devices back.
        Returns what it was, and the tasks to stop stamped as `cancel` stamps them."""
        with self.write() as session:
            decided = time.time()
            record, stopped = lifecycle.suspend(session, name, cause)
            return record, tasks.stamped(stopped, decided)

    def resume(self, name: str, cause: str) -> WorkloadRecord:
        """Send a suspended workload back to pending."""
        with self.write() as session:
            return lifecycle.resume(session, name, cause)

    def cancel(self, name: str, cause: str) -> tuple[list[WorkloadRecord], list[Release]]:
        """Cancel a workload, or every unfinished member of the array `name`; see
        `lifecycle.cancel`."""
        with self.write() as session:
            decided = time.time()
            cancelled, stopped = lifecycle.cancel(session, name, cause)
            return cancelled, tasks.stamped(stopped, decided)

    def update_workload(self, name: str, changes: dict[str, Any], cause: str) -> WorkloadRecord:
        """Change fields of a pending or suspended workload; see `lifecycle.MUTABLE`."""
        with self.write() as session:
            return lifecycle.update_workload(session, name, changes, cause)

    def resolve_holds(self) -> list[str]:
        """Release the workloads whose dependencies are met, and cancel or explain those
        whose dependencies never will be (see `lifecycle.resolve_holds`). Only a change
        moves the generation: a workload blocked for good costs a cycle nothing more."""
        with self.read() as session:
            newest = lifecycle.newest_held(session)
        if newest is None:
            return []
        with self.writing():
            # Only a relevant change (a workload ended, was cancelled or deleted) or new
            # held work can release anything; still, a look every HOLDS_SECONDS.
            seen = self._holds_seen
            generation = self.generation
            if (
                seen is not None
                and seen[0] == generation
                and newest <= seen[1]
                and time.monotonic() - seen[2] < HOLDS_SECONDS
            ):
                return []
            with self.write(relevant=False) as session:
                changed = lifecycle.resolve_holds(session)
                if changed:
                    generation = self.bump(session)
            self._holds_seen = (generation, newest, time.monotonic())
        return changed

    def history(self, query: history.HistoryQuery) -> list[history.HistoryRecord]:
        """Workloads with their GPU-hours and evictions, like sacct; see `history.history`."""
        with self.read() as session:
            return history.history(session, query, time.time())

    def events(
        self, workload: str | None = None, limit: int = 1000, workload_id: int | None = None
    ) -> list[EventRecord]:
        """The newest `limit` events, oldest first: of the workload whose id is
        `workload_id`, or of the workload named `workload` now (none when there is no such
        workload: the events of a deleted one are not its name's), or of all."""
        with self.read() as session:
            if workload is not None and workload_id is None:
                workload_id = workloads.workload_id(session, workload)
                if workload_id is None:
                    return []
            return events.list_events(session, workload_id, limit)

    # -- scheduling ----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Pending and running work, every queue and node, as the engine reads them."""
        return self.read_snapshot()[0]

    def read_snapshot(self) -> tuple[Snapshot, int]:
        """The snapshot, and the newest workload id it has read (see `new_workloads`)."""
        with self.read() as session:
            return scheduling.read_snapshot(session)

    def new_workloads(self, after: int) -> tuple[tuple[Workload, ...], int]:
        """Active workloads with an id above `after` (submitted since a snapshot that read
        up to `after`), and the newest id read. Submissions commit one at a time under the
        write lock, so ids become visible in order and none is skipped."""
        with self.read() as session:
            return scheduling.new_workloads(session, after)

    def named_workloads(self, names: Collection[str], up_to: int) -> tuple[Workload, ...]:
        """The active workloads among `names` with an id up to `up_to`, as the engine
        reads them (not idle), by id: those changed since a snapshot that read up to
        `up_to` (see `Database.changed_since`)."""
        with self.read() as session:
            return scheduling.named_workloads(session, names, up_to)

    def advance_usage(self, now: float) -> dict[str, float]:
        """Bring each queue's decayed usage up to `now` with what is bound now (the
        scheduler loop calls it on its clock); the usage shares by queue name. Not a
        change scheduling depends on: the loop gives the shares to its cycles itself."""
        with self.write(relevant=False) as session:
            return queue_usage.advance_usage(session, now)

    def usage_shares(self) -> dict[str, float]:
        """Each tracked queue's usage share, as the last `advance_usage` left it."""
        with self.read() as session:
            return queue_usage.usage_shares(session)

    def apply(self, decisions: Decisions) -> list[Release]:
        """Write one cycle's decisions in one transaction: evictions, bindings, reasons.

        Returns the evicted tasks, whose processes must now be stopped. New work may be
        added meanwhile (see `Database.writing`)."""
        with self.write(beside_new_work=True) as session:
            decided = time.time()
            return tasks.stamped(scheduling.apply(session, decisions), decided)

    # -- tasks and agents ----------------------------------------------------------------

    def bound_work(
        self, nodes: Collection[str] | None = None, names: Collection[str] | None = None
    ) -> list[BoundWork]:
        """Running workloads with their bound tasks: those with a task on one of `nodes`,
        or those named, or all."""
        with self.read() as session:
            return tasks.bound_work(session, nodes, names)

    def task_started(self, workload: str, task: int, pid: int, proc_start: int) -> bool:
        """Record a task's process; False when the task is no longer bound (stop it)."""
        with self.write(relevant=False) as session:
            return tasks.task_started(session, workload, task, pid, proc_start)

    def task_ports(
        self, workload: str, task: int, ports: Mapping[str, int], node: str | None = None
    ) -> bool:
        """Record the numbers an agent gave a task's ports; False when it is not bound (on
        `node`, when given)."""
        with self.write(relevant=False) as session:
            return workspaces.task_ports(session, workload, task, ports, node)

    def task_preparing(self, workload: str, task: int, node: str, what: str) -> bool:
        """Note what a task's agent prepares before it starts (corral.store.tasks)."""
        with self.write(relevant=False) as session:
            return tasks.task_preparing(session, workload, task, node, what)

    def workspace_target(self, workload: str, task: int = 0) -> workspaces.Target:
        """Where a workload's task runs, with its ports (corral.store.workspaces)."""
        with self.read() as session:
            return workspaces.target(session, workload, task)

    def workload_key_of(self, workload_id: int) -> str:
        """The key of the workload of id `workload_id`; NotFound."""
        with self.read() as session:
            return workspaces.key_of(session, workload_id)

    def mark_active(self, names: Collection[str], at: float) -> None:
        """The proxy carried these workloads' traffic at `at` (idle detection)."""
        with self.write(relevant=False) as session:
            workspaces.mark_active(session, names, at)

    def active_at(self, names: Collection[str]) -> dict[str, float]:
        """When the proxy last carried each of these workloads' traffic."""
        with self.read() as session:
            return workspaces.active_at(session, names)

    def task_ended(
        self,
        workload: str,
        task: int,
        exit_code: int | None,
        reason: str,
        attempt: int | None = None,
        launch: int | None = None,
        cause: str | None = None,
        directory: str | None = None,
    ) -> list[Release]:
        """A task's process ended. A task that is no longer bound (evicted, suspended,
        deleted), the end of a task of a deleted workload of the same name (`directory`:
        the launch's, corral.messages), the end of an earlier `attempt` than the workload's
        current one (a preempted process whose end arrives after the workload was bound
        again), or of another `launch` of the task than the one bound now (an elastic
        workload's task evicted and bound again in the same attempt), changes nothing
        more. An end that
        corral caused (`cause`: its node fenced, an order of the server's) requeues the
        workload whole without using a retry. Otherwise exit 0 marks the task done, and
        the workload succeeds when every task is; any other end is the workload's failure:
        the rest of the gang stops and the workload goes back to pending, or to failed once
        its retries are used up. Whether it is waits while a node of another of its tasks
        has not been heard from since (see `settle_failing`).
        Returns the sibling tasks to stop."""
        # It changes this workload alone: the scheduler re-reads only it.
        with self.write(touched=(workload,)) as session:
            decided = time.time()
            stopped = tasks.task_ended(
                session,
                workload,
                task,
                exit_code,
                reason,
                attempt,
                launch,
                cause=cause,
                directory=directory,
            )
            return tasks.stamped(stopped, decided)

    def settle_failing(self, timeout: float) -> list[Release]:
        """Decide the failures that waited for a node to be heard from (see
        `tasks.settle_failing`); returns the tasks to stop."""
        with self.write(relevant=False) as session:
            decided = time.time()
            stopped, names = tasks.settle_failing(session, timeout)
            if names:
                self.bump(session, names)
            return tasks.stamped(stopped, decided)

    def write_reports(self, batch: Sequence[reports.Report]) -> reports.Outcome:
        """Take in agents' reports, in order, in one transaction: each as `task_started`,
        `task_ended` (only when the task is bound to the reporting node, or not bound at
        all) and `heartbeat` would, and checkpoint times (`reports.checkpointed`)."""
        with self.write(relevant=False) as session:
            decided = time.time()
            outcome = reports.write_reports(session, batch)
            if outcome.releases or outcome.unbound:
                outcome.decided_at = decided
                outcome.releases = tasks.stamped(outcome.releases, decided)
            if outcome.revived:
                self.bump(session)
            elif outcome.ended:
                # Task ends change their own workloads alone: the scheduler re-reads those.
                self.bump(session, outcome.ended)
        return outcome

    def heartbeat(self, node: str) -> None:
        """The node's agent is alive; an unavailable node becomes ready again."""
        with self.write(relevant=False) as session:
            if nodes.heartbeat(session, node):
                self.bump(session)

    def expire_nodes(
        self, silent: Mapping[str, float], limit: float
    ) -> tuple[dict[str, list[str]], list[Release]]:
        """Declare lost the nodes of `silent` (name -> seconds since their agent answered)
        with no heartbeat since `limit`, and send their workloads back to pending (a gang
        as a whole, no retry used). Returns the workloads requeued by each node declared
        lost, and the tasks those workloads had on other nodes, to stop."""
        with self.write() as session:
            decided = time.time()
            lost, stopped = nodes.expire_nodes(session, silent, limit)
            return lost, tasks.stamped(stopped, decided)

    # -- summaries and checks ------------------------------------------------------------

    def counts(self) -> ClusterCounts:
        """Nodes, GPUs, allocation, workloads by status and queues, without loading rows."""
        with self.read() as session:
            return summaries.counts(session)

    def integrity_problems(self) -> list[str]:
        """Everything that contradicts the store's invariants (empty when it is sound)."""
        with self.read() as session:
            return summaries.integrity_problems(session)
