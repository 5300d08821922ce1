"""Real time, real processes, one SQLite file: wake-ups, several dispatchers, the front door."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, FrontDoor, TransactionMode
from duetime.backends.sqlite import (
    SqliteQueueTransport,
    SqliteStore,
    SyncSqliteQueue,
    SyncSqliteStore,
    filewatch,
)
from duetime.nservicebus.frontdoor import NSB_EXPIRE, NSB_ROUTE_TO, envelope_headers
from tests.conftest import duetime_cmd, spawn_run, wait_until_serving
from tests.integration.consumer import RecordingConsumer


def prepare(
    db: Path, endpoint: str, *queues: str, mode: TransactionMode = TransactionMode.AT_LEAST_ONCE
) -> SyncSqliteStore:
    """A store and the queues in one file, set up as ``duetime run`` would."""
    store = SyncSqliteStore(db)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, mode)
    q = SyncSqliteQueue(db)
    for name in queues:
        q.declare(name)
    q.close()
    return store


async def test_a_commit_before_the_file_watch_began_is_heard_when_it_begins(tmp_path: Path) -> None:
    """The file watch starts on a thread after the dispatcher subscribes: a message another
    process stores in between was heard by nobody, and a dispatcher that found nothing slept its
    whole `max_sleep` (a minute) with it due (a `duetime run` under load, its first second)."""
    db = tmp_path / "early.db"
    prepare(db, "early").close()
    store = SqliteStore.from_url(f"sqlite:///{db}")
    await store.initialize("early", TransactionMode.AT_LEAST_ONCE)
    heard: list[datetime | None] = []
    unsubscribe = store.subscribe(heard.append)
    due = datetime.now(UTC) + timedelta(hours=1)
    with prepare(db, "early") as other:  # before the watch's task has run: nothing is watching yet
        other.store(DelayedMessage("early", "orders", due))
    try:
        for _ in range(200):
            if heard:
                break
            await asyncio.sleep(0.01)
        assert heard and heard[0] is not None and abs(heard[0] - due) < timedelta(milliseconds=1), heard
    finally:
        unsubscribe()
        await store.close()


@pytest.mark.slow
async def test_a_message_stored_by_another_process_wakes_the_sleeping_dispatcher(tmp_path: Path) -> None:
    db = tmp_path / "wake.db"
    with prepare(db, "wake", "orders") as sender:
        sender.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    store, transport = SqliteStore(SyncSqliteStore(db)), SqliteQueueTransport(db)
    dispatcher = Dispatcher(store, transport, endpoint="wake")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)  # asleep, aiming at the message due in two minutes
    # due a second after the other process stores it (its start-up is slow on a loaded machine)
    script = (
        "import sys; from datetime import UTC, datetime, timedelta; from duetime.backends.sqlite import "
        "SyncSqliteStore; from duetime import DelayedMessage, TransactionMode; s = SyncSqliteStore(sys.argv[1]);"
        "s.initialize('wake', TransactionMode.AT_LEAST_ONCE); due = datetime.now(UTC) + timedelta(seconds=1);"
        "s.store(DelayedMessage('near', 'orders', due)); print(due.isoformat())"
    )
    stored = subprocess.run(
        [duetime_cmd()[0], "-c", script, str(db)], check=True, capture_output=True, text=True
    )
    due = datetime.fromisoformat(stored.stdout.strip())
    consumer = SyncSqliteQueue(db)
    got = await asyncio.to_thread(consumer.receive, "orders", 10, 5.0)
    arrived = datetime.now(UTC)
    dispatcher.stop()
    await task
    assert [m.message_id for m in got] == ["near"]
    consumer.close()
    assert due <= arrived < due + timedelta(milliseconds=500), (
        f"arrived {(arrived - due).total_seconds():.3f}s late"
    )
    await store.close()
    await transport.close()


@pytest.mark.slow
async def test_a_lateness_budget_delivers_what_comes_due_within_it_in_one_round_never_early(
    tmp_path: Path,
) -> None:
    """Forty messages due within 20 ms, a budget of 50 ms: the dispatcher wakes once, the budget
    after the first is due, and one round (or two, on a busy machine) moves them all, exactly-once
    into the file's queue; none leaves before it is due."""
    db = tmp_path / "budget.db"
    store_ = prepare(db, "budget", "orders", mode=TransactionMode.EXACTLY_ONCE)
    first = datetime.now(UTC) + timedelta(seconds=1.5)
    dues = {f"m{i}": first + timedelta(microseconds=500 * i) for i in range(40)}
    store_.store_many([DelayedMessage(i, "orders", due) for i, due in dues.items()])
    store_.close()
    store, transport = SqliteStore(SyncSqliteStore(db)), SqliteQueueTransport(db)
    settings = DelayedDeliverySettings(
        transaction_mode=TransactionMode.EXACTLY_ONCE, lateness_budget=timedelta(milliseconds=50)
    )
    dispatcher = Dispatcher(store, transport, settings, endpoint="budget")
    task = asyncio.create_task(dispatcher.run())
    try:
        while not dispatcher.started or dispatcher.stats.rounds == 0:
            await asyncio.sleep(0.01)
        rounds_before = dispatcher.stats.rounds
        consumer = SyncSqliteQueue(db)
        got: list[str] = []
        while len(got) < len(dues):
            taken = await asyncio.to_thread(consumer.receive, "orders", 100, 5.0)
            assert taken, f"{len(got)} of {len(dues)} arrived"
            arrived = datetime.now(UTC)
            for m in taken:
                assert arrived >= dues[m.message_id], f"{m.message_id} left before it was due"
                got.append(m.message_id)
        consumer.close()
        assert sorted(got) == sorted(dues)
        assert dispatcher.stats.rounds - rounds_before <= 3, dispatcher.stats.rounds - rounds_before
    finally:
        dispatcher.stop()
        await task
        await store.close()
        await transport.close()


