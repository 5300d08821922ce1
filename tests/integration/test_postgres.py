"""PostgreSQL for real: exactly-once into its queue table, kill -9, several dispatcher processes,
LISTEN/NOTIFY wake-ups across processes."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import (
    ConfigurationError,
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    MessageInFlight,
    TransactionMode,
)
from duetime.backends.postgres import (
    PostgresQueueTransport,
    PostgresStore,
    SyncPostgresQueue,
    SyncPostgresStore,
)
from duetime.clock import SystemClock
from tests.conftest import duetime_cmd, spawn_run, wait_until_serving
from tests.integration.consumer import RecordingConsumer
from tests.services import with_option


def prepare(url: str, endpoint: str, *queues: str) -> SyncPostgresStore:
    store = SyncPostgresStore.from_url(url)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    q = SyncPostgresQueue.from_url(url)
    for name in queues:
        q.declare(name)
    q.close()
    return store


def test_setting_up_a_store_set_up_already_locks_none_of_its_tables(pg: str) -> None:
    """A dispatcher sets up at every start (``duetime run --setup``), beside others delivering. A
    ``CREATE INDEX IF NOT EXISTS`` locks the table before it finds the index: it waited here for
    the open transaction below, and everyone writing to the table waited behind it (a restart in a
    soak run: lateness p99 1.6 s, and autovacuum cancelled). Set up already, nothing is locked."""
    import psycopg

    from tests.services import POSTGRES

    prepare(pg, "shop", "orders").close()
    schema = pg.split("schema=", 1)[1]
    with psycopg.connect(POSTGRES) as writer:  # a transaction in flight, as a dispatcher's
        writer.execute(f'DELETE FROM "{schema}"."shop.delayed"')
        writer.execute(f'DELETE FROM "{schema}".duetime_queue_messages')
        started = time.monotonic()
        again = SyncPostgresStore.from_url(pg + "&pool_timeout=3")
        again.setup_infrastructure("shop")
        SyncPostgresQueue.from_url(pg).close()
        took = time.monotonic() - started
        again.close()
        writer.rollback()
    assert took < 2.0, took


async def test_exactly_once_burst_moves_and_dead_letters(pg: str) -> None:
    prepare(pg, "shop", "orders").close()
    store, transport = PostgresStore.from_url(pg), PostgresQueueTransport.from_url(pg)
    now = datetime.now(UTC)
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE)
    dispatcher = Dispatcher(store, transport, settings, endpoint="shop")
    await dispatcher.start()
    await store.store_many(
        [
            DelayedMessage(f"m{i}", "orders", now - timedelta(seconds=1), b"x", {"i": str(i)})
            for i in range(250)
        ]
        + [
            DelayedMessage("lost", "nowhere", now),
            DelayedMessage("later", "orders", now + timedelta(hours=1)),
        ]
    )
    stats = await dispatcher.run_burst()
    assert (stats.forwarded, stats.dead_lettered) == (250, 1)
    got = await transport.receive("orders", 1000, 0)
    assert len(got) == 250 and got[0].headers["i"] == "0"
    assert got[0].headers["duetime-due-at"] == (now - timedelta(seconds=1)).isoformat()
    [dead] = await transport.peek("error", 10)
    assert dead.message_id == "lost" and dead.headers["duetime-error-original-destination"] == "nowhere"
    assert await store.get("later") is not None
    await store.close()
    await transport.close()


async def test_exactly_once_is_refused_across_databases_or_schemas(pg: str) -> None:
    from duetime import UnsupportedTransactionMode
    from tests.services import POSTGRES, with_option

    prepare(pg, "shop").close()
    store = PostgresStore.from_url(pg)
    other = PostgresQueueTransport.from_url(with_option(POSTGRES, schema="elsewhere"))
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE)
    with pytest.raises(UnsupportedTransactionMode):
        await Dispatcher(store, other, settings, endpoint="shop").start()
    await store.close()


@pytest.mark.slow
async def test_notify_from_another_process_wakes_the_sleeping_dispatcher(pg: str) -> None:
    prepare(pg, "wake", "orders").store(
        DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2))
    )
    store, transport = PostgresStore.from_url(pg), PostgresQueueTransport.from_url(pg)
    dispatcher = Dispatcher(store, transport, endpoint="wake")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    # due a second after the other process stores it (its start-up is slow on a loaded machine)
    script = (
        "import sys; from datetime import UTC, datetime, timedelta; from duetime.backends.postgres import "
        "SyncPostgresStore; from duetime import DelayedMessage, TransactionMode; "
        "s = SyncPostgresStore.from_url(sys.argv[1]); s.initialize('wake', TransactionMode.AT_LEAST_ONCE); "
        "due = datetime.now(UTC) + timedelta(seconds=1); s.store(DelayedMessage('near', 'orders', due)); "
        "s.close(); print(due.isoformat())"
    )
    stored = subprocess.run([duetime_cmd()[0], "-c", script, pg], check=True, capture_output=True, text=True)
    due = datetime.fromisoformat(stored.stdout.strip())
    got = await transport.receive("orders", 10, 5.0)
    arrived = datetime.now(UTC)
    dispatcher.stop()
    await task
    assert [m.message_id for m in got] == ["near"]
    assert due <= arrived < due + timedelta(milliseconds=500), f"{(arrived - due).total_seconds():.3f} s late"
    await store.close()
    await transport.close()


async def test_a_round_of_several_messages_wakes_the_sleeping_dispatcher(pg: str) -> None:
    """A shared commit's round goes in one statement whose NOTIFY carries the earliest due time."""
    sync = prepare(pg, "round", "orders")
    sync.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    store, transport = PostgresStore.from_url(pg), PostgresQueueTransport.from_url(pg)
    dispatcher = Dispatcher(store, transport, endpoint="round")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    due = datetime.now(UTC) + timedelta(seconds=0.5)
    sync.store_many([DelayedMessage(f"near{i}", "orders", due + timedelta(minutes=i)) for i in range(3)])
    got = await transport.receive("orders", 10, 5.0)
    arrived = datetime.now(UTC)
    dispatcher.stop()
    await task
    assert [m.message_id for m in got] == ["near0"]
    assert due <= arrived < due + timedelta(milliseconds=400), f"{(arrived - due).total_seconds():.3f} s late"
    sync.close()
    await store.close()
    await transport.close()


