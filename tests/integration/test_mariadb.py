"""MariaDB for real: two dispatcher processes share one store (SKIP LOCKED claims), and the
next-due poller that stands in for LISTEN/NOTIFY wakes a sleeping dispatcher."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.mysql import MysqlStore, SyncMysqlStore
from duetime.backends.sqlite import SqliteQueueTransport, SyncSqliteQueue
from duetime.clock import to_micros
from tests.conftest import duetime_cmd
from tests.integration.consumer import RecordingConsumer
from tests.services import mariadb_database


@pytest.fixture
def maria() -> Iterator[str]:
    with mariadb_database() as url:
        yield url


def prepare(url: str, endpoint: str) -> SyncMysqlStore:
    store = SyncMysqlStore.from_url(url)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    return store


def test_setting_up_a_store_set_up_already_waits_for_no_transaction(maria: str) -> None:
    """As on PostgreSQL (whose ``CREATE INDEX IF NOT EXISTS`` once stalled every writer at each
    dispatcher's restart): the set-up a dispatcher runs at its start, beside a transaction that is
    writing to the table, goes through at once (``CREATE TABLE IF NOT EXISTS`` of a table that
    exists takes no lock writers hold)."""
    from urllib.parse import urlsplit

    import pymysql

    prepare(maria, "shop").close()
    parts = urlsplit(maria)
    writer = pymysql.connect(
        host=parts.hostname, port=parts.port or 3306, user=parts.username, password=parts.password or "",
        database=parts.path.lstrip("/"), autocommit=False,
    )  # fmt: skip
    try:
        writer.cursor().execute("DELETE FROM `shop.delayed`")  # a transaction in flight, as a dispatcher's
        started = time.monotonic()
        prepare(maria, "shop").close()
        took = time.monotonic() - started
    finally:
        writer.rollback()
        writer.close()
    assert took < 2.0, took


@pytest.mark.slow
def test_two_dispatcher_processes_share_a_mariadb_store(maria: str, tmp_path: Path) -> None:
    store = prepare(maria, "multi")
    queue_file = tmp_path / "q.db"
    q = SyncSqliteQueue(queue_file)
    q.declare("orders")
    q.close()
    now = datetime.now(UTC)
    total = 5000
    store.store_many(
        [DelayedMessage(f"m{i}", "orders", now + timedelta(seconds=i / total * 2)) for i in range(total)]
    )
    consumer = RecordingConsumer(queue_file, "orders")
    consumer.start()
    args = duetime_cmd(
        "run",
        "--store",
        maria,
        "--transport",
        f"sqlite:///{queue_file}",
        "--endpoint",
        "multi",
        "--no-front-door",
    )
    procs = [
        subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    deadline = time.monotonic() + 60
    while len(consumer.arrivals) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    for p in procs:
        p.terminate()
    for p in procs:
        assert p.wait(timeout=30) == 0, p.stderr.read() if p.stderr else ""
    consumer.halt.set()
    consumer.join()
    seen = Counter(consumer.ids())
    assert len(seen) == total and max(seen.values()) == 1
    assert consumer.early() == []
    store.close()


@pytest.mark.slow
async def test_poller_wakes_the_dispatcher_for_a_message_from_another_process(
    maria: str, tmp_path: Path
) -> None:
    other = prepare(maria, "wake")
    other.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    queue_file = tmp_path / "q.db"
    consumer = SyncSqliteQueue(queue_file)
    consumer.declare("orders")
    store, transport = MysqlStore.from_url(maria), SqliteQueueTransport(queue_file)
    dispatcher = Dispatcher(store, transport, endpoint="wake")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    due = datetime.now(UTC) + timedelta(seconds=1)
    await asyncio.to_thread(other.store, DelayedMessage("near", "orders", due))
    got = await asyncio.to_thread(consumer.receive, "orders", 10, 5.0)
    arrived = datetime.now(UTC)
    dispatcher.stop()
    await task
    assert [m.message_id for m in got] == ["near"]
    assert due <= arrived < due + timedelta(milliseconds=600)  # poll interval 0.25 s
    await store.close()
    await transport.close()
    other.close()
    consumer.close()


def test_a_claim_in_progress_locks_only_its_own_rows(maria: str) -> None:
    """A backlog where every row is due is where MariaDB's optimizer would rather scan the
    table and sort: ``FOR UPDATE`` then locked every due row, not the batch's few, and every
    other dispatcher's claim skipped them all and came back empty (dispatchers took turns; the
    contract's four-claimer test caught it once in CI). With one claim held open in its
    transaction, a second claimer must still get a full batch of the rest."""
    store = prepare(maria, "backlog")
    now = datetime.now(UTC)
    store.store_many([DelayedMessage(f"m{i:03d}", "orders", now - timedelta(seconds=1)) for i in range(400)])
    holder = SyncMysqlStore.from_url(maria)
    holder.initialize("backlog", TransactionMode.AT_LEAST_ONCE)
    at = to_micros(now)

    def hold(cur: Any) -> list[Any]:
        cur.connection.begin()
        cur.execute(holder.q["select_due_for_claim"], (at, at, 7))
        held = list(cur.fetchall())
        try:
            other = [m.message_id for m in store.fetch_due(now, 7)]
        finally:
            cur.connection.rollback()
        return [[r[0] for r in held], other]

    held, other = holder._run(hold)
    assert held == [f"m{i:03d}" for i in range(7)]
    assert other == [f"m{i:03d}" for i in range(7, 14)]
    holder.close()
    store.close()


def test_a_body_over_max_allowed_packet_fails_alone_in_one_line(tmp_path: Path) -> None:
    """It was "internal error ... this is a duetime bug" on the command line, and from Python it
    also failed the other schedules sharing its commit round."""
    import threading

    from duetime import InvalidMessage, open_sync_store
    from tests.conftest import run_cli
    from tests.services import mariadb_database

    with mariadb_database() as url:
        assert run_cli("setup", "--store", url).returncode == 0
        big = tmp_path / "big.bin"
        big.write_bytes(
            b"\x00'" * (9 * 512 * 1024)
        )  # 9 MiB (under duetime's 16), 18 escaped; the server allows 16
        done = run_cli("schedule", "orders", "--body-file", str(big), "--in", "1h", "--store", url)
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "max_allowed_packet of 16,777,216" in line and "internal error" not in line, line
        assert "needs about" in line

        store = open_sync_store(url)
        store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        try:
            outcomes: dict[str, BaseException | None] = {}
            small = [
                DelayedMessage.create("orders", f"m{i}".encode(), delay=timedelta(hours=1)) for i in range(20)
            ]
            huge = DelayedMessage.create(
                "orders", b"y" * (9 * 1024 * 1024), delay=timedelta(hours=1)
            )  # counted twice

            def one(m: DelayedMessage) -> None:
                try:
                    store.store(m)
                    outcomes[m.message_id] = None
                except BaseException as error:
                    outcomes[m.message_id] = error

            threads = [threading.Thread(target=one, args=(m,)) for m in [*small[:10], huge, *small[10:]]]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert isinstance(outcomes[huge.message_id], InvalidMessage)
            assert "max_allowed_packet" in str(outcomes[huge.message_id])
            assert all(outcomes[m.message_id] is None for m in small), outcomes
            assert all(store.get(m.message_id) is not None for m in small)
            fits = DelayedMessage.create("orders", b"z" * (7 * 1024 * 1024), delay=timedelta(hours=1))
            store.store(fits)  # 7 MB, counted twice, fits in 16
            assert store.get(fits.message_id).body == fits.body  # type: ignore[union-attr]
        finally:
            store.close()


def test_check_with_only_a_mariadb_store_checks_the_store(maria: str, tmp_path: Path) -> None:
    """`duetime check --store mysql://…` refused ("Give --transport") before checking anything, so
    it could not be a store-only probe: a MariaDB store has no queue tables of its own."""
    from tests.conftest import run_cli

    assert run_cli("setup", "--store", maria, "--transport", "memory://", cwd=tmp_path).returncode == 0
    done = run_cli("check", "--store", maria, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: store ") and "no transport given" in done.stdout, done.stdout
    down = run_cli("check", "--store", maria.replace("/duetime_t", "/no_such_db_"), cwd=tmp_path)
    assert down.returncode == 1 and down.stderr.startswith("not ok: store"), down.stderr