@pytest.mark.slow
def test_run_takes_its_lateness_budget_from_the_flag(tmp_path: Path) -> None:
    """`duetime run --lateness-budget 300ms`, as a user types it: a message due while it serves
    moves into the queue the budget after its due time (the default, 1 ms, would move it within a
    few), never before. The queue is only looked at (no writes that could wake the dispatcher)."""
    db = tmp_path / "flag.db"
    prepare(db, "flag", "orders", mode=TransactionMode.EXACTLY_ONCE).close()
    log = tmp_path / "run.log"
    run = spawn_run(
        duetime_cmd("run", "--store", f"sqlite:///{db}", "--endpoint", "flag", "--lateness-budget", "300ms"),
        log,
    )
    try:
        wait_until_serving(log)
        store = SyncSqliteStore(db)
        store.initialize("flag", TransactionMode.EXACTLY_ONCE)
        due = datetime.now(UTC) + timedelta(seconds=1)
        store.store(DelayedMessage("m", "orders", due))
        store.close()
        queue = SyncSqliteQueue(db)
        while not queue.peek("orders", 1):
            assert datetime.now(UTC) < due + timedelta(seconds=10), log.read_text()[-2000:]
            time.sleep(0.005)
        moved = datetime.now(UTC)
        queue.close()
        assert moved - due >= timedelta(milliseconds=290), f"moved {moved - due} after its due time"
    finally:
        run.terminate()
        assert run.wait(timeout=30) == 0, log.read_text()[-3000:]


@pytest.mark.slow
async def test_a_consumer_at_work_in_the_same_file_does_not_wake_the_dispatcher(tmp_path: Path) -> None:
    """Every commit in the file by another connection reaches the dispatcher; a consumer's
    receipts and acknowledgements do not change what is due next, so they must not cost it a
    round (each was one: a write transaction in the consumer's way, measured a third of a core)."""
    db = tmp_path / "busy.db"
    other = prepare(db, "busy", "orders", "other")
    other.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    store, transport = SqliteStore(SyncSqliteStore(db)), SqliteQueueTransport(db)
    dispatcher = Dispatcher(store, transport, endpoint="busy")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    rounds = dispatcher.stats.rounds
    consumer = SyncSqliteQueue(db)
    for i in range(20):
        consumer.send([DelayedMessage(f"w{i}", "other", datetime.now(UTC))])
        consumer.acknowledge(consumer.receive("other", 10, 0.0))
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    idle_rounds = dispatcher.stats.rounds - rounds
    other.store(DelayedMessage("near", "orders", datetime.now(UTC)))  # this one wakes it
    got = await asyncio.to_thread(consumer.receive, "orders", 10, 5.0)
    dispatcher.stop()
    await task
    consumer.close()
    other.close()
    await store.close()
    await transport.close()
    assert idle_rounds == 0, f"{idle_rounds} rounds for 60 commits that stored nothing"
    assert [m.message_id for m in got] == ["near"]


