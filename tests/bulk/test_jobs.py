"""schedule, export/import, report and the delivery log, on a local SparkSession."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore
from duetime.bulk.export_import import export, import_
from duetime.bulk.hadoopfs import Folder
from duetime.bulk.report import backlog, lateness, write_csv, write_html
from duetime.bulk.schedule import schedule
from duetime.observability.deliverylog import JsonLinesDeliveryLog, SqlDeliveryLog
from duetime.registry import open_sql_database, open_sync_store
from tests.bulk.conftest import store_planner_rows
from tests.bulk.test_migrate import seed_store, store_rows
from tests.services import mariadb_database, postgres_schema


def test_schedule_stores_valid_rows_once_and_rejects_the_rest_with_reasons(
    spark: Any, tmp_path: Path
) -> None:
    nine = datetime(2031, 3, 1, 9, 0)
    rows = [
        ("r1", "reminders", nine.replace(tzinfo=UTC), b"hello 1", {"customer": "1"}),
        (None, "reminders", (nine + timedelta(hours=1)).replace(tzinfo=UTC), b"hello 2", {"customer": "2"}),
        ("r3", "", nine.replace(tzinfo=UTC), b"no destination", {}),
        ("r4", "reminders", None, b"no due time", {}),
    ]
    frame = spark.createDataFrame(
        rows, "id string, destination string, due_at timestamp, body binary, headers map<string,string>"
    )
    with postgres_schema() as pg:
        rejects = tmp_path / "rejects"
        done = schedule(spark, frame, pg, endpoint="crm", job="reminders-1", rejects=str(rejects))
        assert (done.rows, done.stored, done.skipped, done.rejected) == (4, 2, 0, 2)
        stored = store_rows(pg, "crm")
        assert stored["r1"].due_at == nine.replace(tzinfo=UTC) and stored["r1"].headers == {"customer": "1"}
        reasons = [json.loads(line) for f in rejects.glob("part-*") for line in f.read_text().splitlines()]
        assert sorted(r["message_id"] for r in reasons) == ["r3", "r4"]
        assert all(r["reason"] for r in reasons)
        # r1 was delivered meanwhile; a re-run stores nothing twice
        store = open_sync_store(pg)
        store.initialize("crm", TransactionMode.AT_LEAST_ONCE)
        store.remove("r1")
        store.close()
        again = schedule(spark, frame, pg, endpoint="crm", job="reminders-1", rejects=str(rejects))
        assert (again.stored, again.skipped) == (0, 2)
        assert set(store_rows(pg, "crm")) == set(stored) - {"r1"}


def test_schedule_in_many_partitions_at_once_stores_every_row(spark: Any) -> None:
    """Tasks start together on an empty database: none of them creates a table (the driver did),
    so none loses a race in PostgreSQL's catalog and no row is left behind."""
    due = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)
    rows = [(f"m{i}", "reminders", due, b"x", {}) for i in range(400)]
    frame = spark.createDataFrame(
        rows, "id string, destination string, due_at timestamp, body binary, headers map<string,string>"
    ).repartition(8)
    for attempt in range(3):
        with postgres_schema() as pg:
            done = schedule(spark, frame, pg, endpoint=f"race{attempt}", job="race")
            assert (done.rows, done.stored, done.rejected) == (400, 400, 0)
            assert len(store_rows(pg, f"race{attempt}")) == 400
            assert done.rejects_path is None and not Folder(spark, "rejects-race").exists()


