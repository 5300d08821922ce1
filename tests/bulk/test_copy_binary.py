"""Rows written from Arrow columns land as the record-by-record write puts them: PostgreSQL's
binary COPY encoded by Arrow, and SQLite's and MariaDB's rows zipped from the columns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duetime.bulk.frames import arrow_chunks
from duetime.bulk.records import Record
from duetime.bulk.targets import StoreTarget
from duetime.registry import open_sql_database
from tests.services import mariadb_database, postgres_schema

HEADERS = [
    None,
    "",
    "{}",
    '{"a":"b"}',
    '{ "a" : "b" }',
    '{"a":null,"b":"c"}',
    '{"k":"nullable"}',
    '  {"a":"b"}',
    '<?xml version="1.0"?><ArrayOfHeaderInfo><HeaderInfo><Key>k</Key><Value>v</Value></HeaderInfo></ArrayOfHeaderInfo>',
    '{"NServiceBus.Timeouts.Properties.x":"1","y":"2"}',
    '{"ключ":"значение \\"q\\" \\\\ \\n"}',
]


def _records() -> list[Record]:
    records = []
    for i, headers in enumerate(HEADERS * 3):
        group = (
            None
            if i % 3 == 0
            else ('{"group": "saga-' + str(i) + '"}' if i % 3 == 1 else '{"group": "ü\\"x"}')
        )
        records.append(
            Record(
                "Sales",
                f"m{i}",
                "Sales.Orders" if i % 2 else "ö",
                [0, 1, -1 + 253_402_300_800_000_000 - 86_400_000_000 * 366, 1_900_000_000_123_456][i % 4],
                headers,
                bytes(range(i % 7 * 40)),
                i % 5,
                group,
            )
        )
    return records


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url.split("?")[0]) as conn:
        schema = url.split("schema=")[1]
        return conn.execute(
            f"SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key "
            f'FROM "{schema}"."Sales.delayed" ORDER BY message_id'
        ).fetchall()


def test_arrow_encoded_copy_writes_what_the_record_copy_writes() -> None:
    records = _records()
    with postgres_schema() as by_record, postgres_schema() as by_arrow:
        for url in (by_record, by_arrow):
            StoreTarget(open_sql_database(url)).prepare(["Sales"])
        StoreTarget(open_sql_database(by_record)).write("run", 0, records)
        batches = list(arrow_chunks((r, None) for r in records))
        assert StoreTarget(open_sql_database(by_arrow)).write_batches(
            "run", 0, iter(batches)
        ).inserted == len(records)
        assert _rows(by_arrow) == _rows(by_record)
        # an id already there: the batch goes in record by record, and says which clashed
        again = StoreTarget(open_sql_database(by_arrow)).write_batches(
            "run2",
            0,
            iter(list(arrow_chunks((r, None) for r in [records[0], records[0]._replace(message_id="new")]))),
        )
        assert (again.inserted, again.conflicts) == (1, (records[0].message_id,))


def test_several_endpoints_into_one_table_all_go_in() -> None:
    """``?table=`` puts every endpoint's rows into one table: each endpoint's part of a batch is
    written, none in place of another."""
    records = [r._replace(endpoint=f"e{i % 3}") for i, r in enumerate(_records())]
    with postgres_schema() as url:
        target = StoreTarget(open_sql_database(url + "&table=shared"))
        target.prepare(["e0"])
        batches = iter(list(arrow_chunks((r, None) for r in records)))
        assert target.write_batches("run", 0, batches).inserted == len(records)
        with psycopg.connect(url.split("?")[0]) as conn:
            schema = url.split("schema=")[1]
            count = conn.execute(f'SELECT count(*) FROM "{schema}".shared').fetchone()
        assert count == (len(records),)


@contextlib.contextmanager
def _sqlite(folder: Path, name: str) -> Iterator[str]:
    yield f"sqlite:///{folder / name}.db"


def _table(url: str) -> list[tuple[Any, ...]]:
    db = open_sql_database(url)
    with db.session(write=False) as conn:
        rows = db.execute(
            conn,
            "SELECT message_id, destination, due_at, headers, body, failure_count, group_key "
            f"FROM {db.qualified('Sales.delayed')} ORDER BY message_id",
        ).fetchall()
    return [tuple(bytes(v) if isinstance(v, bytes | bytearray | memoryview) else v for v in r) for r in rows]


@pytest.mark.parametrize("dialect", ["sqlite", "mariadb"])
def test_rows_zipped_from_arrow_columns_are_the_rows_records_make(dialect: str, tmp_path: Path) -> None:
    """SQLite and MariaDB: every header form (XML, null, MSMQ properties, leading spaces),
    groups, bodies, due-time extremes; an id given twice and one already stored are left out and
    named, as the record path does."""
    records = _records()

    def place(name: str) -> contextlib.AbstractContextManager[str]:
        return _sqlite(tmp_path, name) if dialect == "sqlite" else mariadb_database()

    with place("records") as by_record, place("arrow") as by_arrow:
        for url in (by_record, by_arrow):
            StoreTarget(open_sql_database(url)).prepare(["Sales"])
        twice = [*records, records[1]]
        plain = StoreTarget(open_sql_database(by_record)).write("run", 0, twice)
        batches = list(arrow_chunks((r, None) for r in twice))
        zipped = StoreTarget(open_sql_database(by_arrow)).write_batches("run", 0, iter(batches))
        assert (
            (zipped.inserted, zipped.conflicts)
            == (plain.inserted, plain.conflicts)
            == (
                len(records),
                (records[1].message_id,),
            )
        )
        assert _table(by_arrow) == _table(by_record)
        again = StoreTarget(open_sql_database(by_arrow)).write_batches(
            "run2",
            0,
            iter(list(arrow_chunks((r, None) for r in [records[0], records[0]._replace(message_id="new")]))),
        )
        assert (again.inserted, again.conflicts) == (1, (records[0].message_id,))


def test_a_copy_type_the_encoder_does_not_know_is_refused_not_guessed() -> None:
    """The store's writer says what each column is sent as; a type the Arrow encoder has no
    encoding for stops the write instead of sending bytes the server would misread."""
    from duetime.bulk.copybinary import copy_rows

    batch = next(iter(arrow_chunks((r, None) for r in _records()[:3])))
    with pytest.raises(ValueError, match="'uuid'"):
        copy_rows(batch, ("uuid", "text", "timestamptz", "text", "bytea", "int4", "text"))
    with pytest.raises(ValueError, match="6 COPY types"):
        copy_rows(batch, ("text",) * 6)
