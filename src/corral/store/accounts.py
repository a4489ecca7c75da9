"""Users, the projects they belong to (memberships), and their API tokens. Tokens are
stored as digests, never as given."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, selectinload

from corral.store.errors import Conflict, Invalid, NotFound
from corral.store.events import add_event
from corral.store.queues import queue_row
from corral.store.records import PROJECT_ROLES, ROLES, TokenRecord, UserRecord
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
    return _new_token(session, user)[0]


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
    session: Session, name: str, role: str, project: str | None, unix_user: str | None = None
) -> tuple[UserRecord, str]:
    """Create a user with a first token (a member with a first membership, as a
    `member`); returns the user and the token. `unix_user` is the Unix account its tasks
    run as on a root agent (None: none)."""
    if session.scalar(select(UserRow.id).where(UserRow.name == name)):
        raise Conflict(f"user {name!r} already exists")
    user = UserRow(name=name, role=role, created_at=time.time(), unix_user=unix_user)
    if project is not None:
        queue = queue_row(session, project, field="project")
        user.memberships.append(MembershipRow(queue_id=queue.id, role="member"))
    session.add(user)
    session.flush()
    token = _new_token(session, user)[0]
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


def set_unix_user(session: Session, name: str, unix_user: str | None) -> None:
    """Change the Unix account a user's tasks run as on a root agent."""
    row = session.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} not found")
    row.unix_user = unix_user


def create_token(
    session: Session, user: str, name: str | None = None, expires_at: float | None = None
) -> tuple[str, int]:
    """A new token for the user, named and expiring when given; returns it and its id."""
    row = session.scalar(select(UserRow).where(UserRow.name == user))
    if row is None:
        raise NotFound(f"user {user!r} not found")
    token, token_row = _new_token(session, row, name, expires_at)
    session.flush()
    return token, token_row.id


def list_tokens(session: Session, user: str | None = None) -> list[TokenRecord]:
    """Tokens (of `user`, or of everyone), oldest first, revoked and expired ones too."""
    query = select(TokenRow, UserRow.name).join(UserRow).order_by(TokenRow.id)
    if user is not None:
        query = query.where(UserRow.name == user)
    return [
        TokenRecord(
            row.id,
            owner,
            row.name,
            row.created_at,
            row.expires_at,
            row.revoked_at,
            row.last_used_at,
        )
        for row, owner in session.execute(query).all()
    ]


def token_owner(session: Session, token_id: int) -> str:
    """The name of the token's user; NotFound when there is no such token."""
    owner = session.scalar(select(UserRow.name).join(TokenRow).where(TokenRow.id == token_id))
    if owner is None:
        raise NotFound(f"token {token_id} not found")
    return owner


def revoke_token(session: Session, token_id: int) -> None:
    """Revoke a token: it stays listed, and authenticates nobody from now on. The last
    usable token of the last admin is kept, as the last admin is (see `delete_user`):
    without it nobody could administer the server."""
    row = session.get(TokenRow, token_id)
    if row is None:
        raise NotFound(f"token {token_id} not found")
    if row.user.role == "admin" and _usable(row):
        admins = select(UserRow.id).where(UserRow.role == "admin")
        others = session.scalars(
            select(TokenRow).where(TokenRow.user_id.in_(admins), TokenRow.id != token_id)
        ).all()
        if not any(_usable(other) for other in others):
            raise Conflict(f"token {token_id} is the last usable admin token; make another first")
    session.execute(
        update(TokenRow)
        .where(TokenRow.id == token_id, TokenRow.revoked_at.is_(None))
        .values(revoked_at=time.time())
    )


def delete_user(session: Session, name: str) -> None:
    """Delete a user and their tokens, so that none of these authenticates any more; the
    last admin is kept. Their workloads and audit records keep the name."""
    row = session.scalar(select(UserRow).where(UserRow.name == name))
    if row is None:
        raise NotFound(f"user {name!r} not found")
    if row.role == "admin":
        admins = session.scalar(
            select(func.count()).select_from(UserRow).where(UserRow.role == "admin")
        )
        if admins == 1:
            raise Conflict(f"{name!r} is the last admin")
    # The tokens are deleted explicitly, not left to the foreign key's cascade: the ORM
    # would otherwise null their user_id first.
    session.execute(delete(TokenRow).where(TokenRow.user_id == row.id))
    session.delete(row)
    add_event(session, "user-deleted", "api", name)


def list_users(session: Session) -> list[UserRecord]:
    """Every user, oldest first."""
    rows = session.scalars(
        select(UserRow)
        .options(selectinload(UserRow.memberships).joinedload(MembershipRow.queue))
        .order_by(UserRow.id)
    ).all()
    return [_user_record(row) for row in rows]


def token_user(session: Session, key: str, now: float) -> tuple[UserRecord, float | None] | None:
    """The user of the token whose digest is `key`, and when the token expires; None when
    there is no such token, or it is revoked or expired at `now`."""
    row = session.scalar(select(TokenRow).where(TokenRow.digest == key))
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= now:
        return None
    return _user_record(row.user), row.expires_at


def _usable(row: TokenRow) -> bool:
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > time.time())


def touch_token(session: Session, key: str, now: float) -> None:
    """Note that the token whose digest is `key` was used at `now`."""
    session.execute(update(TokenRow).where(TokenRow.digest == key).values(last_used_at=now))


def _user_record(row: UserRow) -> UserRecord:
    memberships = tuple((m.queue.name, m.role) for m in row.memberships)
    return UserRecord(row.name, row.role, memberships, row.unix_user)


def _new_token(
    session: Session, user: UserRow, name: str | None = None, expires_at: float | None = None
) -> tuple[str, TokenRow]:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = TokenRow(
        user_id=user.id,
        digest=digest(token),
        created_at=time.time(),
        name=name,
        expires_at=expires_at,
    )
    session.add(row)
    return token, row
