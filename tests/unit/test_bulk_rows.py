"""`corral.store.bulk.Rows` on SQLite and PostgreSQL: rows written by the driver (SQLite's
executemany, PostgreSQL's COPY) read back as SQLAlchemy's own inserts would have written
them, their ids come back in the order of the rows, and a failure leaves nothing behind;
`one_of` finds every value it is given, however many."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    cast,
    insert,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError

from corral.store import Store
from corral.store.bulk import CHUNK, Rows, one_of, read_in
from corral.store.database import json_text

_METADATA = MetaData()
_PROBE = Table(
    "bulk_probe",
    _METADATA,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False),
    Column("part", Integer, nullable=False),
    Column("doc", JSON),
    Column("share", Float),
    Column("flag", Boolean),
    Column("note", Text, server_default="none"),
    UniqueConstraint("name", "part"),
)
_COLUMNS = ("name", "part", "doc", "share", "flag")


@pytest.fixture
def probe(store: Store) -> Store:
    _METADATA.create_all(store.engine)
    return store


def _row(name: str, part: int, doc: Any) -> tuple[Any, ...]:
    return (name, part, json_text(doc), part / 3, part % 2 == 0)


def test_ids_come_back_in_the_order_of_the_rows(probe: Store) -> None:
    rows = Rows(_PROBE, _COLUMNS, key=("name", "part"))
    # More names than one IN list takes, two parts each, given in no particular order.
    keys = [(f"w-{i}", part) for i in range(CHUNK + 150) for part in (0, 1)]
    random.Random(7).shuffle(keys)
    with probe.write() as session:
        ids = rows.insert_ids(session.connection(), [_row(n, p, None) for n, p in keys])
    assert len(set(ids)) == len(keys)
    with probe.read() as session:
        found = {row.id: (row.name, row.part) for row in session.execute(select(_PROBE))}
    assert [found[i] for i in ids] == keys
    with probe.write() as session:  # one row takes the one-statement path
        (one,) = rows.insert_ids(session.connection(), [_row("single", 0, None)])
    with probe.read() as session:
        assert session.execute(select(_PROBE.c.name).where(_PROBE.c.id == one)).scalar() == (
            "single"
        )


@pytest.mark.parametrize(
    "doc",
    [
        None,
        {"a": [1, 2.5, "x"], "nested": {"k": None}},
        {1: "key that is not a string"},
        ["é", 'quote " and \\ backslash', "\n"],
        [],
    ],
)
def test_rows_read_back_as_sqlalchemy_writes_them(probe: Store, doc: Any) -> None:
    rows = Rows(_PROBE, _COLUMNS)
    with probe.write() as session:
        session.execute(
            insert(_PROBE),
            [{"name": "orm", "part": 0, "doc": doc, "share": 0.0, "flag": True}],
        )
        # Two rows: PostgreSQL writes them with COPY, one row with an INSERT.
        rows.insert(session.connection(), [_row("driver", 0, doc), _row("driver", 1, doc)])
        rows.insert(session.connection(), [_row("driver", 2, doc)])
    with probe.read() as session:
        read = {
            (row.name, row.part): row
            for row in session.execute(select(_PROBE, cast(_PROBE.c.doc, Text).label("raw")))
        }
    orm = read[("orm", 0)]
    for part in (0, 1, 2):
        row = read[("driver", part)]
        assert row.raw == orm.raw  # the same text in the column, JSON null as null
        assert row.doc == orm.doc
        assert row.share == pytest.approx(part / 3)
        assert row.flag is (part % 2 == 0)
        assert row.note == "none"  # a column left out gets its database default


def test_a_failed_insert_leaves_nothing(probe: Store) -> None:
    rows = Rows(_PROBE, _COLUMNS, key=("name", "part"))
    with probe.write() as session:
        rows.insert(session.connection(), [_row("taken", 0, None)])
    for batch in ([_row("new", 0, None), _row("taken", 0, None)], [_row("taken", 0, None)]):
        with pytest.raises(IntegrityError), probe.write() as session:
            rows.insert(session.connection(), [_row("before", 0, {"x": 1})])
            rows.insert_ids(session.connection(), batch)
    with probe.read() as session:
        names = session.execute(text("SELECT name FROM bulk_probe")).scalars().all()
    assert names == ["taken"]


def test_a_column_whose_default_only_sqlalchemy_knows_is_not_left_out() -> None:
    table = Table(
        "bulk_defaults",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("name", String(8)),
        Column("state", String(8), default="bound"),
    )
    with pytest.raises(ValueError, match=r"bulk_defaults.*\['state'\]"):
        Rows(table, ("name",))
    Rows(table, ("name", "state"))  # given, it is fine


def test_rows_without_a_key_cannot_return_ids(probe: Store) -> None:
    rows = Rows(_PROBE, _COLUMNS)
    with pytest.raises(ValueError, match="no key"), probe.write() as session:
        rows.insert_ids(session.connection(), [_row("a", 0, None), _row("b", 0, None)])


def test_one_of_finds_every_value_given_however_many(probe: Store) -> None:
    rows = Rows(_PROBE, _COLUMNS, key=("name", "part"))
    names = [f"w-{i}" for i in range(2 * CHUNK + 5)]
    with probe.write() as session:
        ids = rows.insert_ids(session.connection(), [_row(n, 0, None) for n in names])
        rows.insert(session.connection(), [_row(names[0], 1, None)])
    by_name = select(_PROBE.c.name).where(
        one_of(_PROBE.c.name, "names"), _PROBE.c.part == bindparam("part")
    )
    by_id = select(_PROBE.c.id).where(one_of(_PROBE.c.id, "ids"))
    wanted = [*names[::2], "absent"]  # more than one IN list takes, and one not there
    with probe.read() as session:
        connection = session.connection()
        found = read_in(connection, by_name, "names", wanted, part=0)
        assert sorted(name for (name,) in found) == sorted(names[::2])
        assert [name for (name,) in read_in(connection, by_name, "names", names, part=1)] == [
            names[0]
        ]
        assert sorted(i for (i,) in read_in(connection, by_id, "ids", ids[1::3])) == ids[1::3]
        assert read_in(connection, by_id, "ids", []) == []
