"""Users, the projects they belong to (memberships), and their API tokens. Tokens are
stored as digests, never as given."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_event
from corral.store.queues import queue_row
from corral.store.records import PROJECT_ROLES, ROLES, UserRecord
from corral.store.schema import MembershipRow, TokenRow, UserRow

TOKEN_PREFIX = "crl_"


def digest(token: str) -> str:
    """What the store keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_admin(session: Session) -> str | None:
    """Create the first admin and return its token, or None when users exist already."""
    if session.scalar(select(func.count()).select_from(UserRow)):
        return None
    user = UserRow(name="admin", role="admin", created_at=time.time())
    session.add(user)
    session.flush()
    return _new_token(session, user)


def check_user(role: str, project: str | None) -> None:
    """A role is one of ROLES; members, and only members, belong to projects (a first
    one given at creation)."""
    if role not in ROLES:
        raise Invalid("role", f"{role!r} is not one of {', '.join(ROLES)}")
    if role == "member" and project is None:
        raise Invalid("project", "a member needs a project")
    if role != "member" and project is not None:
        raise Invalid("project", f"only members belong to a project, not a {role}")


def check_project_role(role: str) -> None:
    """A role in a project is one of PROJECT_ROLES."""
    if role not in PROJECT_ROLES:
        raise Invalid("role", f"{role!r} is not one of {', '.join(PROJECT_ROLES)}")


def create_user(
    session: Session, name: str, role: str, project: str | None
) -> tuple[UserRecord, str]:
    """Create a user with a first token (a member with a first membership, as a
    `member`); returns the user and the token."""
    if session.scalar(select(UserRow.id).where(UserRow.name == name)):
        raise Conflict(f"user {name!r} already exists")
    user = UserRow(name=name, role=role, created_at=time.time())
    if project is not None:
        queue = queue_row(session, project, field="project")
        user.memberships.append(MembershipRow(queue_id=queue.id, role="member"))
    session.add(user)
    session.flush()
    token = _new_token(session, user)
    add_event(session, "user-created", "api", f"{name} ({role})")
    return _user_record(user), token


def set_membership(session: Session, name: str, project: str, role: str) -> UserRecord:
    """Make member `name` belong to `project` with `role` (adding the membership, or
    changing its role); only members belong to projects."""
    check_project_role(role)
    user = _user_row(session, name)
    if user.role != "member":
        raise Invalid("name", f"only members belong to projects; {name} is a {user.role}")
    queue = queue_row(session, project, field="project")
    found = next((m for m in user.memberships if m.queue_id == queue.id), None)
    if found is None:
        user.memberships.append(MembershipRow(queue_id=queue.id, role=role))
    else:
        found.role = role
    session.flush()
    session.refresh(user)
    add_event(session, "membership-set", "api", f"{name} in {project} ({role})")
    return _user_record(user)


def remove_membership(session: Session, name: str, project: str) -> UserRecord:
    """Take member `name` out of `project`; their workloads stay, managed by the
    project's admins."""
    user = _user_row(session, name)
    found = next((m for m in user.memberships if m.queue.name == project), None)
    if found is None:
        raise NotFound(f"{name} is not a member of {project!r}")
    user.memberships.remove(found)
    session.flush()
    add_event(session, "membership-removed", "api", f"{name} from {project}")
    return _user_record(user)


def _user_row(session: Session, name: str) -> UserRow:
    row = session.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} not found")
    return row


def create_token(session: Session, user: str) -> str:
    """A new token for the user."""
    return _new_token(session, _user_row(session, user))


def list_users(session: Session) -> list[UserRecord]:
    """Every user, oldest first."""
    rows = session.scalars(
        select(UserRow)
        .options(selectinload(UserRow.memberships).joinedload(MembershipRow.queue))
        .order_by(UserRow.id)
    ).all()
    return [_user_record(row) for row in rows]


def token_user(session: Session, key: str) -> UserRecord | None:
    """The user of the token whose digest is `key`, or None."""
    row = session.scalar(select(TokenRow).where(TokenRow.digest == key))
    return None if row is None else _user_record(row.user)


def _user_record(row: UserRow) -> UserRecord:
    memberships = tuple((m.queue.name, m.role) for m in row.memberships)
    return UserRecord(row.name, row.role, memberships)


def _new_token(session: Session, user: UserRow) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(TokenRow(user_id=user.id, digest=digest(token), created_at=time.time()))
    return token