def test_several_dispatcher_processes_share_one_store_without_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "multi.db"
    store = prepare(db, "multi", "orders")
    now = datetime.now(UTC)
    total = 6000
    store.store_many(
        [DelayedMessage(f"m{i}", "orders", now + timedelta(seconds=i / total * 3)) for i in range(total)]
    )
    store.close()
    consumer = RecordingConsumer(db, "orders")
    consumer.start()
    args = [
        "run",
        "--store",
        f"sqlite:///{db}",
        "--endpoint",
        "multi",
        "--batch-size",
        "50",
        "--no-front-door",
    ]
    logs = [tmp_path / f"run{i}.log" for i in range(3)]
    procs = [spawn_run(duetime_cmd(*args), log) for log in logs]
    deadline = time.monotonic() + 60
    while len(consumer.arrivals) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    # on a loaded machine two may deliver everything while the third is still starting, and a
    # stop signal during its start-up ends it with -15 instead of a graceful 0
    for log in logs:
        wait_until_serving(log)
    for p in procs:
        p.terminate()
    for p, log in zip(procs, logs, strict=True):
        assert p.wait(timeout=30) == 0, log.read_text()[-3000:]
    consumer.halt.set()
    consumer.join()
    seen = Counter(consumer.ids())
    assert len(seen) == total
    assert max(seen.values()) == 1  # at-least-once, yet no kill: no duplicate
    assert consumer.early() == []


async def test_front_door_stores_forwards_and_rejects(tmp_path: Path) -> None:
    db = tmp_path / "door.db"
    prepare(db, "shop", "orders").close()
    store, transport = SqliteStore(SyncSqliteStore(db)), SqliteQueueTransport(db)
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE)
    dispatcher = Dispatcher(store, transport, settings, endpoint="shop")
    door = FrontDoor(dispatcher, transport, wait=0.05)
    await dispatcher.start()
    await door.start()
    sender = SyncSqliteQueue(db)
    now = datetime.now(UTC)
    later = now + timedelta(hours=1)
    envelopes = [
        DelayedMessage(
            "due-now", "shop.Timeouts", now, b"1", envelope_headers("orders", now - timedelta(seconds=1))
        ),
        DelayedMessage("later", "shop.Timeouts", now, b"2", envelope_headers("orders", later, {"k": "v"})),
        DelayedMessage(
            "nsb",
            "shop.Timeouts",
            now,
            b"3",
            {NSB_ROUTE_TO: "orders", NSB_EXPIRE: "2031-05-06 07:08:09:123456 Z"},
        ),
        DelayedMessage("no-dest", "shop.Timeouts", now, b"4", {"duetime-deliver-at": now.isoformat()}),
        DelayedMessage(
            "bad-time",
            "shop.Timeouts",
            now,
            b"5",
            {"duetime-route-to": "orders", "duetime-deliver-at": "tomorrow"},
        ),
    ]
    assert sender.send(envelopes) == [None] * 5
    assert sender.send([envelopes[1]]) == [None]  # a redelivery of the same id
    assert await door.process_once() == 6
    assert await door.process_once() == 0
    await dispatcher.run_burst()
    delivered = sender.receive("orders", 10)
    assert [m.message_id for m in delivered] == ["due-now"]
    assert "duetime-route-to" not in delivered[0].headers
    stored = await store.get("later")
    assert stored is not None and stored.due_at == later and stored.headers == {"k": "v"}
    nsb = await store.get("nsb")
    assert nsb is not None and nsb.due_at == datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    rejected = {m.message_id: m.headers["duetime-error-message"] for m in sender.peek("error")}
    assert set(rejected) == {"no-dest", "bad-time"}
    assert "destination header" in rejected["no-dest"] and "cannot be read" in rejected["bad-time"]
    assert sender.depth("shop.Timeouts") == 0
    sender.close()
    await store.close()
    await transport.close()


