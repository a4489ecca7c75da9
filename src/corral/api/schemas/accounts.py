"""Bodies of users, memberships, tokens, secrets and the audit log."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from corral.api.schemas.common import Body, Name, UnixUser, duration_seconds
from corral.control.accounts import is_root_account
from corral.store.records import UserRecord


class SecretIn(Body):
    value: str = Field(
        min_length=1,
        max_length=65536,
        pattern=r"^[^\x00]*$",
        description="stored encrypted; never shown again",
    )


class SecretOut(BaseModel):
    name: str
    updated_at: float


class UserIn(Body):
    name: Name
    role: Literal["admin", "member", "viewer"] = Field(
        "member",
        description="admin: everything; viewer: reads every project, writes nothing; "
        "member: reads and submits in the projects they belong to",
    )
    project: Name | None = Field(
        None, description="a member's first project, where they are a `member`"
    )
    unix_user: UnixUser | None = Field(
        None,
        description="the Unix account its tasks run as when the agent runs as root; "
        "default: the account of the same name (never root)",
    )

    @field_validator("unix_user")
    @classmethod
    def _unix_user(cls, value: str | None) -> str | None:
        if value is not None and is_root_account(value):
            raise ValueError(
                f"{value!r} is root; only the operator may map the admin to root "
                "(--admin-unix-user), never a user created through the API"
            )
        return value

    @model_validator(mode="after")
    def _project(self) -> UserIn:
        if self.role == "member" and self.project is None:
            raise ValueError("a member needs a project")
        if self.role != "member" and self.project is not None:
            raise ValueError(f"only members belong to a project, not a {self.role}")
        return self

    def account(self) -> str | None:
        """The Unix account to record: the one given, else the user's own name when it is
        a valid login name (at most 32 characters)."""
        if self.unix_user is not None:
            return self.unix_user
        return self.name if len(self.name) <= 32 else None


class MembershipIn(Body):
    role: Literal["member", "project-admin"] = Field(
        "member",
        description="member: manages their own workloads of the project; project-admin: "
        "every workload of the project",
    )


class MembershipOut(BaseModel):
    project: str
    role: str


class UserOut(BaseModel):
    name: str
    role: str
    project: str | None = Field(description="the first of `projects`, or null")
    projects: list[MembershipOut] = Field(description="a member's projects and role in each")
    unix_user: str | None = Field(None, description="the Unix account its tasks run as")

    @classmethod
    def of(cls, record: UserRecord) -> UserOut:
        return cls(
            name=record.name,
            role=record.role,
            project=record.project,
            projects=[MembershipOut(project=p, role=r) for p, r in record.memberships],
            unix_user=record.unix_user,
        )


class TokenOut(BaseModel):
    user: str
    token: str = Field(description="shown once; only its digest is stored")
    id: int | None = Field(default=None, description="for `DELETE /tokens/{id}`")
    name: str | None = None
    expires_at: float | None = None


class TokenIn(Body):
    name: Name | None = Field(default=None, description="what the token is for")
    expires_in: float | str | None = Field(
        default=None,
        description='seconds, or "90m", "12h", "30d" (at most a year); none: never expires',
    )

    @field_validator("expires_in")
    @classmethod
    def _expires(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            duration_seconds(value)
        return value

    def expires_at(self, now: float) -> float | None:
        """When a token made at `now` expires."""
        return None if self.expires_in is None else now + duration_seconds(self.expires_in)


class TokenInfoOut(BaseModel):
    """A token as listed: never its value."""

    id: int
    user: str
    name: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None = Field(description="exact to about 10 s")
    active: bool = Field(description="neither revoked nor expired")


class AuditOut(BaseModel):
    """A write request: who (null for no valid token), when, what, from where, outcome. Or
    a session that entered (or tried to enter) a workload's task: method EXEC (exec,
    shell) or FORWARD (port-forward), status 101 once it opened, with the fields below."""

    id: int
    at: float
    user: str | None
    method: str
    route: str
    path: str
    address: str | None
    status: int
    workload: str | None = Field(None, description="a session's workload; null for a write")
    task: int | None = Field(None, description="a session's task")
    command: list[str] | None = Field(None, description="an exec session's command")
    ended_at: float | None = Field(None, description="when a session ended; null while open")
    exit_code: int | None = Field(
        None,
        description="an exec session's exit code; null while it runs, and when it ended "
        "otherwise (its client left, its user lost access)",
    )