def test_schedule_spreads_rows_of_one_time_over_a_window_the_same_on_a_rerun(spark: Any) -> None:
    """--spread: 300 rows due at 09:00 go each at a moment of its own within the ten minutes
    after, never before, evenly; the moment is the id's (duetime.limits.spread_offset), so a job
    run again into another store gives every row the same."""
    from duetime.limits import spread_offset

    due = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)
    frame = spark.createDataFrame(
        [(f"s{i}", "reminders", due, b"x", {}) for i in range(300)],
        "id string, destination string, due_at timestamp, body binary, headers map<string,string>",
    )
    window = timedelta(minutes=10)
    with postgres_schema() as pg:
        assert schedule(spark, frame, pg, endpoint="spread", job="spread", spread=window).stored == 300
        stored = store_rows(pg, "spread")
    assert {k: m.due_at for k, m in stored.items()} == {
        f"s{i}": due + spread_offset(f"s{i}", window) for i in range(300)
    }
    offsets = sorted((m.due_at - due).total_seconds() for m in stored.values())
    assert offsets[0] >= 0 and offsets[-1] < 600 and len({int(o // 60) for o in offsets}) == 10


def test_a_store_scheduled_from_empty_gets_planner_statistics(spark: Any) -> None:
    """Otherwise the store's dispatchers sort the whole table for every next-due question until
    autovacuum looks (see refresh_planner_stats)."""
    due = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)
    frame = spark.createDataFrame(
        [(f"p{i}", "reminders", due, b"x", {}) for i in range(2_000)],
        "id string, destination string, due_at timestamp, body binary, headers map<string,string>",
    ).coalesce(1)
    with postgres_schema() as pg:
        assert schedule(spark, frame, pg, endpoint="planned", job="planned").stored == 2_000
        assert store_planner_rows(pg, "planned") >= 2_000


def test_schedule_reads_jsonl_and_parquet_files(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "destination": "q",
                    "due_at": f"2031-01-01T0{i}:00:00+02:00",
                    "body": f"b{i}",
                    "headers": {"i": str(i)},
                }
            )
            for i in range(5)
        )
    )
    with mariadb_database() as maria:
        done = schedule(spark, f"jsonl:{path}", maria, endpoint="files", job="j")
        assert done.stored == 5
        got = store_rows(maria, "files")
        assert sorted(m.due_at for m in got.values())[0] == datetime(
            2030, 12, 31, 22, 0, tzinfo=UTC
        )  # +02:00 → UTC
        assert schedule(spark, f"jsonl:{path}", maria, endpoint="files", job="j").stored == 0


def test_export_and_import_round_trip_byte_for_byte(spark: Any, tmp_path: Path) -> None:
    with postgres_schema() as pg, postgres_schema() as fresh:
        messages = seed_store(pg, "ex", 300)
        odd = DelayedMessage(
            "odd",
            "q",
            datetime(2099, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            bytes(range(256)),
            {"ключ": "значение", "e": ""},
            7,
            "saga-7",  # the group travels through export and import
        )
        store = open_sync_store(pg)
        store.initialize("ex", TransactionMode.AT_LEAST_ONCE)
        store.store(odd)
        store.close()
        raw_before = _raw(pg, "ex.delayed")
        for fmt in ("parquet", "jsonl"):
            out = tmp_path / fmt
            assert export(spark, pg, f"{fmt}:{out}", "ex").rows == 301
            target = fresh + f"&table=ex_{fmt}"
            result = import_(spark, f"{fmt}:{out}", target)
            assert result.inserted == 301
            assert _raw(target.replace(f"&table=ex_{fmt}", ""), f"ex_{fmt}") == raw_before
            assert import_(spark, f"{fmt}:{out}", target).inserted == 0  # twice changes nothing
        # what other readers make of the files: due_at a UTC time (not INT96, read as naive), and
        # JSON Lines named .jsonl (Spark's text writer names them .txt)
        import pyarrow as pa
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "parquet").schema.field("due_at").type == pa.timestamp("us", tz="UTC")
        written = sorted(p.name for p in (tmp_path / "jsonl").iterdir() if not p.name.startswith(("_", ".")))
        assert written and all(name.endswith(".jsonl") for name in written), written
        assert store_rows(pg, "ex") == {
            m.message_id: m for m in [*messages, odd]
        }  # export leaves the store alone


def _raw(url: str, table: str) -> list[tuple[Any, ...]]:
    db = open_sql_database(url)
    with db.session(write=False) as conn:
        rows = db.execute(
            conn,
            f"SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key FROM {db.qualified(table)} ORDER BY message_id",
        ).fetchall()
    return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows]


