"""Many rows in one statement, with their ids.

SQLAlchemy's `INSERT ... RETURNING` in the order of the parameters runs one statement per
row on SQLite (a burst of submissions, or a cycle that binds a thousand tasks, paid
about 60 us a row for it). Without that order it renders one multi-row `INSERT ...
RETURNING` ("insertmanyvalues", in batches of up to a thousand rows) on SQLite and
PostgreSQL alike: `insert_ids` returns each new row's id with a unique key of the row and
matches them up by that key, so the order the database returns them in does not matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, insert


def insert_ids(
    connection: Connection, table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]
) -> list[int]:
    """Insert `rows` into `table` and return their ids, in the order of `rows`. `key`:
    columns that are unique together in `table`."""
    if not rows:
        return []
    columns = [table.c[name] for name in key]
    statement = insert(table).returning(table.c.id, *columns)
    found = {tuple(row[1:]): row[0] for row in connection.execute(statement, list(rows))}
    return [found[tuple(row[name] for name in key)] for row in rows]
