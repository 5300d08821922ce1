"""Migration on a local SparkSession: every source and target, problems, resume, abort."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.bulk.migrate import MigrationSpec, abort, migrate, process_batch
from duetime.bulk.preview import preview
from duetime.bulk.sources import DbSource
from duetime.bulk.targets import StoreTarget, open_target
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError
from duetime.registry import open_sql_database, open_sync_store
from tests.bulk.conftest import count, create_msmq, create_timeoutdata, table_rows, timeout_rows
from tests.services import POSTGRES, mariadb_database, postgres_database, postgres_schema


def store_rows(url: str, endpoint: str) -> dict[str, DelayedMessage]:
    store = open_sync_store(url)
    try:
        store.setup_infrastructure(endpoint)
        store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
        from duetime.interfaces import ListQuery

        got: dict[str, DelayedMessage] = {}
        query = ListQuery(limit=1000)
        while True:
            page = store.list(query)
            got.update({m.message_id: m for m in page.messages})
            if page.next_cursor is None:
                return got
            query = ListQuery(limit=1000, after=page.next_cursor)
    finally:
        store.close()


#: The migration module itself, for its steps one at a time (``_current_run``, ``batch_of``).
MIGRATE = sys.modules["duetime.bulk.migrate"]


def _run_started(spec: MigrationSpec) -> tuple[DbSource, str, list[dict[str, Any]]]:
    """The spec's source with its state tables, and a run of it started (planned, nothing
    moved): the source, the run's id and its batches' rows."""
    src = DbSource(open_sql_database(spec.source))
    src.ensure_state_tables()
    run_id, _ = MIGRATE._current_run(src, spec, to_micros(datetime.now(UTC)))
    assert run_id is not None
    return src, run_id, src.batches(run_id)


def test_timeoutdata_in_postgres_moves_into_the_duetime_store_with_problems_left_behind(spark: Any) -> None:
    with postgres_schema() as pg:
        rows = timeout_rows(2500)
        bad = timeout_rows(3)
        bad[0] = (bad[0][0], None, *bad[0][2:])  # no destination
        bad[1] = (*bad[1][:5], "{not json", bad[1][6])  # unreadable headers
        bad[2] = (*bad[2][:4], datetime(9999, 12, 31), *bad[2][5:])  # DateTime.MaxValue: out of range
        legacy = create_timeoutdata(pg, "Sales_TimeoutData", rows + bad)
        before = {r[0]: r for r in table_rows(legacy, "Sales_TimeoutData", "Id")}
        source = pg + "&layout=timeoutdata"

        found = preview(spark, source, "Sales")
        assert found.total == 2503 and count(legacy, "Sales_TimeoutData") == 2503  # preview changed nothing
        assert found.problem_counts == {
            "invalid or missing destination": 1,
            "unreadable headers": 1,
            "due time missing or out of range": 1,
        }
        [group] = [g for g in found.groups if g.destination == "orders"]
        assert group.count == 2502

        result = migrate(spark, MigrationSpec(source, pg, "Sales", batch_rows=500))
        assert (result.planned, result.staged, result.inserted, result.put_back) == (2503, 2503, 2500, 3)
        assert result.remaining == 3
        moved = store_rows(pg, "Sales")
        assert len(moved) == 2500
        for ident, row in before.items():
            if str(ident) in moved:
                m = moved[str(ident)]
                assert m.destination == row[1] and m.body == row[3]
                assert m.due_at == row[4].replace(tzinfo=UTC)  # to the microsecond
                assert m.headers == json.loads(row[5])
        # the three problem rows are back in the legacy table exactly as they were
        assert {r[0]: r for r in table_rows(legacy, "Sales_TimeoutData", "Id")} == {
            r[0]: before[r[0]] for r in (b for b in bad)
        }
        again = migrate(spark, MigrationSpec(source, pg, "Sales", batch_rows=500))
        assert again.inserted == 0 and len(store_rows(pg, "Sales")) == 2500


def test_a_same_database_move_checks_in_python_only_what_the_server_cannot_vouch_for(spark: Any) -> None:
    """Rows the server can vouch for never leave it; a valid row it cannot (a destination with a
    space, pretty-printed headers, a null header a store drops) is checked in Python and moves
    too, in the same transaction; an id the target already holds stays in the source as a
    conflict; a due time in the year 9998 keeps its microsecond."""
    with postgres_schema() as pg:
        rows = timeout_rows(300)
        rows[0] = (rows[0][0], "Sales Orders", *rows[0][2:])
        rows[1] = (*rows[1][:5], json.dumps({"a": "1", "b": "2"}, indent=2), rows[1][6])
        rows[2] = (*rows[2][:4], datetime(9998, 12, 31, 23, 59, 59, 999_999), *rows[2][5:])
        rows[3] = (*rows[3][:5], '{"a":"1","empty":""}', rows[3][6])
        rows[6] = (*rows[6][:5], '{"a":"1","gone":null}', rows[6][6])  # rewritten on the way
        legacy = create_timeoutdata(pg, "Sales_TimeoutData", rows)
        store = open_sync_store(pg)
        store.setup_infrastructure("Sales")
        store.initialize("Sales", TransactionMode.AT_LEAST_ONCE)
        taken = DelayedMessage(str(rows[4][0]), "elsewhere", datetime(2031, 1, 1, tzinfo=UTC))
        store.store(taken)
        store.close()
        result = migrate(spark, MigrationSpec(pg + "&layout=timeoutdata", pg, "Sales", batch_rows=100))
        assert (result.staged, result.inserted, result.put_back) == (300, 299, 1), result.notes
        assert any("already in the target" in n for n in result.notes)
        moved = store_rows(pg, "Sales")
        assert moved[str(rows[0][0])].destination == "Sales Orders"
        assert moved[str(rows[1][0])].headers == {"a": "1", "b": "2"}
        assert moved[str(rows[2][0])].due_at == datetime(9998, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
        assert moved[str(rows[3][0])].headers == {"a": "1", "empty": ""}
        assert moved[str(rows[6][0])].headers == {"a": "1"}
        assert moved[str(rows[5][0])].group == str(rows[5][2])  # the saga id
        assert moved[str(rows[4][0])].destination == "elsewhere"  # never overwritten
        assert [r[0] for r in table_rows(legacy, "Sales_TimeoutData", "Id")] == [rows[4][0]]


def test_a_move_into_a_store_in_another_postgres_database_pipes_rows_exactly(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two PostgreSQL databases a batch's rows stream from the source server's COPY into
    the target's (never decoded in Python) and arrive exactly: bodies, microseconds up to the year
    9998, headers, the saga id as the group. A batch whose headers a store must rewrite (a null
    value) or that carries an id the target holds goes through Python instead; problems stay
    behind; a second run moves nothing; a batch is piped or written once, never both."""
    with postgres_schema() as pg, postgres_database() as other:
        rows = timeout_rows(1_000)
        rows[3] = (*rows[3][:4], datetime(9998, 12, 31, 23, 59, 59, 999_999), *rows[3][5:])
        rows[5] = (*rows[5][:5], None, rows[5][6])  # no headers at all: none
        rows[450] = (*rows[450][:5], '{"a":"1","gone":null}', rows[450][6])  # rewritten in Python
        rows[999] = (rows[999][0], None, *rows[999][2:])  # no destination: stays behind
        legacy = create_timeoutdata(pg, "Sales_TimeoutData", rows)
        before = {r[0]: r for r in table_rows(legacy, "Sales_TimeoutData", "Id")}
        store = open_sync_store(other)
        store.setup_infrastructure("Sales")
        store.initialize("Sales", TransactionMode.AT_LEAST_ONCE)
        # in the last batch (by block): put back, it lands at the table's end, which no batch reads again
        taken = DelayedMessage(str(rows[998][0]), "elsewhere", datetime(2031, 1, 1, tzinfo=UTC))
        store.store(taken)
        store.close()
        spec = MigrationSpec(pg + "&layout=timeoutdata", other, "Sales", batch_rows=250)
        src, run_id, _ = _run_started(spec)
        StoreTarget(open_sql_database(other)).prepare(["Sales"])
        ways: list[str] = []
        for name in ("write_piped", "write"):
            real = getattr(StoreTarget, name)

            def spy(self: StoreTarget, *args: Any, _real: Any = real, _name: str = name) -> Any:
                done = _real(self, *args)
                ways.append(f"{_name}:{'none' if done is None else done.inserted}")
                return done

            monkeypatch.setattr(StoreTarget, name, spy)
        moved_rows = sum(process_batch(spec, run_id, b["batch"]) for b in src.batches(run_id))
        assert moved_rows == 1_000
        # the first and third batches piped; the null header's (second) through Python; the last
        # piped until the taken id clashed, rolled back, then through Python (which tells it apart)
        paths = ["write_piped", "write", "write_piped", "write_piped", "write"]
        assert [w.split(":")[0] for w in ways] == paths
        assert ways[3] == "write_piped:none"
        assert sum(int(w.split(":")[1]) for w in ways if w[-1].isdigit()) == 998
        moved = store_rows(other, "Sales")
        assert len(moved) == 999 and moved[str(rows[998][0])] == taken  # 998 moved, and the one taken
        for ident, row in before.items():
            if str(ident) in moved and ident != rows[998][0]:
                got = moved[str(ident)]
                assert (got.destination, got.body) == (row[1], row[3])
                assert got.due_at == row[4].replace(tzinfo=UTC)  # to the microsecond
                assert got.group == str(row[2])
                assert got.headers == {k: v for k, v in json.loads(row[5] or "{}").items() if v is not None}
        assert {r[0] for r in table_rows(legacy, "Sales_TimeoutData", "Id")} == {rows[998][0], rows[999][0]}
        monkeypatch.undo()
        finished = migrate(spark, spec)  # the run the batches above belong to, summed up
        assert (finished.inserted, finished.put_back) == (998, 2)
        again = migrate(spark, spec)  # a new run: the two left behind stay behind
        assert again.inserted == 0 and len(store_rows(other, "Sales")) == 999