#: The claim time of the kill tests. Claims are row locks, which a kill frees at once; the claim
#: time only bounds how long a live dispatcher may take to send a batch before its unsent rest is
#: freed for another to send too. With 1 s a loaded machine (the whole suite, its disk busy) took
#: longer than half of it for a batch of 100 now and then: 800 sent twice after 4 kills.
KILL_CLAIM_SECONDS = 10


def run_with_kills(
    url: str,
    endpoint: str,
    mode: TransactionMode,
    total: int,
    processes: int,
    kills: int,
    batch: int,
    rng: random.Random,
) -> tuple[Counter[str], list[str], int]:
    """Dispatcher processes deliver ``total`` messages while some are killed with SIGKILL and
    restarted; returns arrivals, early arrivals and the number of kills made."""
    consumer = RecordingConsumer(lambda: SyncPostgresQueue.from_url(url), "orders")
    consumer.start()
    args = duetime_cmd(
        "run",
        "--store",
        url,
        "--endpoint",
        endpoint,
        "--mode",
        mode.value,
        "--batch-size",
        str(batch),
        "--no-front-door",
    )
    folder = Path(tempfile.mkdtemp(prefix="duetime-kills-"))
    logs = [folder / f"run-{i}.log" for i in range(processes)]
    procs = [spawn_run(args, log) for log in logs]
    made = 0
    deadline = time.monotonic() + 120
    try:
        while made < kills and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 1.0))
            victim = rng.randrange(processes)
            procs[victim].kill()
            procs[victim].wait()
            made += 1
            logs[victim] = folder / f"run-{processes + made}.log"
            procs[victim] = spawn_run(args, logs[victim])
        while len(set(consumer.ids())) < total and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # what a lapsed claim would send again comes by now
    finally:
        for p, log in zip(procs, logs, strict=True):
            if p.poll() is None:
                wait_until_serving(log)  # a stop signal during start-up is not a graceful stop
            p.terminate()
        codes = [p.wait(timeout=30) for p in procs]
        consumer.halt.set()
        consumer.join()
        # a batch still being sent past half the claim time is freed (and may go twice): say so
        stale = sum(log.read_text().count("may be sent twice") for log in folder.glob("*.log"))
        print(f"{made} kills, {stale} batches freed by their age")
        shutil.rmtree(folder, ignore_errors=True)
    assert codes == [0] * processes, "graceful stop must exit 0"
    return Counter(consumer.ids()), consumer.early(), made