def test_report_counts_match_a_hand_count_and_lateness_comes_from_the_delivery_log(
    spark: Any, tmp_path: Path
) -> None:
    db = tmp_path / "r.db"
    url = f"sqlite:///{db}"
    now = datetime.now(UTC)
    plan = {
        "overdue": -30,
        "next minute": 30,
        "next hour": 1800,
        "next day": 40000,
        "next week": 300000,
        "later": 10**7,
    }
    messages = []
    for i, (_name, offset) in enumerate(plan.items()):
        for j in range(i + 1):
            messages.append(
                DelayedMessage(
                    f"m{i}-{j}",
                    f"dest{j % 2}",
                    now + timedelta(seconds=offset + j),
                    b"x" * (i * 10 + j),
                    {},
                    j % 3,
                )
            )
    store = open_sync_store(url)
    store.setup_infrastructure("rep")
    store.initialize("rep", TransactionMode.AT_LEAST_ONCE)
    store.store_many(messages)
    store.close()
    found = backlog(spark, url, "rep", now=now)
    assert found.total == 21
    assert found.horizons == [(name, i + 1) for i, name in enumerate(plan)]
    assert dict(found.by_destination) == {"dest0": 12, "dest1": 9}
    assert dict(found.failures) == {0: 9, 1: 7, 2: 5}
    # body bytes, as `list` and `show` count them (it was body + the headers' JSON: 57)
    assert found.largest[0][2] == "m5-5" and found.largest[0][0] == 55

    # a real dispatcher run writes the delivery log (JSON Lines and a table), the report reads it:
    # on a store of its own with one message due, since on a loaded machine the backlog above can
    # take longer than the 30 s until its "next minute" messages are due too
    delivered = f"sqlite:///{tmp_path / 'delivered.db'}"
    one = open_sync_store(delivered)
    one.setup_infrastructure("rep")
    one.initialize("rep", TransactionMode.AT_LEAST_ONCE)
    one.store_many([DelayedMessage("due-1", "dest0", now - timedelta(seconds=30), b"x", {}, 0)])
    one.close()
    logs = tmp_path / "log"
    asyncio.run(_deliver(delivered, JsonLinesDeliveryLog(logs)))
    assert sum(len(f.read_text().splitlines()) for f in logs.glob("*.jsonl")) == 1
    late = lateness(spark, f"jsonl:{logs}")
    assert sum(x.deliveries for x in late) == 1 and late[0].p50_ms >= 0
    # a Hadoop URI, as on a cluster (pathlib folded its "//" away)
    assert sum(x.deliveries for x in lateness(spark, f"jsonl:file://{logs}/")) == 1
    table_log = f"sqlite:///{tmp_path / 'log.db'}"
    sql_log = SqlDeliveryLog(table_log)
    from duetime.observability.deliverylog import Delivery

    asyncio.run(
        sql_log.record(
            [Delivery(f"d{i}", "q", now, now + timedelta(milliseconds=i), 1, "delivered") for i in range(100)]
        )
    )
    asyncio.run(sql_log.close())
    late = lateness(spark, table_log)
    assert sum(x.deliveries for x in late) == 100
    assert 98 <= late[0].p99_ms <= 99.01 and late[0].max_ms == 99.0
    found.lateness = late
    paths = write_csv(found, tmp_path / "csv")
    assert (tmp_path / "csv" / "due_histogram.csv").read_text().splitlines()[1] == "overdue,1"
    assert len(paths) == 5
    page = write_html(found, tmp_path / "html" / "report.html").read_text()
    assert "data:image/png;base64," in page and "21 stored messages" in page


async def _deliver(url: str, log: Any) -> None:
    store = SqliteStore.from_url(url)
    transport = SqliteQueueTransport.from_url(url)
    await store.initialize("rep", TransactionMode.AT_LEAST_ONCE)
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(), endpoint="rep", delivery_log=log)
    await transport.declare("dest0")
    await dispatcher.run_burst()
    await store.close()
    await transport.close()