def test_a_same_database_move_into_a_target_holding_most_ids_leaves_them_as_conflicts(spark: Any) -> None:
    """More than a thousand conflicts in a batch take the anti-join (the id list, compared id by
    id, grows with the square of the batch before PostgreSQL 15): the 1,500 ids the target holds
    stay in the source untouched, the other 100 move."""
    with postgres_schema() as pg:
        rows = timeout_rows(1_600)
        legacy = create_timeoutdata(pg, "Sales_TimeoutData", rows)
        store = open_sync_store(pg)
        store.setup_infrastructure("Sales")
        store.initialize("Sales", TransactionMode.AT_LEAST_ONCE)
        due = datetime(2031, 1, 1, tzinfo=UTC)
        store.store_many([DelayedMessage(str(r[0]), "elsewhere", due) for r in rows[100:]])
        store.close()
        result = migrate(spark, MigrationSpec(pg + "&layout=timeoutdata", pg, "Sales", batch_rows=5_000))
        assert (result.batches, result.inserted, result.put_back) == (1, 100, 1_500), result.notes
        assert {r[0] for r in table_rows(legacy, "Sales_TimeoutData", "Id")} == {r[0] for r in rows[100:]}
        moved = store_rows(pg, "Sales")
        assert sum(m.destination == "orders" for m in moved.values()) == 100


