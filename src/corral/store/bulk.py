"""Many rows in one go, written by the driver, with their ids.

SQLAlchemy runs Python code for every row of an executemany: it processes each row's
parameters by type and builds the driver's parameters from them, which cost more than
the database's own work (a batch of a thousand submissions spent most of its write
there). `Rows` is an insert made once per table and columns: its statement is made once
per database kind, and its rows are tuples in the order of the columns, already in the
driver's types (JSON columns as text: `json_text`), handed to the driver as they are,
through the session's connection and in its transaction.

SQLite inserts them with the driver's executemany. PostgreSQL inserts two or more with
COPY: psycopg's executemany sends one INSERT per row (pipelined), which cost the server
process and PostgreSQL together about four times what COPY does for a batch of a
thousand rows, and twice for a batch of eight.

SQLAlchemy's `INSERT ... RETURNING` in the order of the parameters runs one statement per
row on SQLite, and a multi-row one was dearer on PostgreSQL (its text is parsed afresh
every time), so `Rows.insert_ids` inserts and then reads the new ids back by a unique key
of the rows: two statements for any number of rows. It runs in the caller's transaction,
under the store's write lock, so no other writer of this process adds rows with the same
key in between.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Dialect, Executable, Row, Table
from sqlalchemy.exc import DBAPIError

# Values per IN list (SQLite's default bound is 32,766 variables per statement, older
# builds 999; PostgreSQL's 65,535).
CHUNK = 900

_T = TypeVar("_T")
# The driver's placeholder of a positional parameter, by SQLAlchemy's paramstyle.
_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}


class Rows:
    """Inserts of many rows into `table`, each a tuple of the values of `columns`. `key`:
    columns (among `columns`) unique together in `table`, by which `insert_ids` finds the
    new rows; the first is the one searched by.

    A column left out gets its database default: one with a default only SQLAlchemy
    would fill in is refused here, where a statement is made, not forgotten silently."""

    def __init__(self, table: Table, columns: Sequence[str], key: Sequence[str] = ()) -> None:
        forgotten = [
            column.name
            for column in table.columns
            if column.name not in columns
            and column.default is not None
            and column.server_default is None
        ]
        if forgotten:
            raise ValueError(f"{table.name}: columns with defaults left out: {forgotten}")
        self.table = table
        self.columns = tuple(columns)
        self._key = tuple(self.columns.index(name) for name in key)
        # By dialect name: the insert, COPY (None where there is none), and the start of
        # the select of ids by key.
        self._statements: dict[str, tuple[str, str | None, str]] = {}

    def insert(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert `rows`."""
        if not rows:
            return
        insert, copy, _ = self._made(connection.dialect)
        if copy is None or len(rows) == 1:
            connection.exec_driver_sql(insert, list(rows))
        else:
            _copy(connection, copy, rows)

    def insert_ids(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        """Insert `rows` and return their ids, in the order of `rows`."""
        if not rows:
            return []
        insert, _, select = self._made(connection.dialect)
        if not select:
            raise ValueError(f"{self.table.name}: no key to find new rows by")
        if len(rows) == 1:  # one statement either way
            return [connection.exec_driver_sql(f"{insert} RETURNING id", rows[0]).scalar_one()]
        self.insert(connection, rows)
        placeholder = _placeholder(connection.dialect)
        wanted = list({row[self._key[0]] for row in rows})
        found: dict[tuple[Any, ...], int] = {}
        for chunk in chunks(wanted):
            query = f"{select}{', '.join([placeholder] * len(chunk))})"
            for row in connection.exec_driver_sql(query, tuple(chunk)):
                found[tuple(row[1:])] = row[0]
        return [found[tuple(row[index] for index in self._key)] for row in rows]

    def _made(self, dialect: Dialect) -> tuple[str, str | None, str]:
        made = self._statements.get(dialect.name)
        if made is None:
            quote = dialect.identifier_preparer.quote
            table = quote(self.table.name)
            columns = ", ".join(map(quote, self.columns))
            values = ", ".join([_placeholder(dialect)] * len(self.columns))
            key = [quote(self.columns[index]) for index in self._key]
            made = (
                f"INSERT INTO {table} ({columns}) VALUES ({values})",
                f"COPY {table} ({columns}) FROM STDIN" if dialect.name == "postgresql" else None,
                f"SELECT id, {', '.join(key)} FROM {table} WHERE {key[0]} IN (" if key else "",
            )
            self._statements[dialect.name] = made
        return made


def chunks(values: Iterable[_T]) -> Iterator[list[_T]]:
    """`values` in lists of at most `CHUNK`, one per statement of an IN list: a cycle may
    name more workloads than a statement may carry parameters."""
    listed = list(values)
    for start in range(0, len(listed), CHUNK):
        yield listed[start : start + CHUNK]


def read_in(
    connection: Connection, statement: Executable, key: str, values: Iterable[Any], **given: Any
) -> list[Row[*tuple[Any, ...]]]:
    """The rows of `statement`, whose expanding parameter `key` is given `values`, run once
    per chunk of them (`chunks`): by chunk, in each chunk's order."""
    return [
        row
        for chunk in chunks(values)
        for row in connection.execute(statement, {**given, key: chunk})
    ]


def _placeholder(dialect: Dialect) -> str:
    try:
        return _PLACEHOLDERS[dialect.paramstyle]
    except KeyError:
        raise ValueError(f"no positional placeholder for {dialect.paramstyle!r}") from None


def _copy(connection: Connection, statement: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Send `rows` with COPY on the connection's own psycopg connection (its transaction);
    the driver's errors are raised as SQLAlchemy raises them for its statements."""
    driver = connection.connection.driver_connection
    assert driver is not None
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except connection.dialect.loaded_dbapi.Error as error:
        raise DBAPIError.instance(
            statement, None, error, connection.dialect.loaded_dbapi.Error
        ) from error
