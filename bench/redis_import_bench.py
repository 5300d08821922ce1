"""`bulk import` of a Parquet file into a Redis store, beside one process storing the same rows.

    .venv/bin/python -m bench.redis_import_bench                   # 1,000,000 rows, 2 rounds
    .venv/bin/python -m bench.redis_import_bench --rows 200000 --rounds 2

Writes a Parquet file of ``--rows`` messages (200-byte bodies, JSON headers), then each round:
one process reading it a record batch at a time and storing the messages with the store's own
``store_many``, 1,000 a call (the way a program fills a Redis store fastest); then ``bulk
import`` in local mode (the store's bulk writer: a script a thousand rows, each part once) into
a fresh prefix. The first round's job pays the Spark session's warm-up. Ratios are the one
process's time over the job's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.sqlite_import_bench import write_rows
from duetime import DelayedMessage, TransactionMode
from duetime.bulk.export_import import import_
from duetime.bulk.spark_session import spark_session
from duetime.registry import open_sync_store

REDIS = os.environ.get("DUETIME_BENCH_REDIS", "redis://127.0.0.1:6379/0")


def drop(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS)
    for key in client.scan_iter(f"{prefix}*", count=10_000):
        client.unlink(key)


def one_process(source: Path, url: str) -> float:
    import json

    import pyarrow.parquet as pq

    store = open_sync_store(url)
    store.setup_infrastructure("Sales")
    store.initialize("Sales", TransactionMode.AT_LEAST_ONCE)
    start = time.perf_counter()
    for batch in pq.ParquetFile(source).iter_batches(batch_size=1_000):
        store.store_many(
            [
                DelayedMessage(ident, destination, due, body, json.loads(headers))
                for ident, destination, due, headers, body in zip(
                    *(c.to_pylist() for c in batch.columns), strict=True
                )
            ]
        )
    took = time.perf_counter() - start
    store.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "rows.parquet"
        write_rows(source, args.rows)
        spark = spark_session("local[*]")
        for n in range(args.rounds):
            prefixes = [f"redis-bench-{uuid.uuid4().hex[:8]}:" for _ in range(2)]
            try:
                base = one_process(source, f"{REDIS}?prefix={prefixes[0]}")
                start = time.perf_counter()
                done = import_(spark, f"parquet:{source}", f"{REDIS}?prefix={prefixes[1]}", endpoint="Sales")
                took = time.perf_counter() - start
                assert done.inserted == args.rows, done
            finally:
                for prefix in prefixes:
                    drop(prefix)
            print(
                f"round {n}: one process {base:5.1f} s, bulk import {took:5.1f} s = {base / took:.2f}x its rate "
                f"({args.rows / took:,.0f} rows/s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
