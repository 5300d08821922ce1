"""Through PgBouncer (transaction pooling) against straight to PostgreSQL, in one run.

    .venv/bin/python bench/pgbouncer_bench.py [--messages 20000] [--producers 8] [--rounds 2]

Each round, for each way in (direct, then through a PgBouncer this benchmark starts on a port of
its own with ``pool_mode = transaction``): ``--producers`` threads schedule ``--messages`` due
messages through the blocking client (one message a call), then the exactly-once dispatcher
moves them all into the PostgreSQL queue. Prints msg/s for both and the ratio of PgBouncer to
direct. Needs root (PgBouncer runs as ``postgres``) and Debian's pgbouncer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg

# The repository's root, last: a PYTHONPATH given (before_after.py) picks the duetime measured.
sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from duetime import DelayedDeliverySettings, Dispatcher, TransactionMode
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore, SyncPostgresQueue
from tests.topology.servers import pgbouncer

BASE = "postgresql://postgres@127.0.0.1:5432/test"


def schedule(url: str, messages: int, producers: int) -> float:
    """Seconds for ``producers`` threads to schedule ``messages`` due now, a call each."""
    each = messages // producers

    def produce(n: int) -> None:
        with duetime.connect_sync(url, endpoint="bench") as client:
            for i in range(each):
                client.schedule("orders", b"x" * 200, delay=0, message_id=f"{n}-{i}")

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


async def drain(url: str) -> float:
    """Seconds for the exactly-once dispatcher to move everything due into the queue."""
    store, transport = PostgresStore.from_url(url), PostgresQueueTransport.from_url(url)
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE)
    started = time.perf_counter()
    await Dispatcher(store, transport, settings, endpoint="bench").run_burst()
    took = time.perf_counter() - started
    await store.close()
    await transport.close()
    return took


def one_way(url: str, messages: int, producers: int) -> tuple[float, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    scoped = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    try:
        with duetime.open_sync_store(scoped) as store:
            store.setup_infrastructure("bench")
        with SyncPostgresQueue.from_url(scoped) as queue:
            queue.declare("orders")
        scheduled = messages / schedule(scoped, messages, producers)
        moved = messages / asyncio.run(drain(scoped))
        return scheduled, moved
    finally:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {"schedule": [], "dispatch": []}
    with pgbouncer(BASE, pool_size=10) as bouncer:
        pooled = f"{bouncer.url(BASE)}?pooler=transaction"
        for round_ in range(args.rounds):
            direct = one_way(BASE, args.messages, args.producers)
            through = one_way(pooled, args.messages, args.producers)
            for i, what in enumerate(("schedule", "dispatch")):
                ratios[what].append(through[i] / direct[i])
                print(
                    f"round {round_ + 1} {what}: direct {direct[i]:,.0f} msg/s, through PgBouncer "
                    f"{through[i]:,.0f} msg/s, ratio {through[i] / direct[i]:.2f}x"
                )
    for what, values in ratios.items():
        print(f"{what}: PgBouncer / direct, median of {len(values)}: {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