def test_an_import_makes_no_table_for_an_endpoint_that_is_not_text(spark: Any, tmp_path: Path) -> None:
    """A JSON line's ``"endpoint": 5`` rejects the row; Spark's JSON functions read it as the text
    "5", which once gave the store an empty table named 5."""
    rows = [
        {"endpoint": "good", "id": "m1", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"},
        {"endpoint": 5, "id": "m2", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"},
        {"endpoint": {"name": "x"}, "id": "m3", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"},
        {"endpoint": True, "id": "m4", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"},
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = import_(spark, f"jsonl:{tmp_path / 'in'}", url)
    assert (result.inserted, result.put_back) == (1, 3)
    assert any("endpoint must be text, got a number (5)" in note for note in result.notes), result.notes
    db = open_sql_database(url)
    with db.session(write=False) as conn:
        tables = {r[0] for r in db.execute(conn, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not {t for t in tables if t.startswith(("5", "{", "true"))}, tables
    assert set(store_rows(url, "good")) == {"m1"}


def test_a_delivery_log_the_report_cannot_read_is_one_line(spark: Any, tmp_path: Path) -> None:
    """Each stopped the report with "internal error": a folder that is not there (Spark's missing
    path), a database without the log table and one that does not answer (failing in a task). A
    folder without log files yet (a dispatcher made it and delivered nothing) is no deliveries."""
    import pytest

    from duetime.errors import DuetimeError

    cases = {
        f"jsonl:{tmp_path / 'none'}": r"/none: does not exist, so there is nothing to read",
        f"sqlite:///{tmp_path / 'other.db'}": r"has no delivery log \(duetime_delivery_log\); run the dispatcher",
        "postgresql://postgres@127.0.0.1:1/test": "cannot connect to postgresql://postgres@127.0.0.1:1/test",
        str(tmp_path / "log"): r"--delivery-log takes jsonl:/folder .* or a database URL, not",
    }
    for log, why in cases.items():
        with pytest.raises(DuetimeError, match=why):
            lateness(spark, log)
    (tmp_path / "empty").mkdir()
    assert lateness(spark, f"jsonl:{tmp_path / 'empty'}") == []


def test_rejects_are_a_folder_written_plainly_or_as_jsonl() -> None:
    import pytest

    from duetime.bulk.schedule import _rejects_folder
    from duetime.errors import ConfigurationError

    assert _rejects_folder("jsonl:/data/rejects") == "/data/rejects"
    assert _rejects_folder("hdfs://nn/rejects") == "hdfs://nn/rejects"
    assert _rejects_folder(None) is None
    with pytest.raises(ConfigurationError, match="--rejects is a folder of JSON Lines"):
        _rejects_folder("parquet:/data/rejects")
    # from Python: a list of rows is not a DataFrame (it was an AttributeError from deep inside)
    with pytest.raises(
        ConfigurationError, match=r"not list; for Python rows, spark.createDataFrame\(rows\) first"
    ):
        schedule(None, [{"destination": "q"}], "sqlite:///unused.db", endpoint="e", job="j")


def test_a_json_line_that_is_not_utf8_is_that_lines_reason(spark: Any, tmp_path: Path) -> None:
    """One byte that is not UTF-8 failed the whole import's task ("internal error" and a stack)."""
    (tmp_path / "in").mkdir()
    good = {"id": "ok", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00", "body": "fine"}
    (tmp_path / "in" / "rows.jsonl").write_bytes(
        b'{"id": "bad", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00", "body": "\xff"}\n'
        + json.dumps(good).encode()
        + b"\n"
    )
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = import_(spark, f"jsonl:{tmp_path / 'in'}", url, "e")
    assert (result.inserted, result.put_back) == (1, 1)
    assert result.notes == ["?: line is not UTF-8 text (byte 0xff at 82)"], result.notes
    assert set(store_rows(url, "e")) == {"ok"}
    done = schedule(
        spark, f"jsonl:{tmp_path / 'in'}", url, endpoint="s", job="utf8", rejects=str(tmp_path / "rej")
    )
    assert (done.stored, done.rejected) == (1, 1)
    assert "line is not UTF-8 text" in next((tmp_path / "rej").glob("part-*")).read_text()


def test_a_parquet_text_value_that_is_not_utf8_is_that_rows_reason(spark: Any, tmp_path: Path) -> None:
    """Parquet does not check that a string column holds UTF-8; one such value failed the task
    (Arrow decoding it in Python): the import stopped with a stack trace. Now only its row is
    put back, with why; the other rows of the batch go in, a body's bytes as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def text(values: list[bytes]) -> Any:
        return pa.array(values, pa.binary()).view(pa.string())  # a view is not validated

    due = datetime(2031, 1, 1, tzinfo=UTC)
    rows = {
        "id": text([b"ok", b"bad\xff", b"body", b"named"]),
        "destination": text([b"q", b"q", b"q", b"q"]),
        "due_at": [due, due, due, due],
        "body": text([b"fine", b"fine", b"caf\xe9", b"fine"]),
        "endpoint": text([b"e", b"e", b"e", b"\xfe"]),
    }
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table(rows), folder / "rows.parquet")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = import_(spark, f"parquet:{folder}", url, "e")
    assert (result.inserted, result.put_back) == (2, 2), result.notes
    assert any("message id is not UTF-8 text." in note for note in result.notes), result.notes
    assert any("endpoint is not UTF-8 text." in note for note in result.notes), result.notes
    stored = store_rows(url, "e")
    assert set(stored) == {"ok", "body"}
    assert (stored["ok"].body, stored["body"].body) == (b"fine", b"caf\xe9")
    other = f"sqlite:///{tmp_path / 'scheduled.db'}"
    done = schedule(
        spark,
        spark.read.parquet(str(folder)),
        other,
        endpoint="s",
        job="utf8-parquet",
        rejects=str(tmp_path / "rej"),
    )
    assert (done.stored, done.rejected) == (2, 2)


def test_a_parquet_column_of_the_wrong_type_is_each_rows_reason_not_a_cast(
    spark: Any, tmp_path: Path
) -> None:
    """The rules a JSON line meets, for typed columns: a cast to text or to a whole number once
    stored a numeric destination as "6", a numeric body as the text "2" and 1.5 failures as 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    due = datetime(2031, 1, 1, tzinfo=UTC)
    good = {"id": pa.array([7]), "destination": ["q"], "due_at": [due], "body": ["text body"]}
    good |= {"headers": pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string())), "failure_count": [2]}
    wrong = {
        "destination": ({"destination": [6]}, "destination must be text, got a number (6)."),
        "body": ({"body": [2]}, "body must be text or bytes, got a number (2)."),
        "failures": (
            {"failure_count": [1.5]},
            "failure_count must be a whole number from 0 to 2,147,483,647, got a number (1.5).",
        ),
        "id": ({"id": [1.0]}, "message id must be text, got a number (1.0)."),
        "group": ({"group": [3]}, "group must be text, got a number (3)."),
        "endpoint": ({"endpoint": [5]}, "endpoint must be text, got a number (5)."),
    }
    url = f"sqlite:///{tmp_path / 'store.db'}"
    folder = tmp_path / "good"
    folder.mkdir()
    pq.write_table(pa.table(good), folder / "rows.parquet")
    assert import_(spark, f"parquet:{folder}", url, "e").inserted == 1
    stored = store_rows(url, "e")["7"]
    assert (stored.destination, stored.body, stored.headers, stored.failure_count) == (
        "q",
        b"text body",
        {"k": "v"},
        2,
    )
    # text written without Parquet's string annotation reads as binary: still text
    folder = tmp_path / "binary"
    folder.mkdir()
    raw = {
        "id": [b"8"],
        "destination": [b"q"],
        "due_at": [due],
        "endpoint": [b"e"],
        "headers": [b'{"k": "v"}'],
    }
    pq.write_table(pa.table(raw), folder / "rows.parquet")
    assert import_(spark, f"parquet:{folder}", url).inserted == 1
    assert store_rows(url, "e")["8"].headers == {"k": "v"}
    for name, (columns, reason) in wrong.items():
        folder = tmp_path / name
        folder.mkdir()
        row = {"id": ["x"], "destination": ["q"], "due_at": [due]} | columns
        pq.write_table(pa.table(row), folder / "rows.parquet")
        result = import_(spark, f"parquet:{folder}", url, "e")
        assert (result.inserted, result.put_back) == (0, 1), name
        assert reason in result.notes[0], result.notes
    assert set(store_rows(url, "e")) == {"7", "8"}


def test_a_master_is_checked_before_spark_starts() -> None:
    import pytest

    from duetime.bulk.spark_session import check_master
    from duetime.errors import ConfigurationError

    for fine in ("local", "local[*]", "local[4, 2]", "local[*,3]", "yarn", "k8s://https://k8s:6443"):
        check_master(fine)
    for master, said in (
        ("spark-master:7077", "is not a Spark master"),
        ("spark://127.0.0.1:1", "(127.0.0.1:1: Connection refused)"),
        ("spark://duetime-no-such-host.invalid", "(duetime-no-such-host.invalid: "),  # port 7077 assumed
        ("spark://127.0.0.1:1,[::1]:1", "(127.0.0.1:1: Connection refused; [::1]:1: "),  # standbys
    ):
        with pytest.raises(ConfigurationError, match=re.escape(said)):
            check_master(master)


def test_a_timestamp_without_a_time_zone_is_utc_whatever_the_sessions_zone(
    spark: Any, tmp_path: Path
) -> None:
    """pandas writes naive datetimes as Parquet timestamps without a zone, which Spark reads as
    TIMESTAMP_NTZ; a cast to TIMESTAMP read them in the session's time zone and moved every due
    time by its offset (five hours in New York; 02:30 on a spring-forward night does not exist)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    naive = [datetime(2031, 1, 1, 9, 0), datetime(2031, 3, 9, 2, 30, 0, 123456)]
    table = pa.table(
        {
            "id": ["winter", "gap"],
            "destination": ["q", "q"],
            "due_at": pa.array(naive, pa.timestamp("us")),
        }
    )
    folder = tmp_path / "naive"
    folder.mkdir()
    pq.write_table(table, folder / "rows.parquet")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        assert import_(spark, f"parquet:{folder}", url, "e").inserted == 2
        frame = spark.sql(
            "SELECT 'ntz' AS id, 'q' AS destination, TIMESTAMP_NTZ'2031-01-01 09:00:00' AS due_at"
        )
        assert schedule(spark, frame, url, endpoint="e", job="ntz").stored == 1
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    stored = store_rows(url, "e")
    assert stored["winter"].due_at == datetime(2031, 1, 1, 9, 0, tzinfo=UTC)
    assert stored["gap"].due_at == datetime(2031, 3, 9, 2, 30, 0, 123456, tzinfo=UTC)
    assert stored["ntz"].due_at == datetime(2031, 1, 1, 9, 0, tzinfo=UTC)


def test_the_servers_report_is_what_reading_every_row_reports(spark: Any, monkeypatch: Any) -> None:
    """On PostgreSQL the server counts the backlog itself (only the figures cross the network):
    the same report, figure for figure, as reading every row into Spark, for a duetime store
    (messages in flight included, bodies tied in size ordered by id as Spark orders them) and
    for NServiceBus's TimeoutData."""
    import duetime.bulk.report as report_module
    from tests.bulk.conftest import create_timeoutdata, timeout_rows

    now = datetime.now(UTC)
    offsets = [-30, 30, 1800, 40_000, 300_000, 10**7]
    messages = [
        DelayedMessage(
            f"{prefix}{i}",
            ["dest0", "dest1", "dëst2"][i % 3],
            now + timedelta(seconds=offsets[i % len(offsets)] + i),
            b"x" * (i % 4),
            {},
            i % 3,
        )
        for i in range(60)
        for prefix in ("B", "a", "é")
    ]
    with postgres_schema() as url:
        store = open_sync_store(url)
        store.setup_infrastructure("rep")
        store.initialize("rep", TransactionMode.AT_LEAST_ONCE)
        store.store_many(messages)
        assert len(store.fetch_due(now, 5)) == 5  # in flight: counted too
        create_timeoutdata(url, "Crm_TimeoutData", timeout_rows(300, start=now - timedelta(minutes=1)))
        reports = []
        for source, endpoint in ((url, "rep"), (f"{url}&layout=timeoutdata", "Crm")):
            assert report_module.planned(source, endpoint, 0) is not None
            server = backlog(spark, source, endpoint, now=now, top=7)
            with monkeypatch.context() as rows_way:
                rows_way.setattr(report_module, "planned", lambda *args: None)
                read = backlog(spark, source, endpoint, now=now, top=7)
            assert server == read
            reports.append(server)
        store.close()
    assert reports[0].total == 180 and len(reports[0].largest) == 7
    assert [r[2] for r in reports[0].largest[:3]] == ["B11", "B15", "B19"]  # size 3, then by id
    assert reports[1].total == 300
