"""The bulk jobs' data as users move it: a folder on an SFTP server, Parquet row groups cut into
batches, ids given twice, and the progress line off a terminal (the CLI's own errors and
spark-submit: test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bulk.test_migrate import seed_store, store_rows
from tests.conftest import run_cli
from tests.services import postgres_schema

pytestmark = pytest.mark.slow


@pytest.mark.timeout(540)  # two Spark jobs over SFTP, each given 240 s: minutes on a busy machine
def test_the_readmes_sftp_export_as_a_user_runs_it(tmp_path: Path) -> None:
    """README, "Files": `duetime bulk export --to parquet:sftp://… --conf spark.hadoop.fs.sftp…`
    in local mode, then an import back from there the same way."""
    from tests.bulk.sftp_server import Sftp, spark_conf

    root = tmp_path / "served"
    root.mkdir()
    server = Sftp(root, tmp_path)
    try:
        conf = [arg for key, value in spark_conf().items() for arg in ("--conf", f"{key}={value}")]
        messages = seed_store(f"sqlite:///{tmp_path / 'duetime.db'}", "Orders", 300)
        out = run_cli(
            "bulk", "export", "--from", "sqlite:///duetime.db", "--to", f"parquet:{server.url}/duetime", *conf,
            cwd=tmp_path, timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"300 messages written to {server.url}/duetime" in out.stdout
        assert (root / "duetime" / "_SUCCESS").exists()
        # written by one task: Hadoop's SFTP filesystem makes folders racily (two tasks at once
        # failed with "Can't make directory for path _temporary")
        assert len(list((root / "duetime").glob("part-*"))) == 1
        back = run_cli(
            "bulk", "import", "--from", f"parquet:{server.url}/duetime", "--to", "sqlite:///copy.db", *conf,
            cwd=tmp_path, timeout=240,
        )  # fmt: skip
        assert back.returncode == 0, back.stderr[-3000:]
        assert store_rows(f"sqlite:///{tmp_path / 'copy.db'}", "Orders") == {
            m.message_id: m for m in messages
        }
    finally:
        server.stop()


def test_batch_rows_on_import_and_schedule_as_a_user_runs_them(tmp_path: Path) -> None:
    """One Parquet row group of 3,000 rows, imported with --batch-rows 1000, is three ledgered
    batches; a --batch-rows out of range is one line, before Spark starts."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 3_000
    due = [1_924_992_000_000_000 + i for i in range(rows)]  # 2031-01-01, a µs apart
    pq.write_table(
        pa.table(
            {
                "id": [f"c{i}" for i in range(rows)],
                "destination": ["orders"] * rows,
                "due_at": pa.array(due, pa.timestamp("us", tz="UTC")),
                "body": [b"x"] * rows,
            }
        ),
        tmp_path / "rows.parquet",
        row_group_size=rows,
    )
    for command in (
        ["import", "--from", "parquet:rows.parquet", "--to", "sqlite:///in.db", "--endpoint", "cli"],
        ["schedule", "parquet:rows.parquet", "--to", "sqlite:///in.db", "--endpoint", "cli", "--job", "j"],
    ):
        bad = run_cli("bulk", *command, "--batch-rows", "5", cwd=tmp_path, timeout=60)
        assert bad.returncode == 1, bad.stderr
        assert "--batch-rows must be between 100 and 5,000,000" in bad.stderr
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    done = run_cli(
        "bulk", "import", "--from", "parquet:rows.parquet", "--to", "sqlite:///in.db", "--endpoint", "cli",
        "--batch-rows", "1000", "--json", cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["inserted"], result["batches"]) == (rows, 3), result
    assert len(store_rows(f"sqlite:///{tmp_path / 'in.db'}", "cli")) == rows


def test_import_counts_an_id_the_store_holds_and_an_id_given_twice_as_conflicts(tmp_path: Path) -> None:
    """As the README says: an id the store holds already, or that the files hold twice, is
    counted, never overwritten; what was written and what was left add up to the rows read."""
    import json
    from datetime import UTC, datetime

    from duetime import DelayedMessage, TransactionMode
    from duetime.registry import open_sync_store

    lines = [
        {"message_id": i, "destination": d, "due_at": "2031-01-01T00:00:00+00:00", "endpoint": "cli"}
        for i, d in (("twice", "first"), ("twice", "second"), ("new", "orders"), ("held", "from-file"))
    ]
    # a count no store column holds: was a 15-line traceback from a Spark worker
    lines.append({**lines[2], "message_id": "counted", "failure_count": 10**30})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with postgres_schema() as pg:
        store = open_sync_store(pg)
        store.setup_infrastructure("cli")
        store.initialize("cli", TransactionMode.AT_LEAST_ONCE)
        store.store(DelayedMessage("held", "kept", datetime(2032, 1, 1, tzinfo=UTC)))
        store.close()
        done = run_cli(
            "bulk", "import", "--from", "jsonl:rows.jsonl", "--to", pg, "--json", cwd=tmp_path, timeout=240
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert (result["inserted"], result["put_back"]) == (2, 3), result
        assert "Traceback" not in done.stderr
        assert "failure_count must be a whole number from 0 to 2,147,483,647" in done.stdout + done.stderr
        stored = store_rows(pg, "cli")
        assert sorted(stored) == ["held", "new", "twice"]
        assert stored["held"].destination == "kept"  # never overwritten
        assert stored["twice"].destination in ("first", "second")


@pytest.mark.timeout(420)  # three Spark applications: over 180 s on a loaded machine (seen twice)
def test_jobs_report_rows_done_of_rows_in_all_off_a_terminal(tmp_path: Path) -> None:
    """schedule, export and import as a user runs them with their output in a file: a line of rows
    done of rows in all, with the rate, and nothing of Spark's own console output (the report's
    line: the cluster test of the report)."""
    lines = 3_000
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "endpoint": "crm",
                    "destination": "orders",
                    "due_at": "2030-01-01T00:00:00Z",
                    "body": "x",
                }
            )
            + "\n"
            for i in range(lines)
        )
    )
    common = ["--master", "local[2]", "--batch-rows", "1000"]
    scheduled = run_cli(
        "bulk",
        "schedule",
        f"jsonl:{rows}",
        "--to",
        "sqlite:///a.db",
        "--job",
        "j",
        *common,
        cwd=tmp_path,
        timeout=240,
    )
    assert scheduled.returncode == 0, scheduled.stderr
    assert "scheduling: 3,000 of 3,000 rows (100%), " in scheduled.stderr and "rows/s" in scheduled.stderr
    exported = run_cli(
        "bulk", "export", "--from", "sqlite:///a.db", "--to", "jsonl:out", cwd=tmp_path, timeout=240
    )
    assert exported.returncode == 0, exported.stderr
    assert "exporting: 3,000 of 3,000 rows (100%), " in exported.stderr
    imported = run_cli(
        "bulk", "import", "--from", "jsonl:out", "--to", "sqlite:///b.db", *common, cwd=tmp_path, timeout=240
    )
    assert imported.returncode == 0, imported.stderr
    assert "importing: 3,000 of 3,000 rows (100%), " in imported.stderr
    for said in (scheduled.stderr, exported.stderr, imported.stderr):
        for noise in ("log4j", "WARN", "incubator", "NativeCodeLoader"):
            assert noise not in said, said


