"""The bulk commands as users run them: the CLI, spark-submit, the errors a newcomer meets
(kill -9 in the middle of a migration: test_cli_resume.py; the data users move: test_cli_data.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bulk.conftest import create_timeoutdata, timeout_rows
from tests.bulk.test_migrate import store_rows
from tests.conftest import ROOT, run_cli
from tests.services import PG_AT, postgres_schema

pytestmark = pytest.mark.slow


def test_spark_submit_runs_the_job_file(tmp_path: Path) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        pytest.fail("spark-submit is missing: pip install 'duetime[spark]'")
    with postgres_schema() as pg:
        create_timeoutdata(pg, "Sub_TimeoutData", timeout_rows(50))
        job = ROOT / "duetime" / "cli" / "spark_job.py"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "COLUMNS": "200",
        }
        result = subprocess.run(
            [
                str(submit),
                "--master",
                "local[1]",
                "--conf",
                "spark.ui.enabled=false",
                str(job),
                "migrate",
                "--from",
                pg + "&layout=timeoutdata",
                "--to",
                pg,
                "--mode",
                "migrate",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert '"inserted": 50' in result.stdout
        assert len(store_rows(pg, "Sub")) == 50


def test_cli_errors_name_the_fix(tmp_path: Path) -> None:
    bad = run_cli(
        "bulk",
        "migrate",
        "--from",
        "redis://localhost/0",
        "--to",
        "sqlite:///x.db",
        cwd=tmp_path,
        timeout=120,
    )
    assert bad.returncode == 1 and "not a database URL" in bad.stderr
    assert "--master" in run_cli("bulk", "migrate", "--help", cwd=tmp_path).stdout
    period = run_cli("bulk", "report", "--store", "sqlite:///x.db", "--period", "week", cwd=tmp_path)
    assert period.returncode != 0 and "--period must be second, minute, hour or day" in period.stderr
    # what is wrong before a row is read is said before Spark starts (seconds, and its log lines)
    for command, said in (
        (["export", "--from", "redis://localhost/0", "--to", "parquet:out"], "not a database URL"),
        (
            ["export", "--from", "sqlite:///x.db", "--to", "csv:out"],
            "Export writes files: --to parquet:/folder",
        ),
        (["import", "--from", "out", "--to", "sqlite:///x.db"], "Import reads files: --from parquet:/folder"),
        (["import", "--from", "parquet:out", "--to", "memory://"], "not a store bulk jobs can write into"),
        (["report", "--store", "redis://localhost/0"], "not a database URL"),
        (
            ["report", "--store", "sqlite:///x.db", "--delivery-log", "logs/"],
            "--delivery-log takes jsonl:/folder",
        ),
        (
            ["schedule", "rows.csv", "--to", "sqlite:///x.db", "--job", "j"],
            "'rows.csv' is not a parquet: or jsonl:",
        ),
        (
            ["schedule", "parquet:in", "--to", "sqlite:///x.db?layout=msmq", "--job", "j"],
            "duetime stores only",
        ),
    ):
        early = run_cli("bulk", *command, cwd=tmp_path, timeout=60)
        assert early.returncode == 1 and said in early.stderr, early.stderr[-2000:]
        assert len(early.stderr.strip().splitlines()) == 1, early.stderr[-2000:]  # no Spark log line


@pytest.mark.timeout(420)  # thirty commands, a few of them starting Spark
def test_what_a_newcomer_gets_wrong_first_is_one_line_and_never_internal(tmp_path: Path) -> None:
    """A wrong master, a database or table that is not there, a missing input: each once stopped
    with "internal error" and a Java or Python stack (an unreachable master after a minute)."""
    from tests.services import MARIADB, POSTGRES

    no_db = POSTGRES.rsplit("/", 1)[0] + "/duetime_no_such_db"
    cases = [
        (
            ("--master", "spark://127.0.0.1:1"),
            "cannot connect to the Spark master spark://127.0.0.1:1 (127.0.0.1:1: ",
        ),
        (
            ("--master", "spark-master:7077"),
            "--master 'spark-master:7077' is not a Spark master: use local[*]",
        ),
        (
            ("--from", no_db),
            f'cannot connect to postgresql://postgres@{PG_AT}/duetime_no_such_db: database "',
        ),
        (
            ("--from", MARIADB.rsplit("/", 1)[0] + "/duetime_no_such_db"),
            "Unknown database 'duetime_no_such_db'",
        ),
        (
            ("--from", f"{POSTGRES}?table=duetime_no_such_table"),
            "has no table 'duetime_no_such_table'; check ?table=",
        ),
        (("--from", "sqlite:///typo.db"), "sqlite:///typo.db: no such file, so there is nothing to read"),
    ]
    assert run_cli("setup", "--store", "sqlite:///x.db", cwd=tmp_path).returncode == 0  # the masters' source
    for args, message in cases:
        given = dict(zip(args[::2], args[1::2], strict=True))
        command = ["bulk", "export", "--from", given.get("--from", "sqlite:///x.db"), "--to", "parquet:out"]
        if "--master" in given:
            command += ["--master", given["--master"]]
        started = time.monotonic()
        result = run_cli(*command, cwd=tmp_path, timeout=180)
        assert result.returncode == 1 and message in result.stderr, result.stderr[-2000:]
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
        # said before Spark starts: the one line, none of Spark's start-up log
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
        if "--master" in given:
            assert time.monotonic() - started < 20  # Spark itself retries for a minute
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a.jsonl").write_text(
        '{"destination": "orders", "due_at": "2030-01-01T00:00:00Z"}\n'
    )
    for command, said in (
        (["migrate", "--from", "sqlite:///typo.db", "--to", "sqlite:///y.db"], "no such file"),
        (["report", "--store", f"{POSTGRES}?table=duetime_no_such_table"], "has no table 'duetime_no_such_table'"),
        (["import", "--from", "jsonl:rows", "--to", no_db], 'database "duetime_no_such_db" does not exist'),
        (["import", "--from", "jsonl:rows", "--to", "sqlite:///no/x.db"], "Folder no does not exist"),
        (["import", "--from", "jsonl:rows", "--to", "sqlite:///rows/a.jsonl"], "is not a SQLite database"),
        (["schedule", "jsonl:rows", "--to", MARIADB.rsplit("/", 1)[0] + "/duetime_no_such_db", "--job", "j"],
         "Unknown database 'duetime_no_such_db'"),
        # files this machine's disk can rule out (local mode, no other default filesystem): before
        # Spark, not after seconds of its start and its log
        (["import", "--from", "jsonl:nothing-here", "--to", "sqlite:///x.db"],
         f"file:{tmp_path}/nothing-here: does not exist, so there is nothing to read"),
        (["import", "--from", "parquet:file:///nothing/here", "--to", "sqlite:///x.db"], "file:/nothing/here: does not exist"),
        (["schedule", "jsonl:nothing-here", "--to", "sqlite:///x.db", "--job", "j"], "nothing-here: does not exist"),
        (["migrate", "--from", "jsonl:nothing-here", "--to", "sqlite:///x.db"], "nothing-here: does not exist"),
        (["report", "--store", "sqlite:///x.db", "--delivery-log", "jsonl:nothing-here"], "nothing-here: does not exist"),
        (["import", "--from", "jsonl:in/*.jsonl", "--to", "sqlite:///x.db"], "/in/*.jsonl: matches no file"),
        (["export", "--from", "sqlite:///x.db", "--to", "parquet:out", "--decrypt"],
         "--decrypt opens sealed rows with the keyring: set DUETIME_ENCRYPTION_KEYS to its file."),
        (["schedule", "jsonl:rows", "--to", "sqlite:///x.db", "--job", "j", "--if-exists", "refuse"],
         "a bulk schedule does not stop for one row"),
        (["schedule", "jsonl:rows", "--to", "sqlite:///x.db", "--job", "j", "--if-exists", "debounce"],
         "each row gives its own due time, so it replaces; use replace"),
        (["schedule", "jsonl:rows", "--to", "sqlite:///x.db", "--job", "j", "--if-exists", "<b>"],
         "--if-exists is keep or replace for a bulk schedule, not '<b>'."),
    ):  # fmt: skip
        early = run_cli("bulk", *command, cwd=tmp_path)
        assert early.returncode == 1 and said in early.stderr, early.stderr[-2000:]
        assert len(early.stderr.strip().splitlines()) == 1, early.stderr[-2000:]  # before Spark
    # a pattern only Hadoop reads ({a,b}) is looked at by Spark, which says the same
    missing = run_cli(
        "bulk",
        "import",
        "--from",
        "jsonl:in/{a,b}.jsonl",
        "--to",
        "sqlite:///x.db",
        cwd=tmp_path,
        timeout=180,
    )
    assert missing.returncode == 1 and "/in/{a,b}.jsonl: matches no file" in missing.stderr, missing.stderr[
        -2000:
    ]
    assert not (tmp_path / "out").exists() and not (tmp_path / "typo.db").exists()
    for flag, place, said in (
        ("--html", ".", "--html . is a folder; name the file, e.g. report.html."),
        ("--csv", "/proc/1/csv", "cannot write the report into /proc/1/csv: No such file or directory."),
    ):
        report = run_cli("bulk", "report", "--store", "sqlite:///x.db", flag, place, cwd=tmp_path)
        assert report.returncode == 1 and said in report.stderr, report.stderr[-2000:]


def test_spark_that_does_not_start_is_one_line_naming_its_log(tmp_path: Path) -> None:
    """Spark's console output goes to a log file; when Spark cannot start, the one line says where
    that log is, and the log (with the JVM's own reason) is still there to read."""
    assert run_cli("setup", "--store", "sqlite:///a.db", cwd=tmp_path).returncode == 0
    failed = run_cli(
        "bulk", "export", "--from", "sqlite:///a.db", "--to", "parquet:out", "--conf", "spark.driver.memory=lots",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert failed.returncode == 1 and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert failed.stderr.startswith("error: Spark did not start") and "Traceback" not in failed.stderr
    log = Path(failed.stderr.rsplit("Spark's own log: ", 1)[1].strip().rstrip("."))
    assert "Invalid maximum heap size" in log.read_text()
    log.unlink()


@pytest.mark.timeout(300)
def test_bulk_schedule_and_import_warn_of_destinations_without_a_queue(tmp_path: Path) -> None:
    """`bulk schedule` of 200,000 messages for queues that did not exist said nothing (it had no
    --transport); `schedule` and `load` warn. Now the bulk jobs warn too, before storing."""
    import json

    assert run_cli("setup", "--store", "sqlite:///x.db", "--queue", "orders", cwd=tmp_path).returncode == 0
    (tmp_path / "in").mkdir()
    lines = [
        {"id": f"r{i}", "destination": name, "due_at": "2031-01-01T00:00:00+00:00", "body": "x"}
        for i, name in enumerate(["orders", "nowhere-a", "nowhere-b", "orders"])
    ]
    (tmp_path / "in" / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli(
        "bulk",
        "schedule",
        "jsonl:in",
        "--to",
        "sqlite:///x.db",
        "--endpoint",
        "duetime",
        "--job",
        "j1",
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = " ".join(done.stderr.split())
    assert "no queue 'nowhere-a' is declared" in said and "no queue 'nowhere-b' is declared" in said, said
    assert "no queue 'orders'" not in said
    assert "4 stored" in done.stdout, done.stdout


@pytest.mark.timeout(300)
def test_export_never_destroys_a_folder_it_did_not_write(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bulk export --to jsonl:.` wiped the current folder (its --help said "replaced if it
    exists"). Now a folder is replaced only if it is empty or holds an earlier export; anything
    else needs --overwrite, and the current folder and a home never."""
    from duetime.bulk.export_import import export
    from duetime.errors import ConfigurationError

    store = f"sqlite:///{tmp_path / 'x.db'}"
    assert run_cli("setup", "--store", store, cwd=tmp_path).returncode == 0
    assert (
        run_cli("schedule", "orders", "keep me", "--in", "1h", "--store", store, cwd=tmp_path).returncode == 0
    )
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    # the command as a user types it: one line, exit 1, nothing touched
    refused = run_cli("bulk", "export", "--from", store, "--to", "jsonl:mine", cwd=tmp_path, timeout=240)
    assert refused.returncode == 1 and "'notes.txt'" in refused.stderr and "--overwrite" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and (mine / "notes.txt").read_text() == "mine"
    # the rule, on the shared session: a current folder and a home of the test's own, each
    # holding a file that must survive even --overwrite
    here, home = tmp_path / "here", tmp_path / "home"
    for folder in (here, home):
        folder.mkdir()
        (folder / "keep.txt").write_text("keep")
    with monkeypatch.context() as m:
        m.chdir(here)
        m.setenv("HOME", str(home))
        with pytest.raises(ConfigurationError, match="never writes into the current folder"):
            export(spark, store, f"jsonl:{here}", overwrite=True)
        with pytest.raises(ConfigurationError, match="a home folder"):
            export(spark, store, f"jsonl:{home}", overwrite=True)
    assert (here / "keep.txt").exists() and (home / "keep.txt").exists()
    assert export(spark, store, f"jsonl:{tmp_path / 'out'}").rows == 1
    assert export(spark, store, f"jsonl:{tmp_path / 'out'}").rows == 1  # an earlier export is replaced
    assert export(spark, store, f"jsonl:{mine}", overwrite=True).rows == 1
    assert not (mine / "notes.txt").exists()
