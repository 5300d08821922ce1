"""File inputs are spread over tasks by row count, the same way wherever a run goes on.

A Parquet file written as one large row group is a single task to Spark's reader however many rows
it holds, and where the reader splits files at all depends on the cluster's cores and settings. A
file migration ledgers each partition it wrote by number; a run resumed where the reader splits
differently must find the same rows under the same number, or it skips rows it never wrote.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from duetime.bulk.export_import import import_
from duetime.bulk.frames import checked_files
from duetime.bulk.schedule import schedule
from tests.bulk.conftest import spark_settings
from tests.bulk.test_migrate import store_rows
from tests.conftest import sqlite_file

ROWS = 5_000


def _parquet(path: Path, rows: int, row_group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    due = datetime(2031, 1, 1, tzinfo=UTC)
    pq.write_table(
        pa.table(
            {
                "id": pa.array([f"m{i}" for i in range(rows)]),
                "destination": pa.array(["orders"] * rows),
                "due_at": pa.array([due] * rows, pa.timestamp("us", tz="UTC")),
                "body": pa.array([f"body {i}".encode() * 20 for i in range(rows)]),
            }
        ),
        path,
        row_group_size=row_group,
    )


def reader_splits(spark: Any, max_bytes: int) -> AbstractContextManager[None]:
    """Spark's Parquet reader with splits of at most ``max_bytes`` (a row group is never split)."""
    return spark_settings(
        spark, {"spark.sql.files.maxPartitionBytes": str(max_bytes), "spark.sql.files.openCostInBytes": "0"}
    )


def _ids_by_partition(spark: Any, path: Path, partitions: int) -> dict[int, set[str]]:
    from pyspark.sql import functions as F

    frame = checked_files(spark, str(path), "parquet", "files", partitions)
    got: dict[int, set[str]] = {}
    for row in frame.select(F.spark_partition_id().alias("p"), "message_id").collect():
        got.setdefault(int(row[0]), set()).add(str(row[1]))
    return got


def test_a_file_of_one_row_group_is_spread_over_tasks_by_row_count(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "one-group.parquet"
    _parquet(source, ROWS, row_group=ROWS)
    assert spark.read.parquet(str(source)).rdd.getNumPartitions() == 1  # the reader: one task
    parts = _ids_by_partition(spark, source, 5)
    assert sorted(parts) == [0, 1, 2, 3, 4]
    assert sum(len(ids) for ids in parts.values()) == ROWS
    assert all(700 <= len(ids) <= 1_300 for ids in parts.values()), {p: len(i) for p, i in parts.items()}
    store = f"sqlite:///{tmp_path / 'store.db'}"
    done = schedule(spark, f"parquet:{source}", store, endpoint="spread", job="spread", batch_rows=1_000)
    assert (done.rows, done.stored, done.rejected) == (ROWS, ROWS, 0)
    assert len(store_rows(store, "spread")) == ROWS


def test_partitions_hold_the_same_rows_however_the_reader_splits_the_files(
    spark: Any, tmp_path: Path
) -> None:
    source = tmp_path / "groups.parquet"
    _parquet(source, ROWS, row_group=250)
    with reader_splits(spark, 1 << 30):
        coarse = spark.read.parquet(str(source)).rdd.getNumPartitions()
        whole = _ids_by_partition(spark, source, 4)
    with reader_splits(spark, 16 << 10):
        fine = spark.read.parquet(str(source)).rdd.getNumPartitions()
        split = _ids_by_partition(spark, source, 4)
    assert coarse < fine, (coarse, fine)  # the premise: the reader's own splits differ
    assert whole == split


def test_a_file_import_resumed_where_the_reader_splits_differently_writes_every_row(
    spark: Any, tmp_path: Path
) -> None:
    """The first run "crashed" after two of its five partitions committed: the rows and ledger
    entries of the other three are taken out, as if never written. The run resumes on a reader
    that splits the file into many more pieces."""
    source = tmp_path / "resume.parquet"
    _parquet(source, ROWS, row_group=250)
    db = tmp_path / "store.db"
    store = f"sqlite:///{db}"
    with reader_splits(spark, 1 << 30):
        first = import_(spark, f"parquet:{source}", store, "files", batch_rows=1_000)
        parts = _ids_by_partition(spark, source, 5)
    assert first.inserted == ROWS and first.batches == 5
    lost = sorted(parts[2] | parts[3] | parts[4])
    with sqlite_file(db) as conn:
        table = next(
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            if "files" in name and "ledger" not in name
        )
        conn.executemany(f'DELETE FROM "{table}" WHERE message_id=?', [(i,) for i in lost])
        assert conn.execute("DELETE FROM duetime_bulk_ledger WHERE batch >= 2").rowcount == 3
    assert len(store_rows(store, "files")) == ROWS - len(lost)
    with reader_splits(spark, 16 << 10):
        assert spark.read.parquet(str(source)).rdd.getNumPartitions() > 5
        again = import_(spark, f"parquet:{source}", store, "files", batch_rows=1_000)
    assert again.inserted == len(lost), again.notes
    assert set(store_rows(store, "files")) == {f"m{i}" for i in range(ROWS)}
