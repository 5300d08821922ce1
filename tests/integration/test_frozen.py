"""A frozen process (SIGSTOP, a paused VM, a debugger) must not stall the others for long.

SQLite has one write lock per file and no way to take it from a live process: a process frozen
inside a write transaction stalls every writer until it runs again. duetime holds that lock only
for single statements' worth of work (never across a send, a sleep or the network), so a freeze
usually lands outside it; when it lands inside, the others wait, count failures, and carry on the
moment it is released, without losing or doubling anything. PostgreSQL ends a session idle inside
a transaction after the claim time, so a frozen mover's rows come free by themselves.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends._shared_commit import ROUND_LIMIT
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore, SyncPostgresStore
from duetime.backends.postgres.connection import PgOptions
from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore, SyncSqliteQueue, SyncSqliteStore
from tests.services import postgres_schema

pytestmark = pytest.mark.slow
DUETIME = str(Path(sys.executable).parent / "duetime")


async def test_sqlite_writers_carry_on_the_moment_a_frozen_lock_holder_lets_go(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    sync = SyncSqliteStore(db)
    sync.setup_infrastructure("frozen")
    sync.initialize("frozen", TransactionMode.AT_LEAST_ONCE)
    queue = SyncSqliteQueue(db)
    queue.declare("orders")
    now = datetime.now(UTC)
    sync.store_many(
        [DelayedMessage(f"f{i}", "orders", now + timedelta(seconds=i * 0.01)) for i in range(300)]
    )
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE)
    transport = SqliteQueueTransport(db)
    dispatcher = Dispatcher(SqliteStore(sync), transport, settings, endpoint="frozen")
    frozen = sqlite3.connect(db, isolation_level=None)
    frozen.execute("BEGIN IMMEDIATE")  # a peer frozen inside its write transaction
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(4)
    assert queue.depth("orders") == 0  # nobody can write meanwhile: that is SQLite
    released = time.monotonic()
    frozen.execute("COMMIT")
    frozen.close()
    while queue.depth("orders") < 300 and time.monotonic() - released < 10:
        await asyncio.sleep(0.02)
    resumed_in = time.monotonic() - released
    assert queue.depth("orders") == 300
    assert resumed_in < 3, resumed_in
    assert not task.done()  # a 4 s stall is well inside the breakers' 30 s
    dispatcher.stop()
    await task
    await transport.close()
    queue.close()
    sync.close()


def test_sqlite_schedules_wait_for_a_held_write_lock_and_go_in_when_it_is_let_go(tmp_path: Path) -> None:
    """One message, a round (one statement in autocommit) and a bulk load (a transaction) each
    wait for the lock another process holds, without an error, and are all stored after it."""
    db = tmp_path / "w.db"
    sync = SyncSqliteStore(db)
    sync.setup_infrastructure("held")
    sync.initialize("held", TransactionMode.AT_LEAST_ONCE)
    later = datetime.now(UTC) + timedelta(hours=1)
    loads = {
        "one": [DelayedMessage("one", "orders", later)],
        "round": [DelayedMessage(f"round{i}", "orders", later) for i in range(20)],
        "bulk": [DelayedMessage(f"bulk{i}", "orders", later) for i in range(ROUND_LIMIT + 1)],
    }
    for name, messages in loads.items():
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        finished: list[float] = []

        def write(m: list[DelayedMessage] = messages, done: list[float] = finished) -> None:
            sync.store_many(m)
            done.append(time.monotonic())

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.4)
        assert not finished, name  # still waiting for the lock
        let_go = time.monotonic()
        holder.execute("COMMIT")
        holder.close()
        writer.join(10)
        assert finished and finished[0] - let_go < 1.0, name
    assert sync.counts(datetime.now(UTC)).total == 1 + 20 + ROUND_LIMIT + 1
    sync.close()


def test_a_sqlite_round_too_big_for_one_statement_goes_in_a_transaction(tmp_path: Path) -> None:
    """SQLite before 3.32 allows 999 parameters a statement: a round of 500 (3,500) still goes in."""
    sync = SyncSqliteStore(tmp_path / "v.db")
    sync.setup_infrastructure("old")
    sync.initialize("old", TransactionMode.AT_LEAST_ONCE)
    sync._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    later = datetime.now(UTC) + timedelta(hours=1)
    sync.store_many([DelayedMessage(f"v{i}", "orders", later) for i in range(500)])
    sync.store_many([DelayedMessage(f"w{i}", "orders", later) for i in range(100)])  # 700 fit
    assert sync.counts(datetime.now(UTC)).total == 600
    sync.close()


def test_sqlite_sigstop_of_one_dispatcher_loses_and_doubles_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    sync = SyncSqliteStore(db)
    sync.setup_infrastructure("duetime")
    sync.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    queue = SyncSqliteQueue(db)
    queue.declare("orders")
    total = 3000
    now = datetime.now(UTC)
    sync.store_many(
        [
            DelayedMessage(f"s{i:05d}", "orders", now + timedelta(seconds=2 + i / total * 8))
            for i in range(total)
        ]
    )
    procs = [
        subprocess.Popen(
            [DUETIME, "run", "--store", url, "--mode", "exactly-once", "--no-front-door"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    got: list[str] = []

    def consume(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while len(got) < total and time.monotonic() < deadline:
            items = queue.receive("orders", 1000, 0.2)  # waits, like everyone, if the lock is frozen
            got.extend(m.message_id for m in items)
            queue.acknowledge(items)

    try:
        for proc in procs:  # running, its signal handlers set, before it is frozen or stopped
            assert proc.stderr is not None
            line = "-"
            while line and "dispatching" not in line:
                line = proc.stderr.readline()
            assert line, "the dispatcher exited before it started"
        time.sleep(max(0.0, 4 - (datetime.now(UTC) - now).total_seconds()))
        os.kill(procs[0].pid, signal.SIGSTOP)
        # The freeze ends on a timer: a consumer (or anyone) may be waiting for the lock meanwhile.
        thaw = threading.Timer(6, os.kill, (procs[0].pid, signal.SIGCONT))
        thaw.start()
        consume(6)
        thaw.join()
        consume(40)
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
        errors = [proc.communicate(timeout=30)[1] for proc in procs]
        queue.close()
        sync.close()
    counts = Counter(got)
    assert len(counts) == total, f"{total - len(counts)} lost"
    assert max(counts.values()) == 1  # exactly-once: never doubled
    assert all(proc.returncode == 0 for proc in procs), ([p.returncode for p in procs], errors)
    assert not any("Traceback" in text for text in errors)


async def test_postgres_ends_a_frozen_transaction_and_frees_its_rows() -> None:
    with postgres_schema() as pg:
        url = pg + "&claim_timeout=2"
        direct = SyncPostgresStore.from_url(url)
        direct.setup_infrastructure("frozen")
        direct.initialize("frozen", TransactionMode.AT_LEAST_ONCE)
        now = datetime.now(UTC)
        direct.store_many([DelayedMessage(f"p{i}", "orders", now) for i in range(10)])
        transport = PostgresQueueTransport.from_url(url)
        await transport.start()
        await transport.declare("orders")
        # A mover frozen mid-transaction: it holds five rows' locks and sends nothing more.
        frozen = psycopg.connect(PgOptions.from_url(url).conninfo)
        schema = pg.rsplit("schema=", 1)[1]
        frozen.execute(
            f'SELECT message_id FROM "{schema}"."frozen.delayed" ORDER BY message_id LIMIT 5 FOR UPDATE'
        )
        settings = DelayedDeliverySettings(
            transaction_mode=TransactionMode.EXACTLY_ONCE, max_sleep=timedelta(seconds=0.5)
        )
        dispatcher = Dispatcher(PostgresStore.from_url(url), transport, settings, endpoint="frozen")
        task = asyncio.create_task(dispatcher.run())
        got: list[str] = []
        started = time.monotonic()
        while len(got) < 10 and time.monotonic() - started < 20:
            items = await transport.receive("orders", 100, 0.2)
            got += [m.message_id for m in items]
            await transport.acknowledge(items)
        took = time.monotonic() - started
        dispatcher.stop()
        await task
        assert sorted(got) == sorted(f"p{i}" for i in range(10))
        assert 1.5 < took < 10, took  # the five locked rows came free after the 2 s claim time
        with pytest.raises(psycopg.Error, match="idle-in-transaction"):
            frozen.execute("SELECT 1")  # the server ended the frozen session
        frozen.close()
        await transport.close()
        direct.close()