def test_mariadb_timeoutdata_and_msmq_layouts_move_into_a_mariadb_store(spark: Any) -> None:
    with mariadb_database() as db:
        create_timeoutdata(db, "Billing_TimeoutData", timeout_rows(300, destination="billing"))
        due = datetime(2031, 5, 1, 9, 0, 0, 123456)
        msmq_rows = [
            (
                f"m{i}",
                "invoices",
                b"body",
                due + timedelta(seconds=i),
                json.dumps({"k": str(i)}).encode(),
                i % 3,
            )
            for i in range(200)
        ]
        create_msmq(db, "legacy_invoices", msmq_rows)
        r1 = migrate(spark, MigrationSpec(db + "?layout=timeoutdata", db, batch_rows=100))
        create_msmq(db, "Clash.delayed", msmq_rows[:1])  # seed 004's default name is duetime's too
        with pytest.raises(ConfigurationError, match="not a duetime store"):
            migrate(spark, MigrationSpec(db + "?layout=msmq&table=Clash.delayed", db, "Clash"))
        r2 = migrate(
            spark, MigrationSpec(db + "?layout=msmq&table=legacy_invoices", db, "Invoices", batch_rows=100)
        )
        assert (r1.inserted, r2.inserted) == (300, 200)
        billing = store_rows(db, "Billing")
        invoices = store_rows(db, "Invoices")
        assert len(billing) == 300 and {m.destination for m in billing.values()} == {"billing"}
        assert invoices["m7"].due_at == (due + timedelta(seconds=7)).replace(tzinfo=UTC)
        assert invoices["m7"].headers == {"k": "7"} and invoices["m7"].failure_count == 1


