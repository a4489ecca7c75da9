"""Which Unix account a corral user's tasks run as, and the refusal at submit of a user
whose tasks could not run.

Where the agents run as root, a task runs as its submitter's Unix account (recorded with
the user: `corral user create alice --unix-user alice`, the same name by default). As with
Slurm, the accounts are expected to be the same on the server and on the nodes, so a
submission from a user without one is refused at once rather than failing on a node.
"""

from __future__ import annotations

import pwd
from collections.abc import Sequence

from corral.agent.identity import identity_of, task_environment
from corral.agent.preflight import cannot_start
from corral.model.spec import WorkloadSpec
from corral.store import Invalid, Store
from corral.store.records import UserRecord

# What to do about a command the task's account cannot execute.
PREFLIGHT_FIX = (
    "let the node build its environment (--requirements FILE) and bring the code "
    "(--code DIR), install it where that account can read it (a virtualenv outside a "
    "private home directory, say), or give the account access to it"
)


def is_root_account(name: str) -> bool:
    """True for root and any other account with uid 0."""
    if name == "root":
        return True
    try:
        return pwd.getpwnam(name).pw_uid == 0
    except KeyError:
        return False


def require_account(cluster: object, user: UserRecord) -> None:
    """Refuse (422, naming the user) a submission whose tasks would be refused by a root
    agent: its user has no Unix account, or the account does not exist here."""
    # A transport tells whether its agents switch users; one that does not say, does not.
    if not getattr(cluster, "run_as_submitter", False):
        return
    if user.unix_user is None:
        raise Invalid(
            "user",
            f"user {user.name!r} has no Unix account, and tasks here run as their "
            "submitter's account; give it one (`corral user create NAME --unix-user "
            "ACCOUNT`, or `--admin-unix-user` for the admin)",
        )
    try:
        identity_of(user.unix_user)
    except LookupError:
        raise Invalid(
            "user",
            f"user {user.name!r} runs tasks as the Unix account {user.unix_user!r}, "
            "which does not exist on this machine",
        ) from None


def require_runnable(
    cluster: object, user: UserRecord, specs: Sequence[WorkloadSpec], batch: bool = False
) -> None:
    """Refuse (422 naming `command`, or `workdir`) a workload whose tasks' account could not
    start its command on this machine (see corral.agent.preflight): asked where the agents
    switch users and share this machine's files (one machine; a transport whose nodes are
    elsewhere does not say `run_as_submitter`). `batch`: name the workload by its place."""
    if not getattr(cluster, "run_as_submitter", False) or user.unix_user is None:
        return
    try:
        identity = identity_of(user.unix_user)
    except LookupError:
        return  # require_account's refusal
    for index, spec in enumerate(specs):
        if "PATH" in spec.secrets:
            continue  # its PATH is a secret's value, not known here
        if spec.python is not None or spec.image is not None or spec.code is not None:
            # Its interpreter is in the environment or the image its node makes, and its
            # working directory in the copy of its code: none is on this machine yet.
            continue
        refusal = cannot_start(
            spec.command, task_environment(spec.env, identity), spec.workdir, identity
        )
        if refusal is not None:
            at = ("workloads", index) if batch else ()
            raise Invalid(refusal.field, f"{refusal.reason}; {PREFLIGHT_FIX}", at=at)


def unix_users(store: Store) -> dict[str, str | None]:
    """The Unix account of each corral user, by name."""
    return {user.name: user.unix_user for user in store.list_users()}