@pytest.mark.timeout(300)
def test_a_redis_store_takes_import_schedule_and_migrate(spark: Any, tmp_path: Path) -> None:
    """Bulk jobs write a Redis store through its bulk writer: an import (as a user runs it)
    counts an id the store holds and an id given twice as conflicts; a schedule job re-run
    stores nothing twice; a migration from NServiceBus's SQL persistence moves every timeout.
    What they stored reads back as the store's own messages (destination, due time, headers,
    body, group)."""
    from datetime import UTC, datetime

    from duetime import DelayedMessage, TransactionMode
    from duetime.bulk.migrate import MigrationSpec, migrate
    from duetime.bulk.schedule import schedule
    from duetime.registry import open_sync_store
    from tests.bulk.conftest import create_timeoutdata, timeout_rows
    from tests.services import REDIS, delete_redis_keys, require, unique, with_option

    require(REDIS)
    prefix = unique("bulkcli") + ":"
    redis_url = with_option(REDIS, prefix=prefix)
    lines = [
        {"message_id": i, "destination": d, "due_at": "2031-01-01T00:00:00+00:00", "endpoint": "cli",
         "headers": {"tenant": "7"}, "body": "hello", "group": "g1"}
        for i, d in (("twice", "first"), ("twice", "second"), ("new", "orders"), ("held", "from-file"))
    ]  # fmt: skip
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    try:
        store = open_sync_store(redis_url)
        store.setup_infrastructure("cli")
        store.initialize("cli", TransactionMode.AT_LEAST_ONCE)
        store.store(DelayedMessage("held", "kept", datetime(2032, 1, 1, tzinfo=UTC)))
        store.close()
        done = run_cli(
            "bulk",
            "import",
            "--from",
            "jsonl:rows.jsonl",
            "--to",
            redis_url,
            "--json",
            cwd=tmp_path,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr
        assert (json.loads(done.stdout)["inserted"], json.loads(done.stdout)["put_back"]) == (2, 2)
        stored = store_rows(redis_url, "cli")
        assert sorted(stored) == ["held", "new", "twice"]
        assert stored["held"].destination == "kept"  # never overwritten
        new = stored["new"]
        assert (new.destination, new.due_at, new.body, new.group) == (
            "orders", datetime(2031, 1, 1, tzinfo=UTC), b"hello", "g1"
        )  # fmt: skip
        assert new.headers["tenant"] == "7"

        plan = [{"id": f"r{i}", "destination": "crm", "due_at": "2031-02-01T00:00:00Z"} for i in range(5)]
        (tmp_path / "plan.jsonl").write_text("".join(json.dumps(line) + "\n" for line in plan))
        rows = f"jsonl:{tmp_path / 'plan.jsonl'}"
        assert schedule(spark, rows, redis_url, endpoint="crm", job="plan").stored == 5
        gone = open_sync_store(redis_url)
        gone.initialize("crm", TransactionMode.AT_LEAST_ONCE)
        gone.remove("r0")  # delivered meanwhile: the job's re-run must not store it again
        gone.close()
        again = schedule(spark, rows, redis_url, endpoint="crm", job="plan")
        assert (again.stored, again.skipped) == (0, 5)
        assert sorted(store_rows(redis_url, "crm")) == [f"r{i}" for i in range(1, 5)]

        with postgres_schema() as pg:
            create_timeoutdata(pg, "Sales_TimeoutData", timeout_rows(300))
            source = f"{pg}&layout=timeoutdata" if "?" in pg else f"{pg}?layout=timeoutdata"
            moved = migrate(spark, MigrationSpec(source, redis_url, "Sales"))
            assert moved.inserted == 300, moved
        assert len(store_rows(redis_url, "Sales")) == 300
    finally:
        delete_redis_keys(prefix)