@pytest.mark.slow
@pytest.mark.parametrize("mode", [TransactionMode.EXACTLY_ONCE, TransactionMode.AT_LEAST_ONCE])
def test_sigkill_loses_nothing_on_postgres(pg: str, mode: TransactionMode) -> None:
    url = pg + f"&claim_timeout={KILL_CLAIM_SECONDS}"
    store = prepare(url, "crash", "orders")
    start = datetime.now(UTC)
    rng = random.Random(7)
    store.store_many(
        [
            DelayedMessage(f"c{i:05d}", "orders", start + timedelta(seconds=rng.uniform(-1, 4)))
            for i in range(10_000)
        ]
    )
    seen, early, kills = run_with_kills(url, "crash", mode, 10_000, 1, 10, 100, rng)
    assert len(seen) == 10_000 and early == []
    duplicates = sum(n - 1 for n in seen.values())
    assert duplicates == 0 if mode is TransactionMode.EXACTLY_ONCE else duplicates <= 100 * kills
    assert store.counts(datetime.now(UTC)).total == 0
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "kills"), [(TransactionMode.EXACTLY_ONCE, 4), (TransactionMode.AT_LEAST_ONCE, 4)]
)
def test_four_dispatcher_processes_deliver_100000(pg: str, mode: TransactionMode, kills: int) -> None:
    url = pg + f"&claim_timeout={KILL_CLAIM_SECONDS}"
    store = prepare(url, "multi", "orders")
    start = datetime.now(UTC)
    total = 100_000
    for first in range(0, total, 20_000):
        store.store_many(
            [
                DelayedMessage(f"m{i:06d}", "orders", start + timedelta(seconds=i / total * 8))
                for i in range(first, first + 20_000)
            ]
        )
    seen, early, made = run_with_kills(url, "multi", mode, total, 4, kills, 100, random.Random(11))
    duplicates = sum(n - 1 for n in seen.values())
    print(f"{mode.value}: {duplicates} sent twice")
    assert len(seen) == total, f"{total - len(seen)} lost"
    assert early == []
    if mode is TransactionMode.EXACTLY_ONCE:
        assert duplicates == 0
    else:
        assert duplicates <= 100 * made  # never more than one batch per kill
    store.close()


HOLD_AND_WAIT = """
import sys, time
from datetime import UTC, datetime
from duetime import TransactionMode
from duetime.backends.postgres import SyncPostgresStore
store = SyncPostgresStore.from_url(sys.argv[1])
store.initialize("held", TransactionMode.AT_LEAST_ONCE)
print(len(store.fetch_due(datetime.now(UTC), 10)), flush=True)
time.sleep(600)
"""


def test_a_killed_lock_claimer_frees_its_batch_at_once(pg: str) -> None:
    """Lock claims (the default) with a 30 s claim time: the batch of a claimer killed with -9 is
    claimable by another at once, not after 30 s (a lease would wait them out)."""
    import sys

    store = prepare(pg, "held")
    store.store_many([DelayedMessage(f"h{i}", "orders", datetime.now(UTC)) for i in range(5)])
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, pg], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "5"
        assert store.fetch_due(datetime.now(UTC), 10) == []  # held by the live claimer
        with pytest.raises(MessageInFlight):
            store.cancel("h0")  # a locked row is in flight: refused, not waited for
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 5
        claimed: list[DelayedMessage] = []
        while not claimed and time.monotonic() < deadline:
            claimed = store.fetch_due(datetime.now(UTC), 10)
        assert sorted(m.message_id for m in claimed) == [f"h{i}" for i in range(5)]
    finally:
        holder.kill()
        store.close()


