"""`bulk import` of a Parquet file into the embedded SQLite store, beside one careful process.

    .venv/bin/python -m bench.sqlite_import_bench                  # 1,000,000 rows, 2 rounds
    .venv/bin/python -m bench.sqlite_import_bench --rows 200000 --rounds 3

Writes a Parquet file of ``--rows`` messages (200-byte bodies, JSON headers), then each round:
one process reading it a record batch at a time, checking each row's headers parse (as duetime
does) and inserting into the store table in one transaction; then ``bulk import`` in local mode
into a fresh store file. The first round's job pays the Spark session's warm-up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from duetime.bulk.export_import import import_
from duetime.bulk.spark_session import spark_session
from duetime.registry import open_sync_store


def write_rows(path: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = datetime(2031, 1, 1, tzinfo=UTC)
    table = pa.table(
        {
            "message_id": [f"m{i:09d}" for i in range(rows)],
            "destination": ["orders"] * rows,
            "due_at": pa.array(
                [start + timedelta(seconds=i) for i in range(rows)], pa.timestamp("us", tz="UTC")
            ),
            "headers": [f'{{"NServiceBus.MessageId":"{i}"}}' for i in range(rows)],
            "body": [b"x" * 200] * rows,
        }
    )
    pq.write_table(table, path)


def one_process(source: Path, db: Path) -> float:
    import pyarrow.parquet as pq

    store = open_sync_store(f"sqlite:///{db}")
    store.setup_infrastructure("Sales")
    store.close()
    start = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("BEGIN IMMEDIATE")
    for batch in pq.ParquetFile(source).iter_batches(batch_size=50_000):
        rows = []
        for ident, destination, due, headers, body in zip(
            *(c.to_pylist() for c in batch.columns), strict=True
        ):
            json.loads(headers)
            rows.append((ident, destination, int(due.timestamp() * 1e6), headers, body))
        conn.executemany(
            'INSERT INTO "Sales.delayed" (message_id, destination, due_at, headers, body) VALUES (?, ?, ?, ?, ?)',
            rows,
        )
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sqlite_import_bench_"))
    try:
        (scratch / "in").mkdir()
        write_rows(scratch / "in" / "rows.parquet", args.rows)
        spark = spark_session("local[*]")
        spark.range(1).count()
        for n in range(args.rounds):
            one = one_process(scratch / "in" / "rows.parquet", scratch / f"one{n}.db")
            start = time.perf_counter()
            done = import_(spark, f"parquet:{scratch / 'in'}", f"sqlite:///{scratch / f'job{n}.db'}", "Sales")
            job = time.perf_counter() - start
            assert done.inserted == args.rows, done
            print(
                f"round {n}: one process {one:5.1f} s, bulk import {job:5.1f} s = {one / job:.2f}x its rate",
                flush=True,
            )
        spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