def test_a_waiting_receiver_sleeps_until_another_process_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asleep on the file's write events, not reading the change counter every 5 ms (which cost
    100 ms of CPU in 3 s), and woken by another process's commit itself: with the look it takes
    anyway now and then pushed past the wait, only the write event can wake it before 20 s. (The
    bound is loose on purpose: a loaded machine once took 0.3 s to run the woken thread.)"""
    monkeypatch.setattr(filewatch, "RECHECK", 60.0)
    db = tmp_path / "sleep.db"
    prepare(db, "idle", "orders").close()
    receiver = SyncSqliteQueue(db)
    receiver.receive("orders", 10, wait=0.1)  # the watch is open from here on
    # this thread's CPU: the process's counted other threads too (a Spark session an earlier
    # test of this worker left, on a loaded machine: 38 ms)
    cpu = time.thread_time()
    assert receiver.receive("orders", 10, wait=3) == []
    assert time.thread_time() - cpu < 0.03
    sender = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from datetime import datetime, UTC; from duetime import DelayedMessage;"
            "from duetime.backends.sqlite import SyncSqliteQueue; q = SyncSqliteQueue(sys.argv[1]);"
            "time.sleep(1.0); q.send([DelayedMessage('late', 'orders', datetime.now(UTC))]); print(time.time())",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    got = receiver.receive("orders", 10, wait=20)
    woke = time.time()
    sent = float(sender.communicate(timeout=30)[0])
    assert [m.message_id for m in got] == ["late"]
    assert woke - sent < 3, f"woke {woke - sent:.3f} s after the commit"
    receiver.close()


def test_the_file_watch_never_wakes_short_and_hears_a_write(tmp_path: Path) -> None:
    """A receiver waiting for a message that shows at a known time sleeps on the watch for that
    long: never less (it would look too early and sleep again), and to the microsecond rather than
    the next whole millisecond (how long past it is the benchmarks' to say, bench/RESULTS.md).
    A write still ends the sleep at once."""
    db = tmp_path / "watched.db"
    prepare(db, "watched", "orders").close()
    watch = filewatch.watch(db)
    assert watch is not None
    for seconds in (0.0004, 0.0021, 0.0107):
        started = time.monotonic()
        assert watch.try_wait(seconds) is False
        assert time.monotonic() - started >= seconds
    writer = SyncSqliteQueue(db)
    writer.send([DelayedMessage("m1", "orders", datetime.now(UTC))])
    started = time.monotonic()
    assert watch.try_wait(30.0) is True
    assert time.monotonic() - started < 10
    writer.close()
    watch.close()


def test_a_receiver_with_nothing_to_take_stays_out_of_the_writers_way(tmp_path: Path) -> None:
    """A receiver looks on every commit to the file (the dispatcher's moves, other queues); it
    takes the write lock only when its queue has something ready, so while another connection
    writes it answers at once instead of queueing behind the writer (and holding up the next)."""
    import sqlite3

    db = tmp_path / "quiet.db"
    prepare(db, "quiet", "orders").close()
    queue = SyncSqliteQueue(db)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    try:
        started = time.monotonic()
        assert queue.receive("orders", 10, 0.0) == []
        assert time.monotonic() - started < 0.5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    queue.send([DelayedMessage("m1", "orders", datetime.now(UTC))])
    assert [m.message_id for m in queue.receive("orders", 10, 0.0)] == ["m1"]
    queue.close()


def test_the_watcher_tells_an_answer_once_until_it_or_this_process_changes(tmp_path: Path) -> None:
    """A consumer's commits to the file change nothing a dispatcher sleeps on: the same earliest
    due time is not told twice. A new earliest is; so is the same one after this process changed
    the store (it may have moved the message that time was, and another stored one just as due)."""
    from duetime.backends._on_a_thread import Subscribers
    from duetime.backends.sqlite.store import _Watcher

    db = tmp_path / "told.db"
    sync = prepare(db, "told", "orders")
    store = SqliteStore(sync)
    told: list[datetime | None] = []
    subscribers = Subscribers()
    subscribers.add(told.append)

    class Loop:  # the watcher hands each answer to the loop's thread; here, at once
        def call_soon_threadsafe(self, callback: object, *args: object) -> None:
            callback(*args)  # type: ignore[operator]

    watcher = _Watcher(store, subscribers, Loop())  # type: ignore[arg-type]
    first = datetime.now(UTC) + timedelta(minutes=5)
    other = SyncSqliteStore(db)  # another process's connection
    other.initialize("told", TransactionMode.AT_LEAST_ONCE)
    other.store(DelayedMessage("a", "orders", first))
    watcher._tell()
    watcher._tell()  # e.g. a consumer's commit: nothing new
    assert told == [first]
    other.store(DelayedMessage("b", "orders", first - timedelta(minutes=1)))
    watcher._tell()
    assert told == [first, first - timedelta(minutes=1)]
    sync.store(DelayedMessage("c", "orders", first + timedelta(minutes=1)))  # this process changed it
    watcher._tell()
    assert told == [first, first - timedelta(minutes=1), first - timedelta(minutes=1)]
    other.close()
    sync.close()
