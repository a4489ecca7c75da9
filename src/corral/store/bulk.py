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
key in between. On PostgreSQL it takes the new ids from the table's sequence first and
copies them with the rows: one statement fewer, and no search of the rows just written.

`one_of` is a column's test against a list of values given as one parameter: on
PostgreSQL an array (`= ANY`), whose statement text is the same for any number of values,
so that neither SQLAlchemy nor the driver renders and parses a placeholder for each (a
thousand names cost them about as much as the database's work on them); elsewhere an
expanding IN list, in chunks (`read_in`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Dialect,
    Executable,
    Row,
    Table,
    any_,
    bindparam,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import QueryableAttribute
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.visitors import InternalTraversal

# Values per IN list (SQLite's default bound is 32,766 variables per statement, older
# builds 999; PostgreSQL's 65,535, but there `one_of` takes any number in one array).
CHUNK = 900
# The dialects on which `one_of` is an array parameter.
_ARRAYS = frozenset({"postgresql"})

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
        self._statements: dict[str, _Statements] = {}

    def insert(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert `rows`."""
        if not rows:
            return
        made = self._made(connection.dialect)
        if made.copy is None or len(rows) == 1:
            connection.exec_driver_sql(made.insert, list(rows))
        else:
            _copy(connection, made.copy, rows)

    def insert_ids(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        """Insert `rows` and return their ids, in the order of `rows`."""
        if not rows:
            return []
        made = self._made(connection.dialect)
        if not made.select:
            raise ValueError(f"{self.table.name}: no key to find new rows by")
        if len(rows) == 1:  # one statement either way
            return [connection.exec_driver_sql(f"{made.insert} RETURNING id", rows[0]).scalar_one()]
        if made.copy_ids is not None:
            # Ascending, in the order of the rows, as the column's default gives them.
            ids = sorted(connection.exec_driver_sql(made.next_ids, (len(rows),)).scalars())
            _copy(connection, made.copy_ids, [(i, *row) for i, row in zip(ids, rows, strict=True)])
            return ids
        self.insert(connection, rows)
        placeholder = _placeholder(connection.dialect)
        wanted = list({row[self._key[0]] for row in rows})
        found: dict[tuple[Any, ...], int] = {}
        for chunk in chunks(wanted):
            query = f"{made.select}{', '.join([placeholder] * len(chunk))})"
            for row in connection.exec_driver_sql(query, tuple(chunk)):
                found[tuple(row[1:])] = row[0]
        return [found[tuple(row[index] for index in self._key)] for row in rows]

    def _made(self, dialect: Dialect) -> _Statements:
        made = self._statements.get(dialect.name)
        if made is None:
            quote = dialect.identifier_preparer.quote
            table = quote(self.table.name)
            columns = ", ".join(map(quote, self.columns))
            values = ", ".join([_placeholder(dialect)] * len(self.columns))
            key = [quote(self.columns[index]) for index in self._key]
            postgresql = dialect.name == "postgresql"
            made = _Statements(
                f"INSERT INTO {table} ({columns}) VALUES ({values})",
                f"SELECT id, {', '.join(key)} FROM {table} WHERE {key[0]} IN (" if key else "",
                f"COPY {table} ({columns}) FROM STDIN" if postgresql else None,
                f"COPY {table} (id, {columns}) FROM STDIN" if postgresql else None,
                # The sequence is looked up once per statement, not once per id.
                "SELECT nextval(owned.sequence) FROM (SELECT CAST(pg_get_serial_sequence("
                f"'{table}', 'id') AS regclass) AS sequence) AS owned, generate_series(1, %s)"
                if postgresql
                else "",
            )
            self._statements[dialect.name] = made
        return made


class _Statements(NamedTuple):
    """A `Rows`'s statements on one kind of database."""

    insert: str
    # The start of the select of ids by key ("" without a key).
    select: str
    # COPY, and COPY with the id column first (None where there is no COPY).
    copy: str | None
    copy_ids: str | None
    # As many new ids as its parameter, from the id column's sequence (with copy_ids).
    next_ids: str


class _OneOf(ColumnElement[bool]):
    """See `one_of`."""

    inherit_cache = True
    _traverse_internals: list[tuple[str, InternalTraversal]] = [  # noqa: RUF012 (as declared)
        ("column", InternalTraversal.dp_clauseelement),
        ("key", InternalTraversal.dp_string),
    ]
    type = Boolean()

    def __init__(self, column: ColumnElement[Any], key: str) -> None:
        self.column = column
        self.key = key


def one_of(column: ColumnElement[Any] | QueryableAttribute[Any], key: str) -> ColumnElement[bool]:
    """`column` is one of the values of the parameter `key` (a list): `column = ANY(:key)`
    with an array on PostgreSQL, an expanding `IN` elsewhere. Run the statement with
    `read_in`, which gives the values in chunks where each is a parameter of its own."""
    if isinstance(column, QueryableAttribute):
        column = column.__clause_element__()
    return _OneOf(column, key)


@compiles(_OneOf)
def _in_list(element: _OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.in_(bindparam(element.key, expanding=True)), **kw)


@compiles(_OneOf, "postgresql")
def _any(element: _OneOf, compiler: SQLCompiler, **kw: Any) -> str:
    array = bindparam(element.key, type_=ARRAY(element.column.type))
    return compiler.process(element.column == any_(array), **kw)


def chunks(values: Iterable[_T]) -> Iterator[list[_T]]:
    """`values` in lists of at most `CHUNK`, one per statement of an IN list: a cycle may
    name more workloads than a statement may carry parameters."""
    listed = list(values)
    for start in range(0, len(listed), CHUNK):
        yield listed[start : start + CHUNK]


def read_in(
    connection: Connection, statement: Executable, key: str, values: Iterable[Any], **given: Any
) -> list[Row[*tuple[Any, ...]]]:
    """The rows of `statement`, whose `one_of` parameter `key` is given `values`: run once
    with all of them where that is an array, else once per chunk of them (`chunks`), by
    chunk, in each chunk's order."""
    return [
        row
        for chunk in each_chunk(connection, values)
        for row in connection.execute(statement, {**given, key: chunk})
    ]


def each_chunk(connection: Connection, values: Iterable[_T]) -> Iterator[list[_T]]:
    """`values` in as few lists as a statement on `connection` with a `one_of` test takes:
    one where it is an array, else `chunks`."""
    if connection.dialect.name in _ARRAYS:
        yield list(values)
    else:
        yield from chunks(values)


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
