"""Scheduling one message per call: sequential, 16 producers at once, and the raw single insert.

    .venv/bin/python bench/producers_bench.py             # 4,000 messages per figure
    .venv/bin/python bench/producers_bench.py --count 1000

A web application calls ``schedule`` from many requests at once; each call must return only once
its message is durable. Per store (SQLite file, PostgreSQL), in one run:

- **raw**: the driver alone, one ``INSERT`` and one commit per message into a table of the same
  shape: what one durable write costs on this disk and server;
- **sequential**: one call after another, with each client: ``await client.schedule(...)`` on the
  async client, ``client.schedule(...)`` on the blocking one (``duetime.connect_sync``), which
  skips the hop to a store thread and back and so runs faster;
- **16 coroutines**: 16 producers on one event loop, each scheduling its share one at a time,
  against the async client's sequential rate;
- **16 threads**: 16 blocking producers on threads, against the blocking client's sequential rate
  (each against the rate its own producers would have one at a time).

Concurrent callers share commits (``duetime/backends/_shared_commit.py``); the target is 16
producers >= 5x the sequential rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

import duetime

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
PRODUCERS = 16


def rate(count: int, work: Callable[[], None]) -> float:
    started = time.perf_counter()
    work()
    return count / (time.perf_counter() - started)


def raw_sqlite(path: Path, count: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE t (id TEXT PRIMARY KEY, destination TEXT, due_at INTEGER, headers TEXT, body BLOB)"
    )

    def work() -> None:
        for i in range(count):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, 'orders', ?, '{}', ?)", (uuid.uuid4().hex, i, b"x" * 100))
            conn.execute("COMMIT")

    try:
        return rate(count, work)
    finally:
        conn.close()


def raw_postgres(schema: str, count: int) -> float:
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".raw (id text PRIMARY KEY, destination text, due_at timestamptz, headers jsonb, body bytea)'
        )

        def work() -> None:
            for _ in range(count):
                conn.execute(
                    f'INSERT INTO "{schema}".raw VALUES (%s, %s, now(), %s, %s)',
                    (uuid.uuid4().hex, "orders", "{}", b"x" * 100),
                )

        return rate(count, work)


def sequential_blocking(url: str, count: int) -> float:
    with duetime.connect_sync(url, endpoint="bench") as client:
        started = time.perf_counter()
        for _ in range(count):
            client.schedule("orders", b"x" * 100, delay="1h")
        return count / (time.perf_counter() - started)


async def sequential(url: str, count: int) -> float:
    async with duetime.connect(url, endpoint="bench") as client:
        started = time.perf_counter()
        for _ in range(count):
            await client.schedule("orders", b"x" * 100, delay="1h")
        return count / (time.perf_counter() - started)


async def coroutines(url: str, count: int) -> float:
    async with duetime.connect(url, endpoint="bench") as client:

        async def producer() -> None:
            for _ in range(count // PRODUCERS):
                await client.schedule("orders", b"x" * 100, delay="1h")

        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
        return count // PRODUCERS * PRODUCERS / (time.perf_counter() - started)


def threads(url: str, count: int) -> float:
    with duetime.connect_sync(url, endpoint="bench") as client:

        def producer() -> None:
            for _ in range(count // PRODUCERS):
                client.schedule("orders", b"x" * 100, delay="1h")

        started = time.perf_counter()
        with ThreadPoolExecutor(PRODUCERS) as pool:
            for future in [pool.submit(producer) for _ in range(PRODUCERS)]:
                future.result()
        return count // PRODUCERS * PRODUCERS / (time.perf_counter() - started)


def report(name: str, raw: float, seq: float, co: float, seq_blocking: float, th: float) -> None:
    print(
        f"| {name} | {raw:,.0f} | {seq:,.0f} ({seq / raw:.2f}x raw) | {co:,.0f} (**{co / seq:.1f}x**) "
        f"| {seq_blocking:,.0f} ({seq_blocking / raw:.2f}x raw) | {th:,.0f} (**{th / seq_blocking:.1f}x**) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=4_000)
    args = parser.parse_args()
    n = args.count
    print(f"{n:,} messages per figure, {PRODUCERS} producers for the concurrent ones; rates in messages/s")
    print(
        "| store | raw insert+commit | async: sequential | 16 coroutines (x sequential) "
        "| blocking: sequential | 16 threads (x sequential) |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        raw = raw_sqlite(base / "raw.db", n)
        seq = asyncio.run(sequential(f"sqlite:///{base / 'seq.db'}", n))
        co = asyncio.run(coroutines(f"sqlite:///{base / 'co.db'}", n))
        seq_blocking = sequential_blocking(f"sqlite:///{base / 'seqb.db'}", n)
        th = threads(f"sqlite:///{base / 'th.db'}", n)
        report("SQLite (synchronous=FULL)", raw, seq, co, seq_blocking, th)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = f"{POSTGRES}?schema={schema}"
        raw = raw_postgres(schema, n)
        seq = asyncio.run(sequential(url, n))
        co = asyncio.run(coroutines(url, n))
        seq_blocking = sequential_blocking(url, n)
        th = threads(url, n)
        report("PostgreSQL", raw, seq, co, seq_blocking, th)
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