def seed_store(
    url: str, endpoint: str, n: int, destination: str = "orders", start: datetime | None = None
) -> list[DelayedMessage]:
    base = start or datetime.now(UTC) + timedelta(hours=2)
    messages = [
        DelayedMessage(
            f"{endpoint}-{i}",
            destination,
            base + timedelta(seconds=i, microseconds=7),
            bytes([i % 256]) * (i % 50),
            {"n": str(i), "ü": "✓"},
            i % 4,
        )
        for i in range(n)
    ]
    store = open_sync_store(url)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    store.store_many(messages)
    store.close()
    return messages


def test_every_endpoint_of_a_sqlite_store_moves_to_postgres_then_mariadb_with_a_cutoff(
    spark: Any, tmp_path: Path
) -> None:
    sqlite = f"sqlite:///{tmp_path / 'old.db'}"
    a = seed_store(sqlite, "alpha", 120)
    b = seed_store(sqlite, "beta", 80, destination="shipping")
    with postgres_schema() as pg, mariadb_database() as maria:
        result = migrate(spark, MigrationSpec(sqlite, pg, batch_rows=100))
        assert result.inserted == 200 and result.remaining == 0
        assert store_rows(pg, "alpha") == {m.message_id: m for m in a}
        assert store_rows(pg, "beta") == {m.message_id: m for m in b}
        cutoff = a[59].due_at  # inclusive, as the timeout migration tool's Time >= @CutOffTime
        moved = migrate(spark, MigrationSpec(pg, maria, "alpha", cutoff=cutoff, batch_rows=100))
        assert moved.inserted == 61
        assert store_rows(maria, "alpha") == {m.message_id: m for m in a[59:]}
        assert store_rows(pg, "alpha") == {m.message_id: m for m in a[:59]}


def test_claimed_messages_are_in_flight_and_left_for_their_dispatcher(spark: Any, tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path / 'live.db'}"
    seed_store(sqlite, "live", 10, start=datetime.now(UTC) - timedelta(seconds=5))
    store = open_sync_store(sqlite)
    store.initialize("live", TransactionMode.AT_LEAST_ONCE)
    claimed = store.fetch_due(datetime.now(UTC), 4)
    store.close()
    target = f"sqlite:///{tmp_path / 'new.db'}"
    result = migrate(spark, MigrationSpec(sqlite, target, "live", batch_rows=100))
    assert result.inserted == 6 and result.remaining == 4
    assert not set(store_rows(target, "live")) & {m.message_id for m in claimed}


