"""Many rows in one statement, with their ids.

SQLAlchemy's `INSERT ... RETURNING` in the order of the parameters runs one statement per
row on SQLite (a burst of submissions, or a cycle that binds a thousand tasks, paid
about 60 us a row for it). `insert_ids` inserts with one executemany and reads the new
ids back by a unique key instead: two statements for any number of rows, on every
backend. It runs in the caller's transaction, under the store's write lock, so no other
writer can add rows with the same key in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection, Insert, Select, Table, bindparam, insert, select

# Values per IN list when reading the ids back (SQLite's default bound is 32,766 variables,
# older builds 999).
CHUNK = 900


def insert_ids(
    connection: Connection, table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]
) -> list[int]:
    """Insert `rows` into `table` and return their ids, in the order of `rows`. `key`:
    columns that are unique together in `table`; the first is the one searched by."""
    if not rows:
        return []
    one, query = _statements(table, tuple(key))
    if len(rows) == 1:  # one statement either way
        return [connection.execute(one, rows[0]).scalar_one()]
    connection.execute(insert(table), list(rows))
    wanted = list({row[key[0]] for row in rows})
    found: dict[tuple[Any, ...], int] = {}
    for start in range(0, len(wanted), CHUNK):
        for row in connection.execute(query, {"wanted": wanted[start : start + CHUNK]}):
            found[tuple(row[1:])] = row[0]
    return [found[tuple(row[name] for name in key)] for row in rows]


@cache
def _statements(table: Table, key: tuple[str, ...]) -> tuple[Insert, Select[*tuple[Any, ...]]]:
    """The insert of one row with its id, and the select of ids by key: made once per
    table, since making them cost more than running them."""
    columns = [table.c[name] for name in key]
    read_back = select(table.c.id, *columns).where(
        columns[0].in_(bindparam("wanted", expanding=True))
    )
    return insert(table).returning(table.c.id), read_back
