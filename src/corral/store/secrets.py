"""Project secrets: values encrypted at rest with Fernet (AES-128-CBC and HMAC-SHA256),
decrypted only to build the environment of a task being launched.

The key is not in the database: a stolen database (or backup) reveals names, never
values. It comes, first found first, from `CORRAL_SECRET_KEY` (the key itself), the
file given by `--secret-key-file` or `CORRAL_SECRET_KEY_FILE`, or DATA_DIR/secret-key,
which the first start writes with mode 0600. Servers that share a PostgreSQL store must
share the key (the same file, or the same variable).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from corral.store.errors import NotFound
from corral.store.queues import queue_row
from corral.store.schema import QueueRow, SecretRow

KEY_FILE = "secret-key"
KEY_VARIABLE = "CORRAL_SECRET_KEY"
KEY_FILE_VARIABLE = "CORRAL_SECRET_KEY_FILE"
# A secret's value is an environment variable's: bounded, as the OS bounds those.
MAX_VALUE = 65536


def load_key(data_dir: Path, key_file: Path | None = None) -> bytes:
    """The Fernet key of this installation (see the module's docstring for where it is
    looked for); DATA_DIR/secret-key is created, 0600, when nothing else names a key."""
    given = os.environ.get(KEY_VARIABLE)
    if given:
        return given.strip().encode()
    named = key_file or (
        Path(os.environ[KEY_FILE_VARIABLE]) if os.environ.get(KEY_FILE_VARIABLE) else None
    )
    if named is not None:
        # A named key file must exist: a fresh key would make every stored secret
        # unreadable on a server that shares the database.
        return named.read_bytes().strip()
    path = data_dir / KEY_FILE
    key = Fernet.generate_key()
    old = os.umask(0o077)
    try:
        # Never through a symlink (O_NOFOLLOW): a key planted by another account is one
        # that account knows.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_key(path)
    finally:
        os.umask(old)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key + b"\n")
    return key


def _read_key(path: Path) -> bytes:
    """The key in DATA_DIR/secret-key, read without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        return handle.read().strip()


class SecretBox:
    """Encrypts and decrypts secret values with one installation's key."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def seal(self, value: str) -> bytes:
        """The value, encrypted."""
        return self._fernet.encrypt(value.encode())

    def open(self, sealed: bytes) -> str:
        """The value of `sealed`; ValueError when another key sealed it."""
        try:
            return self._fernet.decrypt(sealed).decode()
        except InvalidToken as error:
            raise ValueError("a secret was sealed with another key") from error


def set_secret(session: Session, project: str, name: str, sealed: bytes) -> None:
    """Store (or replace) the project's secret `name`."""
    queue = queue_row(session, project, field="project")
    row = session.scalar(
        select(SecretRow).where(SecretRow.queue_id == queue.id, SecretRow.name == name)
    )
    if row is None:
        session.add(
            SecretRow(queue_id=queue.id, name=name, ciphertext=sealed, updated_at=time.time())
        )
    else:
        row.ciphertext, row.updated_at = sealed, time.time()


def list_secrets(session: Session, project: str) -> list[tuple[str, float]]:
    """The project's secrets' names and when each was last set, by name."""
    queue = queue_row(session, project, field="project")
    rows = session.execute(
        select(SecretRow.name, SecretRow.updated_at)
        .where(SecretRow.queue_id == queue.id)
        .order_by(SecretRow.name)
    ).all()
    return [(name, updated) for name, updated in rows]


def delete_secret(session: Session, project: str, name: str) -> None:
    """Delete the project's secret `name`; NotFound when it has none of that name."""
    queue = queue_row(session, project, field="project")
    done = session.execute(
        delete(SecretRow).where(SecretRow.queue_id == queue.id, SecretRow.name == name)
    )
    if not done.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"secret {name!r} not found in {project}")


def sealed_secrets(session: Session, project: str, names: Collection[str]) -> dict[str, bytes]:
    """The sealed values of the project's secrets of `names` (those that exist)."""
    if not names:
        return {}
    rows = session.execute(
        select(SecretRow.name, SecretRow.ciphertext)
        .join(QueueRow, SecretRow.queue_id == QueueRow.id)
        .where(QueueRow.name == project, SecretRow.name.in_(sorted(set(names))))
    ).all()
    return {name: bytes(sealed) for name, sealed in rows}