def test_a_batch_held_past_half_its_claim_time_is_freed_and_the_log_says_so(
    pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A live dispatcher still sending a batch at half the claim time commits what it settled and
    frees the rest (before the server's idle limit could end the session and undo the deletes):
    another may send those too, so the log says so and what to raise."""
    # 4 s: freed at 2 s, while the server would end the idle session (and undo a0's removal) at 4
    store = prepare(pg + "&claim_timeout=4", "aged")
    other = SyncPostgresStore.from_url(pg)
    other.initialize("aged", TransactionMode.AT_LEAST_ONCE)
    store.store_many([DelayedMessage(f"a{i}", "orders", datetime.now(UTC)) for i in range(3)])
    try:
        claimed = store.fetch_due(datetime.now(UTC), 10)
        assert len(claimed) == 3
        store.remove(claimed[0].message_id)  # settled: its removal is kept
        assert other.fetch_due(datetime.now(UTC), 10) == []  # held
        time.sleep(2.1)
        with caplog.at_level("WARNING", logger="duetime.postgres"):
            again = store.fetch_due(datetime.now(UTC), 10)  # frees the aged batch, then claims
        assert sorted(m.message_id for m in again) == ["a1", "a2"]  # a0's removal was kept
        assert "its 2 unsettled messages are free to claim again and may be sent twice" in caplog.text
        assert "raise claim_timeout (now 4 s)" in caplog.text
    finally:
        store.close()
        other.close()


def test_a_held_batch_ends_without_waiting_for_a_disk_flush_and_frees_its_connection(pg: str) -> None:
    """At-least-once: losing the removal of a delivered batch to a server crash only sends it
    again, which at-least-once allows, so the claim's transaction commits without waiting for the
    flush (the send, in the destination's own transaction, still waits). Its claim never sorts
    (0.47 against 0.89 ms a batch of 100 on a table whose statistics lag). The settings are the
    transaction's own: the connection goes back to the pool as it was."""
    store = prepare(pg, "flush")
    try:
        store.store_many([DelayedMessage(f"f{i}", "orders", datetime.now(UTC)) for i in range(3)])
        claimed = store.fetch_due(datetime.now(UTC), 10)
        assert len(claimed) == 3
        held, rest = store._held.split([m.message_id for m in claimed])
        assert not rest and len(held) == 1
        (batch, _), *_ = held.values()
        assert batch.conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        # the claim walks the due index in its order, whatever the statistics say: no sort
        assert batch.conn.execute("SHOW enable_sort").fetchone() == ("off",)
        plan = "\n".join(
            r[0]
            for r in batch.conn.execute(
                "EXPLAIN " + store.names.q["lock_due"], {"at": datetime.now(UTC), "limit": 100, "ours": []}
            )
        )
        # nor is a plan costed past JIT's threshold (a sort the planner could not avoid is)
        assert "Index Scan" in plan and "Sort" not in plan and "JIT" not in plan, plan
        assert batch.conn.execute("SHOW jit").fetchone() == ("off",)
        store.remove_many(["f0"])  # one settled: the transaction stays open
        assert batch.conn.info.transaction_status == 2  # INTRANS
        store.increment_failure_count("f1")  # settled too: its row stays, counted
        store.remove_many(["f2"])  # the last: the delete and the commit go together
        assert batch.conn.info.transaction_status == 0  # IDLE, back in the pool
        assert batch.conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert batch.conn.execute("SHOW enable_sort").fetchone() == ("on",)
        assert batch.conn.execute("SHOW jit").fetchone() != ("off",)
        left = store.fetch_due(datetime.now(UTC), 10)
        assert [(m.message_id, m.failure_count) for m in left] == [("f1", 1)]
        store.release(["f1"])
    finally:
        store.close()


def test_a_pool_too_small_for_held_batches_claims_with_leases(pg: str) -> None:
    """pool_size=2 cannot hold a batch open and still serve the next call: leases instead, which
    another process sees as claimed."""
    small = SyncPostgresStore.from_url(pg + "&pool_size=2")
    assert not small.holds_locks
    small.setup_infrastructure("small")
    small.initialize("small", TransactionMode.AT_LEAST_ONCE)
    small.store(DelayedMessage("s1", "orders", datetime.now(UTC)))
    assert [m.message_id for m in small.fetch_due(datetime.now(UTC), 10)] == ["s1"]
    other = SyncPostgresStore.from_url(pg)
    other.initialize("small", TransactionMode.AT_LEAST_ONCE)
    assert other.counts(datetime.now(UTC)).claimed == 1  # a lease: visible to every process
    other.close()
    small.close()


def test_an_unknown_claims_option_is_one_clear_error(pg: str) -> None:
    with pytest.raises(ConfigurationError, match=r"claims=lock .* or claims=lease"):
        SyncPostgresStore.from_url(pg + "&claims=sometimes")
    result = subprocess.run(
        duetime_cmd("stats", "--store", pg + "&claims=sometimes"), capture_output=True, text=True
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "claims=lock" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_batch_is_acknowledged_in_one_statement_and_an_expired_receipt_deletes_nothing(pg: str) -> None:
    from duetime.backends.postgres.connection import PgOptions
    from duetime.backends.postgres.queue import SyncPostgresQueue

    with SyncPostgresQueue(PgOptions.from_url(pg), visibility_timeout=timedelta(seconds=0.3)) as queue:
        queue.declare("acks")
        due = datetime(2030, 1, 1, tzinfo=UTC)
        queue.send([DelayedMessage(f"a{i}", "acks", due, b"x") for i in range(300)])
        first = queue.receive("acks", 300, 1.0)
        assert len(first) == 300
        time.sleep(0.4)  # their receipts expire: the rows are handed out again
        again = queue.receive("acks", 300, 1.0)
        assert len(again) == 300 and {m.delivery_count for m in again} == {2}
        assert queue.acknowledge(first) == 0  # too late: the second consumer holds them now
        assert queue.acknowledge(again) == 300
        assert queue.acknowledge([]) == 0
        assert queue.depth("acks") == 0


def _plan(store: SyncPostgresStore, sql: str) -> str:
    with store.pool.connection() as conn:
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql.format(t=store.names.qualified)))


def test_a_table_filled_in_one_go_is_planned_with_its_due_index_at_once(pg: str) -> None:
    """Before autovacuum has looked, PostgreSQL takes a table filled in one go for empty, and asked
    for the next due time it would scan and sort every row (11 ms instead of 1 ms at 10,000 rows,
    measured, on every turn of the dispatcher). A big store_many refreshes the statistics itself."""
    store = prepare(pg, "load")
    try:
        next_due = "SELECT due_at FROM {t} WHERE claim_token IS NULL ORDER BY due_at, message_id LIMIT 1"
        store.store(DelayedMessage("first", "orders", datetime.now(UTC) + timedelta(hours=1)))
        small = _plan(store, next_due)
        later = datetime.now(UTC) + timedelta(hours=2)
        store.store_many(
            [DelayedMessage(f"m{i}", "orders", later + timedelta(seconds=i)) for i in range(5_000)]
        )
        big = _plan(store, next_due)
        assert "Seq Scan" in small  # what a fresh table gets (the premise)
        assert "Index Scan" in big and "Sort" not in big, big
        assert store.next_due() is not None
    finally:
        store.close()


def test_a_queue_is_read_down_its_ready_index_whatever_the_statistics_say(pg: str) -> None:
    """A queue table's statistics lag behind its traffic (a fresh table, a new queue name): the
    planner then expects a handful of rows and would read and sort every waiting row to hand out
    the oldest (54 ms a receive at 50,000 waiting, measured). The queue's connections never sort."""
    from duetime.backends.postgres.connection import planner_rows

    now = datetime.now(UTC)
    with SyncPostgresQueue.from_url(pg) as queue:
        queue.declare("orders")
        for start in range(0, 3_000, 100):
            queue.send([DelayedMessage(f"m{start + i}", "orders", now) for i in range(100)])
        params = queue._receive_params("orders", 500)
        with queue.pool.connection() as conn:
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + queue.names.q["receive"], params))
            conn.execute("SET enable_sort = on")
            premise = "\n".join(r[0] for r in conn.execute("EXPLAIN " + queue.names.q["receive"], params))
            conn.execute("SET enable_sort = off")
            known = planner_rows(conn, f"{queue.names.quoted_schema}.duetime_queue_messages")
        if known is not None and known < 1_000:  # autovacuum has not looked yet: the premise
            assert "Sort" in premise, premise
        assert "Index Scan using duetime_queue_messages_ready" in plan and "Sort" not in plan, plan
        first = queue.receive("orders", 500)
        assert [m.message_id for m in first] == [f"m{i}" for i in range(500)]
        assert queue.acknowledge(first) == 500


