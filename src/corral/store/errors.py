"""Typed errors of the store; the server maps them to HTTP statuses."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class NotFound(StoreError):
    """The named object does not exist (HTTP 404)."""


class Conflict(StoreError):
    """The request clashes with the current state: a name taken, a queue in use (HTTP 409).
    `names`: the names that clash, where a name taken is the cause."""

    def __init__(self, message: str, names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.names = names


class Invalid(StoreError):
    """A field has a value the current state does not allow (HTTP 422)."""

    def __init__(self, field: str, message: str, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        # Where the field sits in a request of several objects: ("workloads", 2).
        self.at = at
