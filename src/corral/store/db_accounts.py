"""The part of the store's facade (`corral.store.db.Store`) that says who may do what:
queues (projects and departments, which members belong to), users, their tokens and
memberships, the audit log of what they did, and project secrets. The way in is the
same as the rest of `Store`'s: each method is one transaction or one read, handed to the
module of its aggregate (queues, accounts, audit, secrets).

A change to users, tokens or queues is counted (`accounts_changed`) once it has
committed: the API's token cache (corral.api.tokens_cache) trusts no user it remembered
before the count moved, so a revoked token or a removed membership takes effect at once
in this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import Session

import corral.store.accounts as accounts
import corral.store.audit as audit
import corral.store.queues as queues
import corral.store.secrets as secrets
from corral.model import Queue
from corral.model.spec import WorkloadSpec
from corral.store.audit import AuditQuery, AuditRecord
from corral.store.convert import queue_names, queue_record
from corral.store.database import Database
from corral.store.records import QueueRecord, TokenRecord, UserRecord
from corral.store.rules import normalize_rules, replace_rules


class AccountsStore(Database):
    """Queues, users, tokens, memberships, the audit log and project secrets, durably."""

    def __init__(self, url: str, migrate: bool = True) -> None:
        super().__init__(url, migrate)
        # How many changes to users, tokens or queues this process has made (`_accounts`),
        # for those who remember who a token belongs to (corral.api.tokens_cache).
        self.accounts_changed = 0
        self._counting = threading.Lock()
        # Seals and opens project secrets; set by the server (see use_secret_key).
        self._box: secrets.SecretBox | None = None

    @contextmanager
    def _accounts(self) -> Iterator[Session]:
        """A transaction that changes users, tokens or queues (which members belong to),
        counted in `accounts_changed` once it has committed (or failed)."""
        try:
            with self.write() as session:
                yield session
        finally:
            with self._counting:
                self.accounts_changed += 1

    # -- queues --------------------------------------------------------------------------

    def create_queue(self, queue: Queue, rules: Mapping[str, Any] | None = None) -> QueueRecord:
        """Add a queue, with its `rules` when given (see corral.store.rules), in one
        transaction: a queue whose rules are refused is not created."""
        with self._accounts() as session:
            record = queues.create_queue(session, queue)
            if rules is not None:
                replace_rules(session, queue.name, normalize_rules(rules))
            return record

    def update_queue(
        self, name: str, changes: dict[str, Any], rules: Mapping[str, Any] | None = None
    ) -> QueueRecord:
        """Change some of a queue's fields: parent, deserved, limit, over_quota_weight,
        priority, min-runtimes, time-decayed fair share settings; and replace its rules
        when `rules` is given ({} removes them). One transaction: nothing changes when any
        part is refused."""
        with self._accounts() as session:
            record = queues.update_queue(session, name, changes)
            if rules is not None:
                replace_rules(session, name, normalize_rules(rules))
            return record

    def delete_queue(self, name: str) -> None:
        """Delete a queue with no child queues and no unfinished workloads."""
        with self._accounts() as session:
            queues.delete_queue(session, name)

    def get_queue(self, name: str) -> QueueRecord:
        """The queue; NotFound when there is none."""
        with self.read() as session:
            return queue_record(session, queues.queue_row(session, name))

    def list_queues(self) -> list[QueueRecord]:
        """Every queue, oldest first."""
        with self.read() as session:
            return queues.list_queues(session)

    def queue_names(self) -> set[str]:
        """The name of every queue (project or department)."""
        with self.read() as session:
            return set(queue_names(session).values())

    def list_queues_with_rules(self) -> list[tuple[QueueRecord, dict[str, Any]]]:
        """Every queue, as `list_queues` gives them, with the rules set on it itself (as
        `corral.store.rules.queue_rules` gives them), read in one query for all queues."""
        with self.read() as session:
            return queues.list_queues_with_rules(session)

    # -- users and tokens ----------------------------------------------------------------

    def ensure_admin(self) -> str | None:
        """Create the first admin and return its token, or None when users exist already."""
        with self._accounts() as session:
            return accounts.ensure_admin(session)

    def create_user(
        self, name: str, role: str, project: str | None, unix_user: str | None = None
    ) -> tuple[UserRecord, str]:
        """Create a user with a first token (a member with `project` as a first
        membership); returns the user and the token. `unix_user` is the account its tasks
        run as on a root agent (None: none)."""
        accounts.check_user(role, project)
        with self._accounts() as session:
            return accounts.create_user(session, name, role, project, unix_user)

    def set_unix_user(self, name: str, unix_user: str | None) -> None:
        """Change the Unix account a user's tasks run as on a root agent."""
        with self._accounts() as session:
            accounts.set_unix_user(session, name, unix_user)

    def create_token(
        self, user: str, name: str | None = None, expires_at: float | None = None
    ) -> tuple[str, int]:
        """A new token for the user, named and expiring when given; it and its id."""
        with self._accounts() as session:
            return accounts.create_token(session, user, name, expires_at)

    def list_tokens(self, user: str | None = None) -> list[TokenRecord]:
        """Tokens (of `user`, or of everyone), oldest first; never their values."""
        with self.read() as session:
            return accounts.list_tokens(session, user)

    def token_owner(self, token_id: int) -> str:
        """The name of the token's user; NotFound when there is no such token."""
        with self.read() as session:
            return accounts.token_owner(session, token_id)

    def set_membership(self, name: str, project: str, role: str) -> UserRecord:
        """Make member `name` belong to `project` with `role`, or change its role there."""
        with self._accounts() as session:
            return accounts.set_membership(session, name, project, role)

    def remove_membership(self, name: str, project: str) -> UserRecord:
        """Take member `name` out of `project`."""
        with self._accounts() as session:
            return accounts.remove_membership(session, name, project)

    def revoke_token(self, token_id: int) -> None:
        """Revoke a token, at once (see `accounts_changed`)."""
        with self._accounts() as session:
            accounts.revoke_token(session, token_id)

    def delete_user(self, name: str) -> None:
        """Delete a user and their tokens, at once (see `accounts_changed`)."""
        with self._accounts() as session:
            accounts.delete_user(session, name)

    def list_users(self) -> list[UserRecord]:
        """Every user, oldest first."""
        with self.read() as session:
            return accounts.list_users(session)

    def token_user(self, token: str) -> tuple[UserRecord, float | None] | None:
        """The token's user and when the token expires (None: never), or None for an
        unknown, revoked or expired token; a token found is noted as used now."""
        key = accounts.digest(token)
        now = time.time()
        with self.read() as session:
            found = accounts.token_user(session, key, now)
        if found is None:
            return None
        with self.write(relevant=False) as session:
            accounts.touch_token(session, key, now)
        return found

    # -- audit ---------------------------------------------------------------------------

    def add_audit(self, records: Sequence[AuditRecord]) -> None:
        """Write audit records, in one transaction. They are new rows no cycle reads, as a
        submission's are: on PostgreSQL the answer of a request the middleware records
        does not wait for a cycle writing its decisions (see `Database.adding`)."""
        with self.adding() as session:
            audit.add_audit(session, records)

    def add_session(self, record: AuditRecord) -> int:
        """Write the audit record of a session (opened, or refused); its id, for
        `end_session`."""
        with self.adding() as session:
            return audit.add_session(session, record)

    def end_session(self, record_id: int, ended_at: float, exit_code: int | None) -> None:
        """Complete a session's audit record with its end and its command's exit code."""
        with self.write(relevant=False) as session:
            audit.end_session(session, record_id, ended_at, exit_code)

    def list_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """Audit records that pass `query`'s filters, oldest first."""
        with self.read() as session:
            return audit.list_audit(session, query)

    # -- project secrets -----------------------------------------------------------------

    def use_secret_key(self, key: bytes) -> None:
        """Seal and open secrets with `key` (see corral.store.secrets.load_key)."""
        self._box = secrets.SecretBox(key)

    def _secret_box(self) -> secrets.SecretBox:
        if self._box is None:
            raise RuntimeError("no secret key: call use_secret_key first")
        return self._box

    def set_secret(self, project: str, name: str, value: str) -> None:
        """Store (or replace) a project's secret; only its sealed value is written."""
        sealed = self._secret_box().seal(value)
        with self.write() as session:
            secrets.set_secret(session, project, name, sealed)

    def list_secrets(self, project: str) -> list[tuple[str, float]]:
        """The names of a project's secrets, and when each was last set."""
        with self.read() as session:
            return secrets.list_secrets(session, project)

    def delete_secret(self, project: str, name: str) -> None:
        """Delete a project's secret."""
        with self.write() as session:
            secrets.delete_secret(session, project, name)

    def secret_env(self, spec: WorkloadSpec) -> dict[str, str]:
        """The environment variables a workload's `secrets` name, with their values, for
        a launch only; a secret deleted since the submission is left out."""
        if not spec.secrets:
            return {}
        with self.read() as session:
            sealed = secrets.sealed_secrets(session, spec.project, set(spec.secrets.values()))
        box = self._secret_box()
        return {
            variable: box.open(sealed[name])
            for variable, name in spec.secrets.items()
            if name in sealed
        }
