"""``duetime demo``: schedule thousands of messages, deliver them, and check every promise."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore, SyncSqliteQueue, SyncSqliteStore
from duetime.clock import SYSTEM, SystemClock
from duetime.engine.dispatcher import Dispatcher
from duetime.errors import ConfigurationError
from duetime.interfaces import ReceivedMessage
from duetime.message import DUE_AT_HEADER, DelayedMessage
from duetime.settings import DelayedDeliverySettings, TransactionMode

QUEUE = "demo.orders"
ENDPOINT = "demo"


class Consumer(threading.Thread):
    """Receives from the queue like a real program would, noting when each message arrived."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.queue = SyncSqliteQueue(path, poll_interval=0.002)
        self.arrivals: list[tuple[str, datetime, datetime]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        clock = SystemClock()
        items: list[ReceivedMessage] = []
        while not self.stop.is_set():
            items = self.queue.receive(QUEUE, 500, wait=0.1, done=items)  # the last ones acknowledged first
            arrived = clock.now()
            for item in items:
                due = datetime.fromisoformat(item.headers[DUE_AT_HEADER])
                self.arrivals.append((item.message_id, due, arrived))
        self.queue.acknowledge(items)
        self.queue.close()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def _scratch_folder() -> tempfile.TemporaryDirectory[str]:
    """A folder for the demo's database, removed at the end; a clear error where none can be made
    (a read-only root filesystem with nothing writable mounted at /tmp)."""
    try:
        return tempfile.TemporaryDirectory(prefix="duetime-demo-")
    except OSError as error:
        raise ConfigurationError(
            f"the demo needs a folder it may write, and found none ({error}); mount a writable "
            "volume at /tmp (a read-only root filesystem needs one), set TMPDIR to a writable "
            "folder, or give --db PATH"
        ) from None


def run_demo(count: int, spread: timedelta, mode: TransactionMode, db: str | None, console: Console) -> bool:
    folder = None if db else _scratch_folder()
    path = Path(db) if db else Path(folder.name) / "demo.db"  # type: ignore[union-attr]
    console.print(
        f"[bold]duetime demo[/]: {count} messages due over {spread.total_seconds():g} s, "
        f"{mode.value}, store and queue in {path}",
        markup=True,
    )
    sync = SyncSqliteStore(path)
    sync.setup_infrastructure(ENDPOINT)
    sync.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    setup_queue = SyncSqliteQueue(path)
    setup_queue.declare(QUEUE)
    setup_queue.close()

    clock = SystemClock()
    base = clock.now() + timedelta(seconds=1)
    step = spread / max(count - 1, 1)
    progress = Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    consumer = Consumer(path)
    with progress:
        scheduling = progress.add_task("scheduling", total=count)
        started = SYSTEM.monotonic()
        for first in range(0, count, 1000):
            chunk = [
                DelayedMessage(f"demo-{i:07d}", QUEUE, base + step * i, f"order {i}".encode())
                for i in range(first, min(count, first + 1000))
            ]
            sync.store_many(chunk)
            progress.advance(scheduling, len(chunk))
        schedule_rate = count / max(SYSTEM.monotonic() - started, 1e-9)
        sync.close()
        delivering = progress.add_task("delivered", total=count)
        consumer.start()
        asyncio.run(_dispatch(path, mode, consumer, count, base + spread, progress, delivering))
        consumer.stop.set()
        consumer.join()
    ok = _summary(console, consumer.arrivals, count, schedule_rate, mode)
    if folder is not None:
        folder.cleanup()
    return ok


async def _dispatch(
    path: Path,
    mode: TransactionMode,
    consumer: Consumer,
    count: int,
    last_due: datetime,
    progress: Progress,
    task: object,
) -> None:
    store = SqliteStore(SyncSqliteStore(path))
    transport = SqliteQueueTransport(path)
    dispatcher = Dispatcher(
        store, transport, DelayedDeliverySettings(transaction_mode=mode), endpoint=ENDPOINT
    )
    running = asyncio.create_task(dispatcher.run())
    give_up = SYSTEM.monotonic() + (last_due - SYSTEM.now()).total_seconds() + 30
    while len(consumer.arrivals) < count and SYSTEM.monotonic() < give_up and not running.done():
        progress.update(task, completed=len(consumer.arrivals))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # anything arriving now would be a duplicate: wait to see it
    progress.update(task, completed=len(consumer.arrivals))  # type: ignore[arg-type]
    dispatcher.stop()
    await running
    await transport.close()
    await store.close()


def _summary(
    console: Console,
    arrivals: list[tuple[str, datetime, datetime]],
    count: int,
    rate: float,
    mode: TransactionMode,
) -> bool:
    seen = Counter(i for i, _, _ in arrivals)
    expected = {f"demo-{i:07d}" for i in range(count)}
    missing = len(expected - set(seen))
    duplicates = sum(n - 1 for n in seen.values())
    lateness = [(arrived - due).total_seconds() * 1000 for _, due, arrived in arrivals]
    early = sum(1 for value in lateness if value < 0)
    table = Table(title="duetime demo: summary", show_header=False)
    table.add_row("mode", mode.value)
    table.add_row("scheduled", f"{count} ({rate:,.0f} messages/s)")
    table.add_row("delivered", str(len(seen)))
    table.add_row("missing", _flag(missing))
    table.add_row("duplicates", _flag(duplicates))
    table.add_row("arrived early", _flag(early))
    if lateness:
        table.add_row(
            "lateness (due -> consumer)",
            f"p50 {statistics.median(lateness):.1f} ms, p99 {_percentile(lateness, 0.99):.1f} ms, "
            f"max {max(lateness):.1f} ms",
        )
    console.print(table)
    ok = missing == 0 and early == 0 and (duplicates == 0 or mode is TransactionMode.AT_LEAST_ONCE)
    console.print(
        "[bold green]all delivered, none early, none doubled[/]" if ok else "[bold red]promise broken[/]",
        markup=True,
    )
    return ok


def _flag(n: int) -> Text:
    return Text.from_markup("[green]0[/]" if n == 0 else f"[bold red]{n}[/]")