def test_a_migration_stopped_at_each_step_resumes_without_losing_or_doubling(spark: Any) -> None:
    with postgres_schema() as pg:
        legacy = create_timeoutdata(pg, "Crm_TimeoutData", timeout_rows(1000))
        source = pg + "&layout=timeoutdata"
        spec = MigrationSpec(source, pg, "Crm", batch_rows=250)
        src, run_id, batches = _run_started(spec)
        target = StoreTarget(open_sql_database(pg))
        target.prepare(["Crm"])
        assert [b["status"] for b in batches] == ["pending"] * 4
        # batch 0: staged only (killed before writing); batch 1: written, killed before completing
        src.stage(run_id, MIGRATE.batch_of(batches[0]), None, to_micros(datetime.now(UTC)))
        src.stage(run_id, MIGRATE.batch_of(batches[1]), None, to_micros(datetime.now(UTC)))
        written = target.write(run_id, 1, src.staged(run_id, 1))
        assert written.inserted == batches[1]["planned"]
        # the target's dispatcher delivers (removes) some of batch 1 before the resume
        delivered = [r.message_id for r in src.staged(run_id, 1)[:10]]
        store = open_sync_store(pg)
        store.initialize("Crm", TransactionMode.AT_LEAST_ONCE)
        assert store.remove_many(delivered) == 10
        store.close()
        # hidden from the source's dispatchers while staged
        assert count(legacy, "Crm_TimeoutData") == 1000 - batches[0]["planned"] - batches[1]["planned"]
        result = migrate(spark, spec)  # the same command again
        assert result.run_id == run_id and result.inserted == 1000
        assert count(legacy, "Crm_TimeoutData") == 0
        assert len(store_rows(pg, "Crm")) == 990  # the delivered ten did not come back
        assert process_batch(spec, run_id, 0) == 0  # a finished batch is left alone


def test_abort_puts_back_everything_the_target_has_not_committed(spark: Any) -> None:
    with postgres_schema() as pg:
        legacy = create_timeoutdata(pg, "Ops_TimeoutData", timeout_rows(600))
        before = table_rows(legacy, "Ops_TimeoutData", "Id")
        source = pg + "&layout=timeoutdata"
        spec = MigrationSpec(source, pg, "Ops", batch_rows=200)
        src, run_id, batches = _run_started(spec)
        for row in batches:
            src.stage(run_id, MIGRATE.batch_of(row), None, to_micros(datetime.now(UTC)))
        target = StoreTarget(open_sql_database(pg))
        target.prepare(["Ops"])
        committed = target.write(run_id, 0, src.staged(run_id, 0))  # batch 0 reached the target
        assert count(legacy, "Ops_TimeoutData") == 0
        result = abort(spec)
        assert result.status == "aborted"
        assert len(store_rows(pg, "Ops")) == committed.inserted
        left = table_rows(legacy, "Ops_TimeoutData", "Id")
        assert len(left) == 600 - committed.inserted
        assert set(left) <= set(before)  # put back exactly as they were (saga ids, versions, times)
        assert abort(spec).notes == ["no unfinished run of this migration: nothing to abort."]
        # a new migration after an abort starts a new run and moves the rest
        assert migrate(spark, spec).inserted == 600 - committed.inserted


