"""Users and their API tokens. Tokens are stored as digests, never as given."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_event
from corral.store.queues import queue_row
from corral.store.records import ROLES, UserRecord
from corral.store.schema import TokenRow, UserRow

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
    """A role is one of ROLES; members, and only members, belong to a project."""
    if role not in ROLES:
        raise Invalid("role", f"{role!r} is not one of {', '.join(ROLES)}")
    if role == "member" and project is None:
        raise Invalid("project", "a member needs a project")
    if role != "member" and project is not None:
        raise Invalid("project", f"only members belong to a project, not a {role}")


def create_user(
    session: Session, name: str, role: str, project: str | None, unix_user: str | None = None
) -> tuple[UserRecord, str]:
    """Create a user with a first token; returns the user and the token. `unix_user` is
    the Unix account its tasks run as on a root agent (None: none)."""
    if session.scalar(select(UserRow.id).where(UserRow.name == name)):
        raise Conflict(f"user {name!r} already exists")
    queue = queue_row(session, project, field="project") if project else None
    user = UserRow(
        name=name,
        role=role,
        project_id=queue.id if queue else None,
        created_at=time.time(),
        unix_user=unix_user,
    )
    session.add(user)
    session.flush()
    token = _new_token(session, user)
    add_event(session, "user-created", "api", f"{name} ({role})")
    return UserRecord(name, role, project, unix_user), token


def set_unix_user(session: Session, name: str, unix_user: str | None) -> None:
    """Change the Unix account a user's tasks run as on a root agent."""
    row = session.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} not found")
    row.unix_user = unix_user


def create_token(session: Session, user: str) -> str:
    """A new token for the user."""
    row = session.scalar(select(UserRow).where(UserRow.name == user))
    if row is None:
        raise NotFound(f"user {user!r} not found")
    return _new_token(session, row)


def list_users(session: Session) -> list[UserRecord]:
    """Every user, oldest first."""
    rows = session.scalars(select(UserRow).order_by(UserRow.id)).all()
    return [_user_record(row) for row in rows]


def token_user(session: Session, key: str) -> UserRecord | None:
    """The user of the token whose digest is `key`, or None."""
    row = session.scalar(select(TokenRow).where(TokenRow.digest == key))
    return None if row is None else _user_record(row.user)


def _user_record(row: UserRow) -> UserRecord:
    return UserRecord(row.name, row.role, row.project.name if row.project else None, row.unix_user)


def _new_token(session: Session, user: UserRow) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(TokenRow(user_id=user.id, digest=digest(token), created_at=time.time()))
    return token
