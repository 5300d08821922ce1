"""PostgreSQL: duetime beside raw psycopg doing the same work, in the same run.

    .venv/bin/python bench/postgres_bench.py                # full: 10,000,000 pending rows (~5 min)
    .venv/bin/python bench/postgres_bench.py --quick        # 200,000 pending rows

Prints: scheduling (single-row and COPY), dispatch rate into the PostgreSQL queue (exactly-once and
at-least-once) beside a raw SKIP LOCKED claim-and-delete loop, claim latency with 10,000 vs N pending
rows, and the dispatcher's memory with 10,000 vs N pending. Aims: dispatch >= 0.5x raw,
COPY scheduling >= 0.5x raw COPY, claim latency and memory flat as the backlog grows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.postgres import (
    PostgresQueueTransport,
    PostgresStore,
    SyncPostgresQueue,
    SyncPostgresStore,
)

BASE = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "duetime_bench"
URL = f"{BASE}?schema={SCHEMA}"
ENDPOINT = "bench"
TABLE = f'"{SCHEMA}"."bench.delayed"'
QUEUE = "bench.orders"


def reset() -> None:
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    store = SyncPostgresStore.from_url(URL)
    store.setup_infrastructure(ENDPOINT)
    store.close()
    q = SyncPostgresQueue.from_url(URL)
    q.declare(QUEUE)
    q.close()


def messages(
    n: int, start: datetime, spacing: timedelta = timedelta(microseconds=1), prefix: str = "b"
) -> list[DelayedMessage]:
    return [
        DelayedMessage(f"{prefix}{i:09d}", QUEUE, start + spacing * i, b"x" * 100, {"k": "v"})
        for i in range(n)
    ]


def copy_rows(conn: psycopg.Connection, msgs: list[DelayedMessage]) -> None:
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY {TABLE} (message_id, destination, due_at, headers, body) FROM STDIN") as copy,
    ):
        for m in msgs:
            copy.write_row((m.message_id, m.destination, m.due_at, '{"k":"v"}', m.body))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def raw_single(msgs: list[DelayedMessage]) -> None:
    with psycopg.connect(BASE, autocommit=True) as conn:
        for m in msgs:
            conn.execute(
                f"INSERT INTO {TABLE} (message_id, destination, due_at, headers, body) VALUES (%s, %s, %s, %s, %s)",
                (m.message_id, m.destination, m.due_at, '{"k":"v"}', m.body),
            )


def raw_copy(msgs: list[DelayedMessage], chunk: int) -> None:
    with psycopg.connect(BASE, autocommit=True) as conn:
        for i in range(0, len(msgs), chunk):
            with conn.transaction():
                copy_rows(conn, msgs[i : i + chunk])


def raw_claim_move(batch: int, *, one_insert: bool = False) -> int:
    """Baseline dispatcher: take a batch with SKIP LOCKED, enqueue it, delete it: one transaction.
    The queue insert is a statement per message, or with ``one_insert`` one statement from
    arrays (as duetime's exactly-once move does): the stronger baseline."""
    moved = 0
    queue_table = f'"{SCHEMA}".duetime_queue_messages'
    with psycopg.connect(BASE, autocommit=True) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    f"DELETE FROM {TABLE} WHERE message_id IN (SELECT message_id FROM {TABLE} WHERE due_at <= now() "
                    "ORDER BY due_at, message_id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING message_id, headers::text, body",
                    (batch,),
                ).fetchall()
                if rows and one_insert:
                    ids, headers, bodies = (list(c) for c in zip(*rows, strict=True))
                    conn.execute(
                        f"INSERT INTO {queue_table} (queue, message_id, headers, body) SELECT %(queue)s, u.i, "
                        "u.h::json, u.b FROM unnest(%(ids)b::text[], %(headers)b::text[], %(bodies)b::bytea[]) AS u(i, h, b)",
                        {"queue": QUEUE, "ids": ids, "headers": headers, "bodies": bodies},
                    )
                elif rows:
                    with conn.cursor() as cur:
                        cur.executemany(
                            f"INSERT INTO {queue_table} (queue, message_id, headers, body) VALUES (%s, %s, %s, %s)",
                            [(QUEUE, r[0], r[1], r[2]) for r in rows],
                        )
            if not rows:
                return moved
            moved += len(rows)