def test_the_next_due_time_locks_nothing_while_the_earliest_message_is_not_due(pg: str) -> None:
    """Asking whether the earliest row is held by another dispatcher takes a row lock, and a row
    lock costs a WAL flush; claims take due rows only, so a row not due yet is never asked about.
    A row lock leaves its transaction in the row's xmax: none there after the question."""
    import psycopg

    store = prepare(pg, "quiet")
    try:
        later = datetime.now(UTC) + timedelta(hours=1)
        store.store(DelayedMessage("later", "orders", later))
        assert store.next_due() == later
        with psycopg.connect(store.options.conninfo) as other:
            xmax = other.execute(f"SELECT xmax::text FROM {store.names.qualified}").fetchone()
            assert xmax == ("0",), f"next_due locked the row (xmax {xmax})"
            other.execute(f"SELECT 1 FROM {store.names.qualified} FOR UPDATE")  # held elsewhere:
            assert store.next_due() == later  # reported all the same (not due, so not held)
        due = DelayedMessage("due", "orders", datetime.now(UTC) - timedelta(seconds=1))
        store.store(due)
        with psycopg.connect(store.options.conninfo) as other:  # a due row held elsewhere: looked
            other.execute(f"SELECT 1 FROM {store.names.qualified} WHERE message_id = 'due' FOR UPDATE")
            asked = datetime.now(UTC)
            found = store.next_due()
            assert found is not None and asked < found <= later  # again shortly, not at once
    finally:
        store.close()


