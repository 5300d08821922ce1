"""What one round's pieces cost in CPU, each beside the way it was done before, in one run.

    .venv/bin/python bench/round_cost_bench.py
    .venv/bin/python bench/round_cost_bench.py --count 2000 --only move,engine

Each figure is the median CPU (user and system) of the thread doing the piece, or the process's
CPU per message for the engine, over ``--count`` tries:

- **move**: a PostgreSQL exactly-once move of one due message with the next due time, as one
  statement (``move_due``), beside the same move row by row in a transaction and the next due
  time asked after it on a pooled connection (what a move was before).
- **engine**: the dispatcher alone (memory store and transport) delivering messages due 4 ms apart
  (250 a second), its sleep on asyncio's timer within the default 1 ms lateness budget, beside a
  budget of 0 (the last 2 ms of each sleep on a thread, as every sleep was before).
- **receipt**: a SQLite queue receive of one message, its receipt committed without waiting for
  the disk, beside the same receive with ``synchronous=full`` kept (a flushed commit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.backends.postgres import SyncPostgresQueue, SyncPostgresStore
from duetime.backends.postgres.connection import pooled
from duetime.backends.sqlite import SyncSqliteQueue
from duetime.backends.sqlite import queue as sqlite_queue
from duetime.interfaces import MoveOutcome

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def cpu_of(action: Callable[[], object]) -> float:
    started = time.thread_time()
    action()
    return time.thread_time() - started


def row(piece: str, now: float, before: float, unit: str = "us") -> None:
    scale, digits = (1e6, 0) if unit == "us" else (1e3, 3)
    figures = f"{now * scale:,.{digits}f} {unit} | {before * scale:,.{digits}f} {unit}"
    print(f"| {piece} | {figures} | {now / before:.2f}x |", flush=True)


def move(count: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    url = f"{POSTGRES}?schema={schema}"
    store = SyncPostgresStore.from_url(url)
    try:
        store.setup_infrastructure("rounds")
        store.initialize("rounds", TransactionMode.EXACTLY_ONCE)
        with SyncPostgresQueue.from_url(url) as queue:
            queue.declare("orders")

        def by_hand(at: datetime) -> MoveOutcome:
            with pooled(store.pool, store.options) as conn, conn.transaction():
                moved, dead = store._move(conn, at, 100, "error", lambda m, r: {})
            return MoveOutcome(moved, dead, store._next_due_after_move())

        ways: dict[str, Callable[[datetime], MoveOutcome]] = {
            "statement": lambda at: store.move_due(at, 100, "error", lambda m, r: {}),
            "by hand": by_hand,
        }
        spent: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(count):
            for name, way in ways.items():  # in turn, so the server's moods fall on both
                store.store(
                    DelayedMessage(f"{name}-{i}", "orders", datetime.now(UTC) - timedelta(milliseconds=1))
                )
                at = datetime.now(UTC)
                spent[name].append(cpu_of(lambda way=way, at=at: way(at)))  # type: ignore[misc]
        row(
            "PostgreSQL exactly-once move of one message, next due time read",
            statistics.median(spent["statement"]),
            statistics.median(spent["by hand"]),
        )
    finally:
        store.close()
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def engine_run(count: int, budget: timedelta) -> float:
    store, transport = MemoryStore(), MemoryTransport()
    await transport.declare("orders")
    await store.setup_infrastructure("rounds")
    await store.initialize("rounds", TransactionMode.EXACTLY_ONCE)
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE, lateness_budget=budget)
    dispatcher = Dispatcher(store, transport, settings, endpoint="rounds")
    first = datetime.now(UTC) + timedelta(seconds=0.5)
    await store.store_many(
        [DelayedMessage(f"m{i}", "orders", first + timedelta(seconds=i / 250)) for i in range(count)]
    )
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.4)
    started = time.process_time()
    while len(transport.messages("orders")) < count:
        await asyncio.sleep(0.05)
    spent = time.process_time() - started
    dispatcher.stop()
    await task
    return spent / count


def engine(count: int) -> None:
    count = min(count, 1000)  # the memory store looks at every message it holds each round
    now, before = [], []
    for _ in range(3):  # in turn
        now.append(asyncio.run(engine_run(count, timedelta(milliseconds=1))))
        before.append(asyncio.run(engine_run(count, timedelta(0))))
    row(
        "the engine alone, a message at 250/s (budget 1 ms against 0)",
        statistics.median(now),
        statistics.median(before),
        "ms",
    )


def receipt(count: int) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUETIME_BENCH_DIR")) as folder:
        queue = SyncSqliteQueue(Path(folder) / "receipts.db")
        try:
            queue.declare("orders")
            spent: dict[str, list[float]] = {"relaxed": [], "flushed": []}
            relaxed = sqlite_queue.write_transaction
            for i in range(count):
                for name in spent:
                    queue.send([DelayedMessage(f"{name}-{i}", "orders", datetime.now(UTC))])
                    if name == "flushed":  # the receipt waits for the disk, as every one did before
                        sqlite_queue.write_transaction = lambda conn, durable=True: relaxed(conn)  # type: ignore[assignment]
                    taken: list[Any] = []
                    try:
                        spent[name].append(
                            cpu_of(lambda taken=taken: taken.extend(queue.receive("orders", 10)))
                        )
                    finally:
                        sqlite_queue.write_transaction = relaxed
                    queue.acknowledge(taken)
            row(
                "SQLite queue receive of one message (receipt not flushed against flushed)",
                statistics.median(spent["relaxed"]),
                statistics.median(spent["flushed"]),
            )
        finally:
            queue.close()


PIECES = {"move": move, "engine": engine, "receipt": receipt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="tries of each piece")
    parser.add_argument("--only", default=",".join(PIECES), help="pieces, comma-separated")
    args = parser.parse_args()
    only = args.only.split(",")
    if unknown := set(only) - set(PIECES):
        parser.error(f"--only takes {', '.join(PIECES)}, not {', '.join(sorted(unknown))}")
    print("| piece | now | before | ratio |")
    print("|---|---|---|---|")
    for name in only:
        PIECES[name](args.count)


if __name__ == "__main__":
    main()