def test_files_are_a_source_and_a_target(spark: Any, tmp_path: Path) -> None:
    with postgres_schema() as pg:
        messages = seed_store(pg, "files", 150)
        for fmt in ("parquet", "jsonl"):
            out = tmp_path / fmt
            result = migrate(
                spark, MigrationSpec(pg + "&table=files.delayed", f"{fmt}:{out}", "files", batch_rows=100)
            )
            assert result.inserted == 150
            back = f"sqlite:///{tmp_path / (fmt + '.db')}"
            imported = migrate(spark, MigrationSpec(f"{fmt}:{out}", back))
            assert imported.inserted == 150, imported
            assert store_rows(back, "files") == {m.message_id: m for m in messages}
            # the source was drained into the files; put it back for the next format
            messages = seed_store(pg, "files", 150)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_files_naming_several_endpoints_fill_a_store_table_each(spark: Any, tmp_path: Path, fmt: str) -> None:
    """The driver creates the store tables of the endpoints the files name (Spark reads that one
    field) before the tasks start, in several partitions at once; then each row is checked and
    written in one pass. A row naming no endpoint takes the option's; an endpoint whose only row is
    rejected gets an empty table, and the row is counted as rejected; a row naming an endpoint no
    table may be named after (or, in JSON, a number) is rejected, the rest go in."""
    due = "2031-01-01T00:00:00+00:00"
    rows = [{"endpoint": f"e{i % 3}", "id": f"m{i}", "destination": "q", "due_at": due} for i in range(300)]
    rows += [
        {"endpoint": "", "id": "plain", "destination": "q", "due_at": due},
        {"endpoint": "bad", "id": "nodue", "destination": "q", "due_at": None},
        {"endpoint": "no such name", "id": "spaced", "destination": "q", "due_at": due},  # rejected
    ]
    source = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        rows.append({"endpoint": 5, "id": "numbered", "destination": "q", "due_at": due})  # rejected
        source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), source)
    with postgres_schema() as pg:
        result = migrate(spark, MigrationSpec(f"{fmt}:{source}", pg, "fallback", batch_rows=100))
        rejected = 3 if fmt == "jsonl" else 2
        assert (result.inserted, result.put_back) == (301, rejected) and result.batches >= 3, result
        assert any(n.startswith("spaced: endpoint name 'no such name' is not allowed") for n in result.notes)
        for e in range(3):
            assert set(store_rows(pg, f"e{e}")) == {f"m{i}" for i in range(300) if i % 3 == e}
        assert set(store_rows(pg, "fallback")) == {"plain"}
        db = open_sql_database(pg)
        with db.session() as conn:
            assert db.table_exists(conn, "bad.delayed")
        assert store_rows(pg, "bad") == {}


