"""Dispatch with Prometheus metrics on against off, in one run (the target: >= 0.95x).

    .venv/bin/python bench/metrics_bench.py              # 50,000 messages, 5 rounds each side
    .venv/bin/python bench/metrics_bench.py --quick      # 5,000 messages, 3 rounds

Each round stores N messages already due and times ``run_burst`` until all are forwarded; rounds
alternate off / on so machine noise falls on both. Two paths: SQLite exactly-once into its own
queue table (the fastest path, where a per-message cost shows most), and memory store into memory
transport (no I/O at all: the observer's cost laid bare).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore
from duetime.interfaces import DelayedMessageStore, Transport
from duetime.observability.metrics import instrument

ENDPOINT = "bench"
QUEUE = "bench.orders"
Backends = Callable[[int], tuple[DelayedMessageStore, Transport, TransactionMode]]


def sqlite(folder: Path) -> Backends:
    def make(round_: int) -> tuple[DelayedMessageStore, Transport, TransactionMode]:
        path = folder / f"r{round_}.db"
        return (
            SqliteStore.from_url(f"sqlite:///{path}"),
            SqliteQueueTransport.from_url(f"sqlite:///{path}"),
            TransactionMode.EXACTLY_ONCE,
        )

    return make


def memory(round_: int) -> tuple[DelayedMessageStore, Transport, TransactionMode]:
    return MemoryStore(), MemoryTransport(), TransactionMode.AT_LEAST_ONCE


async def one_round(make: Backends, round_: int, count: int, metrics: bool) -> float:
    store, transport, mode = make(round_)
    await store.setup_infrastructure(ENDPOINT)
    await store.initialize(ENDPOINT, mode)
    await transport.start()
    await transport.declare(QUEUE)
    due = datetime.now(UTC) - timedelta(seconds=1)
    await store.store_many([DelayedMessage(f"m{i:07d}", QUEUE, due) for i in range(count)])
    settings = DelayedDeliverySettings(transaction_mode=mode, batch_size=500)
    dispatcher = Dispatcher(store, transport, settings, endpoint=ENDPOINT)
    if metrics:
        instrument(dispatcher)
    started = time.perf_counter()
    stats = await dispatcher.run_burst()
    elapsed = time.perf_counter() - started
    assert stats.forwarded == count, stats
    await transport.close()
    await store.close()
    return count / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count, rounds = (5_000, 3) if args.quick else (50_000, 5)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{count:,} messages due at once, batches of 500, {rounds} rounds each side, alternating")
        print("| path | metrics off (median msg/s) | metrics on | on / off |")
        print("|---|---|---|---|")
        for name, make in (
            ("SQLite exactly-once -> SQLite queue", sqlite(Path(tmp))),
            ("memory -> memory", memory),
        ):
            off: list[float] = []
            on: list[float] = []
            for r in range(rounds):
                off.append(await one_round(make, 2 * r, count, False))
                on.append(await one_round(make, 2 * r + 1, count, True))
            a, b = statistics.median(off), statistics.median(on)
            print(f"| {name} | {a:,.0f} | {b:,.0f} | **{b / a:.2f}** |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