async def dispatch(mode: TransactionMode, batch: int) -> None:
    store, transport = PostgresStore.from_url(URL), PostgresQueueTransport.from_url(URL)
    settings = DelayedDeliverySettings(transaction_mode=mode, batch_size=batch)
    await Dispatcher(store, transport, settings, endpoint=ENDPOINT).run_burst()
    await store.close()
    await transport.close()


def claim_latency(samples: int = 200) -> list[float]:
    """Time fetch_due of 100 due rows at the head of the table, then give them back."""
    store = SyncPostgresStore.from_url(URL)
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    at = datetime.now(UTC)
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        got = store.fetch_due(at, 100)
        times.append((time.perf_counter() - started) * 1000)
        store.release([m.message_id for m in got])
    store.close()
    return times


# VmHWM, not ru_maxrss: on Linux ru_maxrss keeps the parent's high-water mark across fork+exec,
# so a child of a bench that just built 200,000 messages would "use" that memory too.
MEMORY_PROBE = """
import asyncio, sys, time
from duetime import DelayedDeliverySettings, Dispatcher, TransactionMode
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore
async def main():
    store, transport = PostgresStore.from_url(sys.argv[1]), PostgresQueueTransport.from_url(sys.argv[1])
    d = Dispatcher(store, transport, DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE), endpoint="bench")
    task = asyncio.create_task(d.run())
    await asyncio.sleep(float(sys.argv[2]))
    d.stop(); await task
    hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(hwm, d.stats.forwarded)
asyncio.run(main())
"""


def dispatcher_memory(seconds: float) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, URL, str(seconds)], capture_output=True, text=True, check=True
    )
    rss, forwarded = out.stdout.split()
    return int(rss), int(forwarded)


def describe(values: list[float]) -> str:
    ordered = sorted(values)
    return f"p50 {statistics.median(ordered):6.2f} ms  p99 {ordered[int(0.99 * (len(ordered) - 1))]:6.2f} ms"


def load_pending(n: int) -> None:
    """n rows due in a year, COPYed in chunks with progress."""
    future = datetime.now(UTC) + timedelta(days=365)
    chunk = 200_000
    with psycopg.connect(BASE, autocommit=True) as conn:
        for i in range(0, n, chunk):
            with conn.transaction():
                copy_rows(
                    conn, messages(min(chunk, n - i), future + timedelta(seconds=i), prefix=f"p{i:09d}-")
                )
            print(f"\r  loading pending rows: {min(n, i + chunk):,}/{n:,}", end="", flush=True)
        conn.execute(f"ANALYZE {TABLE}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pending", type=int, default=None, help="backlog size for the flatness checks")
    parser.add_argument(
        "--only",
        default="scheduling,dispatch,consume,flatness",
        help="comma-separated sections to run (scheduling, dispatch, consume, flatness); default all",
    )
    args = parser.parse_args()
    sections = set(args.only.split(","))
    pending = args.pending or (200_000 if args.quick else 10_000_000)
    n_single, n_copy, n_dispatch = (1_000, 50_000, 20_000) if args.quick else (3_000, 300_000, 100_000)
    past = datetime.now(UTC) - timedelta(hours=1)
    print(f"PostgreSQL bench against {BASE} (schema {SCHEMA})\n")

    if "scheduling" in sections:
        scheduling(n_single, n_copy, past)
    if "dispatch" in sections:
        dispatching(n_dispatch, past)
    if "consume" in sections:
        consuming(n_dispatch, past)
    if "flatness" in sections:
        flatness(pending, past)
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def scheduling(n_single: int, n_copy: int, past: datetime) -> None:
    print("scheduling")
    reset()
    raw = n_single / timed(lambda: raw_single(messages(n_single, past, prefix="r")))
    store = SyncPostgresStore.from_url(URL)
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    singles = messages(n_single, past, prefix="s")
    ours = n_single / timed(lambda: [store.store(m) for m in singles])
    print(f"  raw single-row INSERT        {raw:10,.0f} msg/s")
    print(f"  duetime store (one each)     {ours:10,.0f} msg/s   ratio {ours / raw:.2f}")
    bulk = messages(n_copy, past, prefix="c")
    reset()
    raw_c = n_copy / timed(lambda: raw_copy(bulk, 50_000))
    reset()
    store = SyncPostgresStore.from_url(URL)
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    ours_c = n_copy / timed(
        lambda: [store.store_many(bulk[i : i + 50_000]) for i in range(0, n_copy, 50_000)]
    )
    store.close()
    print(f"  raw COPY (50,000 a chunk)    {raw_c:10,.0f} msg/s")
    print(f"  duetime store_many (COPY)    {ours_c:10,.0f} msg/s   ratio {ours_c / raw_c:.2f}\n")


