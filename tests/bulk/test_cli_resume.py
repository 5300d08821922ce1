"""A migration as a user runs it from the CLI, killed twice (kill -9, then Ctrl-C) and resumed.

Its own file: it takes three minutes, and the suite gives each file to one worker whole."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from duetime.bulk.sources import BATCHES
from duetime.bulk_interfaces import SqlDatabase
from duetime.registry import open_sql_database
from tests.bulk.conftest import count, create_timeoutdata, table_rows, timeout_rows
from tests.bulk.test_migrate import store_rows
from tests.conftest import run_cli
from tests.services import postgres_schema

pytestmark = pytest.mark.slow


def _progress(db: SqlDatabase) -> int:
    """Batches past 'pending' in the state table (0 before the run is planned)."""
    try:
        with db.session(write=False) as conn:
            if not db.table_exists(conn, BATCHES):
                return 0
            row = db.execute(
                conn, f"SELECT COUNT(*) FROM {db.qualified(BATCHES)} WHERE status <> 'pending'"
            ).fetchone()
            return int(row[0])
    except Exception:
        return 0


@pytest.mark.timeout(420)  # four Spark starts and up to 2 x 180 s waiting for progress
def test_preview_then_a_migration_killed_twice_then_resumed(tmp_path: Path) -> None:
    with postgres_schema() as pg:
        rows = timeout_rows(10_000)
        legacy = create_timeoutdata(pg, "Big_TimeoutData", rows)
        source = pg + "&layout=timeoutdata"
        args = ["bulk", "migrate", "--from", source, "--to", pg, "--endpoint", "Big", "--master", "local[2]"]
        preview = run_cli(*args, "--mode", "preview", timeout=240)
        assert preview.returncode == 0, preview.stderr
        assert "10,000 messages would move" in preview.stdout and "no problems found" in preview.stdout
        state = open_sql_database(pg)
        seen = 0
        rng = random.Random(7)
        # kill -9 (driver, JVM and Python workers at once), then Ctrl-C (SIGINT to the group, as
        # a terminal sends it): each stops the run part way, and the next goes on
        for stop in (signal.SIGKILL, signal.SIGINT):
            proc = subprocess.Popen(
                [sys.executable, "-m", "duetime", *args, "--mode", "migrate", "--batch-rows", "250"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and _progress(state) <= seen and proc.poll() is None:
                time.sleep(0.05)
            if stop == signal.SIGKILL:
                time.sleep(rng.uniform(0, 0.5))
            running = proc.poll() is None  # Ctrl-C at once: a fast machine may finish the run
            os.killpg(proc.pid, stop)
            _, said = proc.communicate(timeout=120)
            if stop == signal.SIGINT and running:
                assert proc.returncode == 130, said[-3000:]
                # one line: no py4j traceback, none of Spark's console output
                lines = [
                    x for x in said.strip().splitlines() if not x.startswith("migrating: ")
                ]  # its progress
                assert len(lines) == 1, said[-3000:]
                assert lines[0].startswith("stopped: what was committed stays; run the same command again"), (
                    said
                )
            # what the stopped run committed last may become visible a moment after it died:
            # counted now, it does not pass for the next run's progress (stopped before it began)
            time.sleep(1)
            seen = _progress(state)
        done = run_cli(*args, "--mode", "migrate", "--batch-rows", "250", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "completed" in done.stdout
        # off a terminal, progress is a line every 10 s and a last one: rows of rows, the rate
        assert "migrating: 10,000 of 10,000 rows (100%), " in done.stderr, done.stderr
        # Spark's start-up notices and warnings are in its log file, not on the terminal
        for noise in ("log4j", "WARN", "incubator", "NativeCodeLoader"):
            assert noise not in done.stderr, done.stderr
        moved = store_rows(pg, "Big")
        assert len(moved) == 10_000 and count(legacy, "Big_TimeoutData") == 0
        assert {m.message_id for m in moved.values()} == {str(r[0]) for r in rows}
        assert table_rows(legacy, "Big_TimeoutData", "Id") == []
