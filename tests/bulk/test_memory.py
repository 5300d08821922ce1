"""A task's Python memory does not grow with the rows in its partition.

Executor Python lives outside ``spark.executor.memory``: a task holding a whole partition in lists
gets its container killed by YARN or Kubernetes. Here one partition of 100,000 rows and then one of
1,000,000 are scheduled from Parquet into a store while the Python workers' resident memory is
sampled from /proc; the peak may not grow with the rows.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from duetime.bulk.schedule import schedule
from tests.bulk.conftest import spark_settings

pytestmark = pytest.mark.slow


def _python_workers() -> list[int]:
    """Spark's Python workers started by this process's own Spark (other test processes run
    Sparks of their own at the same time)."""
    parents: dict[int, int] = {}
    workers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            if b"pyspark.daemon" in (entry / "cmdline").read_bytes():
                workers.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    me = os.getpid()

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 1)
            if pid == me:
                return True
        return False

    return [pid for pid in workers if ours(pid)]


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@contextmanager
def peak_worker_rss() -> Iterator[list[float]]:
    """The largest resident size any one Python worker reached meanwhile (MB), sampled every 50 ms."""
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid in _python_workers():
                peak[0] = max(peak[0], _rss_mb(pid))
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def _parquet(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    due = datetime(2031, 1, 1, tzinfo=UTC)
    ids = pa.array([f"m{i}" for i in range(rows)])
    pq.write_table(
        pa.table(
            {
                "id": ids,
                "destination": pa.array(["orders"] * rows),
                "due_at": pa.array([due] * rows, pa.timestamp("us", tz="UTC")),
                "body": pa.array([b"x" * 200] * rows),
            }
        ),
        path,
        row_group_size=100_000,
    )


@pytest.mark.timeout(600)
def test_a_tasks_python_memory_stays_flat_from_100k_to_1m_rows_per_partition(
    spark: Any, tmp_path: Path
) -> None:
    # one file, one partition: no byte limit, and no splitting to give every core a share
    settings = {"spark.sql.files.maxPartitionBytes": str(4 << 30), "spark.sql.files.minPartitionNum": "1"}
    with spark_settings(spark, settings):
        peaks = {}
        for rows in (100_000, 1_000_000):
            source = tmp_path / f"rows-{rows}.parquet"
            _parquet(source, rows)
            assert spark.read.parquet(str(source)).rdd.getNumPartitions() == 1
            store = f"sqlite:///{tmp_path / f'store-{rows}.db'}"
            with peak_worker_rss() as peak:
                done = schedule(spark, f"parquet:{source}", store, endpoint="mem", job="mem", batch_rows=rows)
            assert (done.rows, done.stored) == (rows, rows)
            peaks[rows] = peak[0]
    print(f"peak Python worker RSS: 100k rows {peaks[100_000]:.0f} MB, 1M rows {peaks[1_000_000]:.0f} MB")
    assert peaks[100_000] > 0, "no Python worker was seen: the sampler looks for the wrong process"
    # 10x the rows: held in lists this is ~10x the memory (200 MB of bodies alone); streamed, flat
    assert peaks[1_000_000] < 1.5 * peaks[100_000] + 50
