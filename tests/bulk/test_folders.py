"""Folders as a bulk job's target, on a local SparkSession: any Hadoop filesystem, refused before
anything moves when the cluster cannot write it, and a migration that lets the source go only of
what the committed files hold (a crash, a tampered folder, an abort)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from duetime.bulk.export_import import export, import_
from duetime.bulk.filetarget import FileTarget
from duetime.bulk.migrate import MigrationSpec, _current_run, _stage_only, abort, migrate
from duetime.bulk.sources import DbSource
from duetime.clock import SYSTEM, to_micros
from duetime.errors import ConfigurationError
from duetime.registry import open_sql_database
from tests.bulk.test_migrate import seed_store, store_rows
from tests.conftest import run_cli
from tests.services import postgres_schema


def test_a_scheme_the_cluster_has_no_filesystem_for_is_refused_before_the_source_is_touched(
    spark: Any,
) -> None:
    with postgres_schema() as pg:
        seed_store(pg, "s3", 50)
        with pytest.raises(ConfigurationError, match=r"no filesystem for 's3a'.*hadoop-aws"):
            migrate(spark, MigrationSpec(pg, "parquet:s3a://bucket/timeouts", "s3"))
        with pytest.raises(ConfigurationError, match="no filesystem for 'gs'"):
            export(spark, pg, "jsonl:gs://bucket/timeouts", "s3")
        assert len(store_rows(pg, "s3")) == 50


def test_any_hadoop_filesystem_is_a_target_and_a_source(spark: Any, tmp_path: Path) -> None:
    """viewfs:// is a Hadoop filesystem that Python's open() knows nothing of: the files reach
    its mount (here a local folder) only if Spark writes them."""
    real = tmp_path / "mounted"
    real.mkdir()
    spark.sparkContext._jsc.hadoopConfiguration().set(
        "fs.viewfs.mounttable.duetime.link./data", f"file://{real}"
    )
    with postgres_schema() as pg:
        messages = seed_store(pg, "vfs", 400)
        result = migrate(spark, MigrationSpec(pg, "parquet:viewfs://duetime/data/out", "vfs", batch_rows=100))
        assert result.inserted == 400 and store_rows(pg, "vfs") == {}
        assert list((real / "out").glob("run=*/_SUCCESS"))  # committed, in the mount
        back = import_(spark, "parquet:viewfs://duetime/data/out", pg)
        assert back.inserted == 400
        assert store_rows(pg, "vfs") == {m.message_id: m for m in messages}
        assert export(spark, pg, "jsonl:viewfs://duetime/data/export", "vfs").rows == 400
        assert sum(len(f.read_text().splitlines()) for f in (real / "export").glob("part-*")) == 400


def test_a_crash_after_staging_resumes_and_a_tampered_folder_keeps_the_source(
    spark: Any, tmp_path: Path
) -> None:
    with postgres_schema() as pg:
        messages = seed_store(pg, "crash", 300)
        folder = tmp_path / "out"
        spec = MigrationSpec(pg + "&table=crash.delayed", f"parquet:{folder}", "crash", batch_rows=100)
        source = DbSource(open_sql_database(spec.source))
        source.ensure_state_tables()
        # a run killed after it staged two of its three batches, before it wrote anything
        run_id, _ = _current_run(source, spec, to_micros(SYSTEM.now()))
        assert run_id is not None
        for number in (0, 1):
            _stage_only(spec.source, run_id, number, None)
        # the staged ones are hidden, not lost (block-range batches are about, not exactly, 100)
        left = {int(r["batch"]): int(r["planned"]) for r in source.batches(run_id)}[2]
        assert len(store_rows(pg, "crash")) == left
        result = migrate(spark, spec)
        assert "resumed run" in result.notes[0] and result.inserted == 300
        written = spark.read.parquet(str(folder)).select("message_id").collect()
        assert sorted(r[0] for r in written) == sorted(m.message_id for m in messages)

        # the next run is written, then a file of it disappears before the source lets go
        seed_store(pg, "crash", 300)
        again = MigrationSpec(pg + "&table=crash.delayed", f"parquet:{folder}", "crash", batch_rows=100)
        run_id, _ = _current_run(source, again, to_micros(SYSTEM.now()))
        assert run_id is not None
        for number in (0, 1, 2):
            _stage_only(again.source, run_id, number, None)
        target = FileTarget(str(folder), "parquet")
        frame = spark.createDataFrame([("x",)], "message_id string")
        frame.write.parquet(target.run_folder(spark, run_id).uri)  # a committed folder of one row
        with pytest.raises(ConfigurationError, match=r"holds 1 messages but 300 were taken.*--mode abort"):
            migrate(spark, again)
        aborted = abort(again, spark)
        assert aborted.put_back == 300 and len(store_rows(pg, "crash")) == 300
        assert not target.run_folder(spark, run_id).exists()  # the partial output went with it


def test_a_folder_migration_killed_after_the_files_committed_is_aborted_as_it_would_have_ended(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = importlib.import_module("duetime.bulk.migrate")  # the package's ``migrate`` is the function

    with postgres_schema() as pg:
        seed_store(pg, "late", 200)
        folder = tmp_path / "out"
        spec = MigrationSpec(pg + "&table=late.delayed", f"jsonl:{folder}", "late", batch_rows=100)
        calls: list[int] = []
        real = m._run_tasks

        def killed_before_the_batches_end(*args: Any, **kw: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:  # staging went through, the folder committed: now the kill
                raise RuntimeError("killed")
            return real(*args, **kw)

        monkeypatch.setattr(m, "_run_tasks", killed_before_the_batches_end)
        with pytest.raises(RuntimeError, match="killed"):
            migrate(spark, spec)
        monkeypatch.setattr(m, "_run_tasks", real)
        lines = [json.loads(x) for f in folder.glob("run=*/part-*") for x in f.read_text().splitlines()]
        assert len(lines) == 200 and all(x["body_base64"] is not None for x in lines)
        assert len(store_rows(pg, "late")) == 0  # staged: hidden from dispatchers, still in the source db
        with pytest.raises(ConfigurationError, match="needs Spark"):
            abort(spec)
        # the abort as a user runs it: the command starts Spark to read the run's folder
        done = run_cli(
            "bulk", "migrate", "--from", spec.source, "--to", spec.target, "--endpoint", "late",
            "--mode", "abort", "--json", "--master", "local[1]", cwd=tmp_path, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        ended = json.loads(done.stdout)
        assert ended["put_back"] == 0 and any("already held every message" in n for n in ended["notes"])
        assert (
            len(store_rows(pg, "late")) == 0
            and DbSource(open_sql_database(spec.source)).staged(ended["run_id"], 0) == []
        )


def test_an_input_that_is_missing_empty_or_of_another_format_is_refused_in_one_line(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's own errors here were a Java stack behind "internal error"; an empty folder read as
    no rows at all."""
    from duetime.bulk.schedule import schedule

    (tmp_path / "empty").mkdir()
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "rows.jsonl").write_text('{"destination": "q"}\n')
    url = f"sqlite:///{tmp_path / 'store.db'}"
    refused = {
        f"parquet:{tmp_path / 'none'}": r"/none: does not exist, so there is nothing to read; check the path\.",
        f"parquet:{tmp_path / 'empty'}": r"/empty: holds no data files",
        f"jsonl:{tmp_path / 'lines'}/*.json": r"/lines/\*\.json: matches no file",
        f"parquet:{tmp_path / 'lines'}": r"/lines: cannot be read as parquet \(\[FAILED_READ_FILE.*check the path and the format\.",
    }
    for path, why in refused.items():
        with pytest.raises(ConfigurationError, match=why) as caught:
            import_(spark, path, url)
        assert "\n" not in str(caught.value) and "Exception" not in str(caught.value)
        with pytest.raises(ConfigurationError, match=why):
            schedule(spark, path, url, endpoint="e", job="j")
    assert not (tmp_path / "store.db").exists() or not store_rows(url, "e")


def test_a_glob_reads_what_it_matches_and_other_files_it_matches_later_are_a_new_import(
    spark: Any, tmp_path: Path
) -> None:
    """A run's identity lists what the glob matches: listing the glob itself as a folder found
    nothing, so every glob import was the same run and the second was skipped as written before."""
    first = seed_store(f"sqlite:///{tmp_path / 'a.db'}", "A", 40)
    export(spark, f"sqlite:///{tmp_path / 'a.db'}", f"parquet:{tmp_path / 'out'}", "A")
    target = f"sqlite:///{tmp_path / 'store.db'}"
    glob = f"parquet:{tmp_path / 'out'}/part-*.parquet"
    assert import_(spark, glob, target).inserted == 40
    assert import_(spark, glob, target).inserted == 0  # the same files: written before
    later = seed_store(f"sqlite:///{tmp_path / 'b.db'}", "B", 25)
    export(spark, f"sqlite:///{tmp_path / 'b.db'}", f"parquet:{tmp_path / 'out'}", "B")
    assert import_(spark, glob, target).inserted == 25
    assert set(store_rows(target, "A")) == {m.message_id for m in first}
    assert set(store_rows(target, "B")) == {m.message_id for m in later}