def test_behind_a_pooler_nothing_is_pipelined_and_a_queue_still_reads_in_index_order(
    pg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving psycopg's pipeline, a flush request may follow the final sync; a pooler in
    transaction mode has given the server connection back by then, and the flush takes it again
    for a client that says nothing more (PgBouncer 1.18: every other client waits). So behind a
    pooler nothing enters a pipeline: the queue's questions go as one simple-protocol message
    with their setting, and a lock claim's last statement and its commit go one after the other.
    Every byte arrives as it was sent, in order, each message once."""
    import psycopg

    url = with_option(pg, pooler="transaction", claims="lock", pool_size="4")
    store = prepare(url, "pooled", "orders")

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a pipeline on a connection a pooler shares")

    monkeypatch.setattr(psycopg.Connection, "pipeline", refused)
    bodies = [bytes([i]) + b"\x00\xff'\\%s" + bytes(range(256)) for i in range(20)]
    try:
        assert store.holds_locks
        now = datetime.now(UTC)
        store.store_many([DelayedMessage(f"p{i}", "orders", now, body=b) for i, b in enumerate(bodies)])
        claimed = store.fetch_due(datetime.now(UTC), 10)
        assert len(claimed) == 10 and store._held.open_batches() == 1
        store.remove_many([m.message_id for m in claimed])  # the last settles: delete, then commit
        assert store._held.open_batches() == 0
        with SyncPostgresQueue.from_url(url) as queue:
            assert (
                queue.send([DelayedMessage(f"q{i}", "orders", now, body=b) for i, b in enumerate(bodies)])
                == [None] * 20
            )
            assert [m.message_id for m in queue.peek("orders", 3)] == ["q0", "q1", "q2"]
            taken = queue.take("orders", ["q19"])
            got = queue.receive("orders", 100)
            assert [m.message_id for m in got] == [f"q{i}" for i in range(19)]
            assert [m.body for m in got + taken] == bodies
            assert queue.acknowledge(got + taken) == 20
            with queue.pool.connection() as conn:  # the setting ended with its question
                assert conn.execute("SHOW enable_sort").fetchone() == ("on",)
    finally:
        store.close()


def test_a_store_too_large_to_count_says_its_figures_are_estimates_and_lists_its_destinations(
    pg: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the exact-count limit (a million rows; lowered here) `stats` takes the planner's
    statistics: the total and each destination's share, with the rest on an "and N more" line,
    every figure marked "about". It had printed the estimate as a count and no destination."""
    import psycopg
    from typer.testing import CliRunner

    import duetime.backends.postgres.store as pg_store
    from duetime.cli import app

    store = prepare(pg, "duetime")
    later = datetime.now(UTC) + timedelta(hours=1)
    # 60 destinations: 'big' holds a third, the rest share the others
    names = ["big"] * 10_000 + [f"d{i % 59}" for i in range(20_000)]
    try:
        store.store_many([DelayedMessage(f"m{i}", n, later) for i, n in enumerate(names)])
    finally:
        store.close()
    with psycopg.connect(pg.split("?")[0], autocommit=True) as conn:
        schema = dict(p.split("=") for p in pg.split("?")[1].split("&"))["schema"]
        conn.execute(f'ANALYZE "{schema}"."duetime.delayed"')
    monkeypatch.setattr(pg_store, "EXACT_COUNT_LIMIT", 1_000)
    store = SyncPostgresStore.from_url(pg)
    store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    try:
        counts = store.counts(datetime.now(UTC))
    finally:
        store.close()
    assert counts.estimated and 27_000 <= counts.total <= 33_000, counts
    assert 9_000 <= counts.by_destination["big"] <= 11_000, counts.by_destination
    assert sum(counts.by_destination.values()) + counts.more_messages == counts.total
    assert len(counts.by_destination) + counts.more_destinations == 60
    shown = CliRunner().invoke(app, ["stats", "--store", pg])
    assert shown.exit_code == 0, shown.output
    assert "about 30,000" in shown.output or "about 29,000" in shown.output or "about 31,000" in shown.output
    assert "figures marked 'about' are estimates (the database's statistics" in shown.output


class _SteppingClock(SystemClock):
    """A clock whose every reading is a second after the last: whatever reads it twice sees
    time pass between the two."""

    def __init__(self, start: datetime) -> None:
        self.at = start

    def now(self) -> datetime:
        self.at += timedelta(seconds=1)
        return self.at


@pytest.mark.parametrize("claims", ["lock", "lease"])
def test_a_claim_reads_the_next_due_time_against_one_reading_of_the_clock(pg: str, claims: str) -> None:
    """The claim decides "the next message is not due yet, no connection needed" and then works
    out the time: both against one reading of the clock. Read twice, a message coming due in
    between sent the second step to a connection it did not have; the claimed batch stayed held
    and was sent 30 s late (1 message in a few hundred at 250 a second)."""
    store = prepare(with_option(pg, claims=claims), "stepping")
    try:
        t = datetime.now(UTC)
        store.store_many(
            [DelayedMessage("a", "orders", t), DelayedMessage("b", "orders", t + timedelta(seconds=1.5))]
        )
        store.clock = _SteppingClock(t)  # read once: t + 1 s (b not due); read again: t + 2 s (b due)
        claimed = store.fetch_due_and_next(t, 10)
        assert [m.message_id for m in claimed.messages] == ["a"]
        assert claimed.next_due is not None and claimed.next_due.at == t + timedelta(seconds=1.5)
        assert store.remove_many(["a"]) == 1
    finally:
        store.close()


@pytest.mark.parametrize("claims", ["lock", "lease"])
def test_a_message_due_after_the_claims_own_time_is_its_next_due_time(pg: str, claims: str) -> None:
    """At a thousand messages a second the next one comes due while the claim runs. It was due
    "now" when the statement returned, so the claim left the next due time to a question of its
    own (a store call every round, each answered "due now"). Not due at the claim's own time,
    no other claim can hold it: it is the answer as it is."""
    store = prepare(with_option(pg, claims=claims), "after")
    try:
        t = datetime.now(UTC) - timedelta(seconds=10)
        store.store_many(
            [DelayedMessage("a", "orders", t), DelayedMessage("b", "orders", t + timedelta(seconds=1))]
        )
        claimed = store.fetch_due_and_next(t + timedelta(milliseconds=500), 10)  # b: due since
        assert [m.message_id for m in claimed.messages] == ["a"]
        assert claimed.next_due is not None and claimed.next_due.at == t + timedelta(seconds=1)
        assert store.remove_many(["a"]) == 1
    finally:
        store.close()
