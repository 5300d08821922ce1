"""An export reads a batch straight into Arrow columns the server computes (``read_batches``):
every column must be what the record path (``read``, then ``arrow_chunks``) gives for the same
rows, on duetime's store and on NServiceBus's TimeoutData, at the ends of the time range, with and
without groups; and on a database without that path (MariaDB) it is the record path. A server
before PostgreSQL 14 computes no record columns (its ``extract`` can miss a microsecond): its
exports, staging and same-database moves go through Python."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.bulk.frames import arrow_chunks
from duetime.bulk.migrate import MigrationSpec, _current_run, process_batch
from duetime.bulk.sources import DbSource
from duetime.bulk.targets import open_target
from duetime.clock import SYSTEM, to_micros
from duetime.nservicebus_wire import EMPTY_GUID
from duetime.registry import open_sql_database, open_sync_store
from tests.bulk.conftest import create_timeoutdata, timeout_rows
from tests.bulk.test_migrate import store_rows
from tests.bulk.test_nservicebus_sources import create_timeoutdata_as_nservicebus, insert, persister_row
from tests.services import mariadb_database, postgres_schema


def _both_ways(
    url: str, endpoint: str, *, in_the_server: bool = True, cutoff: int | None = None
) -> tuple[pa.Table, pa.Table]:
    source = DbSource(open_sql_database(url), in_flight=True)
    now = to_micros(SYSTEM.now())
    batches = source.plan(endpoint, cutoff, now, 1000)
    records = pa.Table.from_batches(
        [b for batch in batches for b in arrow_chunks((r, None) for r in source.read(batch, cutoff, now))]
    )
    if in_the_server:  # proof that the columns did not come through records

        def no_records(*_: object) -> None:
            raise AssertionError("read through records")

        source.read = no_records  # type: ignore[method-assign,assignment]
    columns = pa.Table.from_batches([b for batch in batches for b in source.read_batches(batch, cutoff, now)])
    return records.sort_by("message_id"), columns.sort_by("message_id")


def _assert_same(records: pa.Table, columns: pa.Table, rows: int) -> None:
    assert records.num_rows == columns.num_rows == rows
    assert records.schema == columns.schema
    for name in records.column_names:
        if name == "extra":  # the same JSON object; the server spaces its text differently
            parsed = [
                [None if v is None else json.loads(v) for v in t[name].to_pylist()]
                for t in (records, columns)
            ]
            assert parsed[0] == parsed[1]
        else:
            assert records[name].equals(columns[name]), name


def _store(url: str) -> None:
    store = open_sync_store(url)
    store.setup_infrastructure("ex")
    store.initialize("ex", TransactionMode.AT_LEAST_ONCE)
    store.store_many(
        [
            DelayedMessage("first", "q", datetime(1970, 1, 1, tzinfo=UTC), b"", {}, 0),
            DelayedMessage(
                "last",
                "q",
                datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                bytes(range(256)),
                {"e": ""},
            ),
            DelayedMessage(
                "grouped",
                "q",
                datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
                b"x",
                {"ключ": "значение"},
                7,
                "saga-7",
            ),
            *(
                DelayedMessage(
                    f"m{i}",
                    f"d{i % 3}",
                    datetime(2031, 1, 1, 0, 0, i % 60, i, tzinfo=UTC),
                    b"b" * i,
                    {"n": str(i)},
                )
                for i in range(200)
            ),
        ]
    )
    store.close()


def test_a_duetime_store_reads_the_same_both_ways() -> None:
    with postgres_schema() as url:
        _store(url)
        _assert_same(*_both_ways(url, "ex"), 203)


def test_timeoutdata_reads_the_same_both_ways() -> None:
    with postgres_schema() as url:
        db = open_sql_database(url)
        create_timeoutdata_as_nservicebus(db)
        rows = [
            persister_row("no-saga", datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
            persister_row(
                "saga", datetime(2030, 1, 1, tzinfo=UTC), saga="6f0c5c2e-8f55-4c1a-9d7e-2b1f3a9c6d10"
            ),
            persister_row("before-1970", datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
            persister_row("year-one", datetime(1, 1, 1, tzinfo=UTC)),
            persister_row("year-9999", datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        ]
        rows.append((str(uuid.uuid4()), rows[0][1], None, None, *rows[0][4:]))  # no SagaId, no State
        assert rows[0][2] == EMPTY_GUID
        insert(db, rows)
        every = to_micros(datetime(1, 1, 1, tzinfo=UTC))  # not the tool's 2012: the edge rows too
        _assert_same(*_both_ways(url + "&layout=timeoutdata", "Shipping.Policy", cutoff=every), 6)


@pytest.mark.parametrize("timeoutdata", [False, True])
def test_mariadb_reads_records_for_either(timeoutdata: bool) -> None:
    with mariadb_database() as url:
        if timeoutdata:
            db = open_sql_database(url)
            create_timeoutdata_as_nservicebus(db)
            insert(db, [persister_row("one", datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC))])
            source = url + ("&" if "?" in url else "?") + "layout=timeoutdata"
            _assert_same(*_both_ways(source, "Shipping.Policy", in_the_server=False), 1)
        else:
            _store(url)
            _assert_same(*_both_ways(url, "ex", in_the_server=False), 203)


def test_a_server_before_postgresql_14_computes_no_record_columns() -> None:
    """Before 14, ``extract(epoch …)`` is double precision and can miss a microsecond: exports,
    staging and same-database moves then take the rows through Python."""
    with postgres_schema() as url:
        source = DbSource(open_sql_database(url), in_flight=True)

        class Info:
            server_version = 130011

        class Old:
            info = Info()

        assert not source.server_records(Old())
        with source.db.session(write=False) as conn:
            assert source.server_records(conn)


def test_without_server_records_a_same_database_move_goes_through_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a PostgreSQL 13 server gets: every batch staged and checked in Python, the rows moved
    exactly as the server path moves them (run here batch by batch, without Spark)."""

    monkeypatch.setattr(DbSource, "server_records", lambda self, conn: False)
    with postgres_schema() as url:
        rows = timeout_rows(250)
        create_timeoutdata(url, "Sales_TimeoutData", rows)
        spec = MigrationSpec(url + "&layout=timeoutdata", url, "Sales", batch_rows=100)
        source = DbSource(open_sql_database(spec.source))
        source.ensure_state_tables()
        run_id, _ = _current_run(source, spec, to_micros(SYSTEM.now()))
        assert run_id is not None
        open_target(spec.target).prepare(["Sales"])
        batches = source.batches(run_id)
        assert sum(process_batch(spec, run_id, int(b["batch"])) for b in batches) == 250
        assert {b["status"] for b in source.batches(run_id)} == {"completed"}
        moved = store_rows(url, "Sales")
        assert {str(r[0]) for r in rows} == set(moved)
        first = moved[str(rows[7][0])]
        assert (first.body, first.group) == (rows[7][3], str(rows[7][2]))
        assert first.due_at == rows[7][4].replace(tzinfo=UTC)