def test_files_into_a_folder_count_what_they_reject_with_and_without_a_cutoff(
    spark: Any, tmp_path: Path
) -> None:
    """Without a cutoff the rejected count is the files' own count less what was written (no
    second pass over the rows); with one, rows due before it are neither written nor rejected."""
    lines = [
        json.dumps(
            {
                "endpoint": "e",
                "id": f"ok{i}",
                "destination": "q",
                "due_at": f"2031-01-0{i + 1}T00:00:00+00:00",
            }
        )
        for i in range(4)
    ] + [
        json.dumps({"endpoint": "e", "id": "nodue", "destination": "q"}),
        "not json",
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    every = migrate(spark, MigrationSpec(f"jsonl:{source}", f"parquet:{tmp_path / 'all'}"))
    assert (every.inserted, every.put_back, every.staged) == (4, 2, 6)
    assert any("not JSON" in n for n in every.notes) and any(n.startswith("nodue:") for n in every.notes)
    cutoff = datetime(2031, 1, 3, tzinfo=UTC)
    later = migrate(spark, MigrationSpec(f"jsonl:{source}", f"parquet:{tmp_path / 'later'}", cutoff=cutoff))
    assert (later.inserted, later.put_back) == (2, 2)  # ok2, ok3; the two rows with no due time


def test_preview_reports_duplicate_ids_in_files(spark: Any, tmp_path: Path) -> None:
    lines = [
        {"endpoint": "e", "message_id": "same", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"},
        {"endpoint": "e", "message_id": "same", "destination": "q", "due_at": "2031-01-01T00:00:01+00:00"},
        {"endpoint": "e", "message_id": "ok", "destination": "q", "due_at": "2031-01-01T00:00:02+00:00"},
        {"endpoint": "e", "message_id": "late", "destination": "q", "due_at": "2031-01-01T00:00:02"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    found = preview(spark, f"jsonl:{path}")
    assert found.problem_counts["duplicate id"] == 1
    assert found.problem_counts["due time missing or out of range"] == 1
    assert sum(found.problem_counts.values()) == 3
    assert any("not JSON" in why for _, _, why in found.problems)


def test_bad_input_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="layout=duetime"):
        open_sql_database("postgresql://x/db?layout=nservicebus")
    with pytest.raises(ConfigurationError, match="UTC offset"):
        MigrationSpec("sqlite:///a.db", "sqlite:///b.db", cutoff=datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError, match="not a database URL"):
        open_sql_database("redis://localhost/0")
    with pytest.raises(ConfigurationError, match="batch-rows"):
        MigrationSpec("sqlite:///a.db", "sqlite:///b.db", batch_rows=10)
    with pytest.raises(ConfigurationError, match="PostgreSQL or MariaDB"):
        DbSource(open_sql_database("sqlite:///a.db?layout=timeoutdata"))
    with pytest.raises(ConfigurationError, match="native=duetime"):
        open_target("amqp://guest:guest@localhost/")
    with pytest.raises(ConfigurationError, match="Name a folder"):
        open_target("parquet:")
    from duetime.bulk.schedule import schedule

    with pytest.raises(ConfigurationError, match="Name the job"):
        schedule(None, "jsonl:/x", "sqlite:///a.db", job="")
    # a wrong --endpoint is wrong for every row: refused before Spark is asked anything (no session)
    with pytest.raises(ConfigurationError, match="endpoint name 'two words' is not allowed"):
        migrate(None, MigrationSpec("jsonl:/nowhere", "sqlite:///a.db", "two words"))
    with pytest.raises(ConfigurationError, match="endpoint name 'two words' is not allowed"):
        schedule(None, "jsonl:/nowhere", "sqlite:///a.db", endpoint="two words", job="j")
    assert from_micros(to_micros(datetime(2030, 1, 1, tzinfo=UTC))) == datetime(2030, 1, 1, tzinfo=UTC)


def test_msmq_layout_in_postgres_with_binary_headers_moves_and_aborts_back_exactly(spark: Any) -> None:
    with postgres_schema() as pg:
        due = datetime(2032, 2, 2, 2, 2, 2, 222222)
        rows = [
            (
                f"q{i}",
                "payments",
                f"body {i}".encode(),
                due + timedelta(minutes=i),
                json.dumps({"h": str(i)}).encode(),
                i % 2,
            )
            for i in range(40)
        ]
        rows.append(("bad", "payments", b"", due, b"\xff\xfe not utf-8", 0))
        legacy = create_msmq(pg, "pay_legacy", rows)
        source = pg + "&layout=msmq&table=pay_legacy"
        found = preview(spark, source, "Payments")
        assert found.total == 41 and found.problem_counts == {"unreadable headers": 1}
        result = migrate(spark, MigrationSpec(source, pg, "Payments", batch_rows=100))
        assert (result.inserted, result.put_back) == (40, 1)
        moved = store_rows(pg, "Payments")
        assert moved["q3"].headers == {"h": "3"} and moved["q3"].failure_count == 1
        assert moved["q3"].due_at == (due + timedelta(minutes=3)).replace(tzinfo=UTC)
        # the unreadable row went back byte for byte
        assert table_rows(legacy, "pay_legacy", "Id") == [
            ("bad", "payments", b"", due, b"\xff\xfe not utf-8", 0)
        ]


def test_a_store_table_as_its_own_target_is_refused_and_a_rename_within_it_moves(
    spark: Any, tmp_path: Path
) -> None:
    """Each row was taken out and put back: "300 moved" and "300 still in the source", forever.
    And a --rename given with --endpoint was ignored: the messages kept the old name."""
    url = f"sqlite:///{tmp_path / 'one.db'}"
    messages = seed_store(url, "Orders", 120)
    with pytest.raises(
        ConfigurationError, match=r"--from and --to are the same store table \(Orders.delayed\)"
    ):
        migrate(spark, MigrationSpec(url, f"sqlite:///{tmp_path}/./one.db", "Orders"))
    assert store_rows(url, "Orders") == {m.message_id: m for m in messages}
    with postgres_schema() as pg:
        seed_store(pg, "Orders", 10)
        # one server spelled two ways is one place: the server says which it is
        for same in (pg, pg.replace("@127.0.0.1:", "@localhost:")):
            with pytest.raises(ConfigurationError, match="the same store table"):
                migrate(spark, MigrationSpec(pg, same, "Orders"))
        assert len(store_rows(pg, "Orders")) == 10
        target = open_target(pg.replace("@127.0.0.1:", "@localhost:"))
        assert isinstance(target, StoreTarget) and target.shares_database(open_sql_database(POSTGRES))
        assert not target.shares_database(open_sql_database(POSTGRES.replace("postgres@", "root@")))
    with mariadb_database() as maria, mariadb_database() as other:
        seed_store(maria, "Orders", 10)
        with pytest.raises(ConfigurationError, match="the same store table"):
            migrate(spark, MigrationSpec(maria, maria.replace("@127.0.0.1:", "@localhost:"), "Orders"))
        assert open_sql_database(maria).place() != open_sql_database(other).place()
    moved = migrate(spark, MigrationSpec(url, url, "Orders", renames=(("Orders", "Sales"),)))
    assert moved.inserted == 120 and store_rows(url, "Orders") == {}
    assert set(store_rows(url, "Sales")) == {m.message_id for m in messages}
    with pytest.raises(
        ConfigurationError, match=r"--rename names \['Nope'\], but the source's endpoints are \['Sales'\]"
    ):
        migrate(
            spark, MigrationSpec(url, f"sqlite:///{tmp_path / 'two.db'}", "Sales", renames=(("Nope", "X"),))
        )


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def any_sql_url(request: Any, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh database of each SQL kind a store can live in."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with postgres_schema() if request.param == "postgresql" else mariadb_database() as url:
        yield url


def test_a_store_staged_and_aborted_gets_every_message_back_as_it_was(
    any_sql_url: str, tmp_path: Path
) -> None:
    """A duetime store as the source: staging takes its rows out (the store's own statements), an
    abort puts every one back, byte for byte."""
    seeded = {m.message_id: m for m in seed_store(any_sql_url, "Ops", 250)}
    target = f"sqlite:///{tmp_path / 'target.db'}"
    StoreTarget(open_sql_database(target)).prepare(["Ops"])
    spec = MigrationSpec(any_sql_url, target, "Ops", batch_rows=100)
    src, run_id, batches = _run_started(spec)
    staged = sum(src.stage(run_id, MIGRATE.batch_of(b), None, to_micros(datetime.now(UTC))) for b in batches)
    assert staged == 250 and store_rows(any_sql_url, "Ops") == {}
    assert abort(spec).status == "aborted"
    back = store_rows(any_sql_url, "Ops")
    assert back.keys() == seeded.keys()
    for message_id, message in back.items():
        was = seeded[message_id]
        assert (
            message.destination,
            message.due_at,
            message.body,
            message.headers,
            message.failure_count,
        ) == (
            was.destination,
            was.due_at,
            was.body,
            was.headers,
            was.failure_count,
        )


def test_a_tables_rows_are_taken_by_key_and_put_back_by_its_own_backend(any_sql_url: str) -> None:
    """``Database.source_rows``: what a migration takes out of any table and puts back, on each
    database (PostgreSQL takes by key only before version 14, so this is its one test of it)."""
    db = open_sql_database(any_sql_url)
    with db.session() as conn:
        db.ensure_schema(conn)
        db.execute(
            conn, f"CREATE TABLE {db.qualified('Taken_Rows')} (k VARCHAR(20) PRIMARY KEY, v {db.blob})"
        )
        rows = db.source_rows("Taken_Rows")
        key, columns = db.quote("k"), [db.quote("k"), db.quote("v")]
        rows.put_back(conn, columns, [(f"k{i}", bytes([i]) * i) for i in range(10)])
        rows.put_back(conn, columns, [])
        assert rows.take_keys(conn, key, ["k1", "k2", "k3", "nope"]) == 3
        assert rows.take_keys(conn, key, []) == 0
        left = db.execute(conn, f"SELECT k, v FROM {db.qualified('Taken_Rows')} ORDER BY k").fetchall()
    assert [(k, bytes(v)) for k, v in left] == [(f"k{i}", bytes([i]) * i) for i in (0, 4, 5, 6, 7, 8, 9)]