def dispatching(n_dispatch: int, past: datetime) -> None:
    print(f"dispatch into the PostgreSQL queue ({n_dispatch:,} due, batches of 100, best of 2)")
    due = messages(n_dispatch, past, prefix="d")

    def best(run: Callable[[], object]) -> float:
        rates = []
        for _ in range(2):
            reset()
            raw_copy(due, 50_000)
            rates.append(n_dispatch / timed(run))
        return max(rates)

    raw_d = best(lambda: raw_claim_move(100))
    raw_one = best(lambda: raw_claim_move(100, one_insert=True))
    print(f"  raw SKIP LOCKED take-enqueue-delete  {raw_d:10,.0f} msg/s   (an INSERT per message)")
    print(f"  the same, one INSERT per batch       {raw_one:10,.0f} msg/s")
    for mode in (TransactionMode.EXACTLY_ONCE, TransactionMode.AT_LEAST_ONCE):
        rate = best(lambda: asyncio.run(dispatch(mode, 100)))  # noqa: B023
        print(
            f"  duetime {mode.value:<28} {rate:10,.0f} msg/s   ratio {rate / raw_d:.2f}, "
            f"{rate / raw_one:.2f} to one INSERT per batch"
        )
    print()


def raw_consume(batch: int) -> int:
    """The raw limit of a consumer: take a batch and delete it in one statement, until empty.
    Never sorting, as the queue's own connections: the fresh table's statistics would otherwise
    plan a read and sort of every waiting row per batch, a baseline no better than a mistake."""
    table = f'"{SCHEMA}".duetime_queue_messages'
    got = 0
    with psycopg.connect(BASE, autocommit=True, options="-c enable_sort=off") as conn:
        while rows := conn.execute(
            f"DELETE FROM {table} WHERE seq IN (SELECT seq FROM {table} WHERE queue = %s "
            "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING message_id, headers, body",
            (QUEUE, batch),
        ).fetchall():
            got += len(rows)
    return got


def consuming(n: int, past: datetime) -> None:
    """The consumer's drain rate: receive a batch, acknowledge it (one statement)."""
    print(f"consuming the PostgreSQL queue ({n:,} waiting, batches of 500, best of 2)")
    waiting = messages(n, past, prefix="q")

    def best(run: Callable[[], object]) -> float:
        rates = []
        for _ in range(2):
            reset()
            with SyncPostgresQueue.from_url(URL) as q:
                for i in range(0, n, 5_000):
                    q.send(waiting[i : i + 5_000])
            rates.append(n / timed(run))
        return max(rates)

    def ours() -> None:
        with SyncPostgresQueue.from_url(URL) as q:
            while batch := q.receive(QUEUE, 500, 0.0):
                q.acknowledge(batch)

    raw = best(lambda: raw_consume(500))
    rate = best(ours)
    print(f"  raw take-and-delete (one statement)  {raw:10,.0f} msg/s")
    print(f"  duetime receive + acknowledge        {rate:10,.0f} msg/s   ratio {rate / raw:.2f}\n")


def flatness(pending: int, past: datetime) -> None:
    print(f"claim latency and dispatcher memory: 10,000 vs {pending:,} pending rows (100 due at the head)")
    results = {}
    for size in (10_000, pending):
        reset()
        load_pending(size)
        raw_copy(messages(100, past, prefix="h"), 100)
        latency = claim_latency()
        raw_copy(messages(20_000, past, prefix="m"), 20_000)
        rss, forwarded = dispatcher_memory(3.0)
        results[size] = (latency, rss)
        print(
            f"  {size:>12,} pending: claim {describe(latency)}   dispatcher max RSS {rss / 1024:7.1f} MB ({forwarded} forwarded)"
        )
    small, large = results[10_000], results[pending]
    print(
        f"  ratio large/small: claim p50 {statistics.median(large[0]) / statistics.median(small[0]):.2f}, "
        f"memory {large[1] / small[1]:.2f}"
    )


if __name__ == "__main__":
    main()
