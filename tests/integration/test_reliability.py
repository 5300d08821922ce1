"""Outages, partitions and poison, against the real servers through a proxy the test owns.

A broker restart (the proxy cuts every connection) is one outage: messages stay stored, nothing
goes to the error queue, the dispatcher reconnects; only the dispatch breaker's time ends in exit
code 3. A partition (the proxy holds bytes) trips the breakers after their time, because every
call has a deadline. Envelopes and queue rows that cannot become messages go to the error queue
and the service keeps running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiormq
import pytest

from duetime import (
    CriticalError,
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    FrontDoor,
    ListQuery,
    TransactionMode,
)
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore, SyncPostgresStore
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore, SyncSqliteQueue, SyncSqliteStore
from duetime.error_headers import ERROR_MESSAGE
from duetime.errors import TransportUnavailable
from duetime.nservicebus.frontdoor import front_door_queue
from tests.conftest import sqlite_file
from tests.integration.proxy import TcpProxy, proxy_for
from tests.services import POSTGRES, RABBITMQ, postgres_schema, require

pytestmark = pytest.mark.slow
CLI = [str(Path(sys.executable).parent / "duetime")]


def fast(**kw: object) -> DelayedDeliverySettings:
    base: dict[str, object] = {
        "failure_backoff": timedelta(seconds=0.1),
        "max_failure_backoff": timedelta(seconds=0.5),
        "max_sleep": timedelta(seconds=1),
    }
    return DelayedDeliverySettings(**(base | kw))  # type: ignore[arg-type]


#: The stores :func:`sqlite_store` made for the test under way, closed when it ends.
OPENED: list[SyncSqliteStore] = []


def sqlite_store(path: Path, endpoint: str) -> SyncSqliteStore:
    sync = SyncSqliteStore(path)
    OPENED.append(sync)
    sync.setup_infrastructure(endpoint)
    sync.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    return sync


@pytest.fixture(autouse=True)
def _close_the_stores_made() -> Iterator[None]:
    yield
    while OPENED:
        OPENED.pop().close()  # closing twice is fine: a test may have closed it already


@pytest.fixture
def rabbit() -> Iterator[TcpProxy]:
    require(RABBITMQ)
    with proxy_for(RABBITMQ) as proxy:
        yield proxy


@pytest.fixture
async def broker_queue() -> AsyncIterator[tuple[RabbitMqTransport, str]]:
    """A queue of this test's own on the real broker (reached directly, not through the proxy)."""
    require(RABBITMQ)
    queue = f"rel.{uuid.uuid4().hex[:8]}"
    direct = RabbitMqTransport.from_url(RABBITMQ)
    await direct.declare(queue)
    yield direct, queue
    await direct.delete(queue)
    await direct.close()


async def drain(direct: RabbitMqTransport, queue: str, want: int, seconds: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(set(got)) < want:
        batch = await direct.receive(queue, 1000, 0.2)
        got += [m.message_id for m in batch]
        await direct.acknowledge(batch)
    return got


async def test_a_broker_restart_is_one_outage_nothing_dead_lettered(tmp_path: Path, rabbit: TcpProxy) -> None:
    """Default settings (no retries): a 3 s cut costs no message and fills no error queue."""
    queue, error_queue = f"rel.{uuid.uuid4().hex[:8]}", f"rel.err.{uuid.uuid4().hex[:8]}"
    direct = RabbitMqTransport.from_url(RABBITMQ)
    for name in (queue, error_queue):
        await direct.declare(name)
    sync = sqlite_store(tmp_path / "s.db", "rel")
    transport = RabbitMqTransport.from_url(rabbit.url(RABBITMQ))
    criticals: list[CriticalError] = []
    dispatcher = Dispatcher(
        SqliteStore(sync),
        transport,
        fast(error_queue=error_queue),
        endpoint="rel",
        on_critical_error=criticals.append,
    )
    now = datetime.now(UTC)
    total = 2000
    sync.store_many(
        [
            DelayedMessage(f"r{i:05d}", queue, now + timedelta(seconds=0.5 + i / total * 6))
            for i in range(total)
        ]
    )
    task = asyncio.create_task(dispatcher.run())
    # cut once delivery is under way (on a loaded machine the start may take a while), with most
    # messages still waiting
    deadline = time.monotonic() + 30
    while dispatcher.stats.forwarded == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert dispatcher.stats.forwarded < total // 2, "the cut came too late to test anything"
    rabbit.cut()
    await asyncio.sleep(3.0)
    assert not task.done(), "the dispatcher stopped during a short broker outage"
    assert dispatcher.dispatch_breaker.armed
    rabbit.restore()
    got = await drain(direct, queue, total, 40)
    dispatcher.stop()
    await task
    await transport.close()
    assert criticals == []
    assert len(set(got)) == total, f"{total - len(set(got))} lost"
    assert dispatcher.stats.dead_lettered == 0 and dispatcher.stats.outages > 0
    assert await direct.receive(error_queue, 10, 0.3) == []
    assert not dispatcher.dispatch_breaker.armed
    for name in (queue, error_queue):
        await direct.delete(name)
    await direct.close()


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args],
        env=os.environ | env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines_until(proc: subprocess.Popen[str], text: str, seconds: float) -> list[str]:
    """``proc``'s stderr lines up to the first holding ``text`` (or its end). ``seconds`` is looked
    at between lines: a process that says nothing at all is left to the test's own timeout."""
    assert proc.stderr is not None
    deadline = time.monotonic() + seconds
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if not line or text in line:
            break
    return seen


async def test_a_long_broker_outage_ends_in_exit_3_after_the_breaker_time(
    tmp_path: Path, rabbit: TcpProxy, broker_queue: tuple[RabbitMqTransport, str]
) -> None:
    direct, queue = broker_queue
    db = tmp_path / "s.db"
    sync = sqlite_store(db, "long")
    sync.store_many([DelayedMessage(f"l{i}", queue, datetime.now(UTC)) for i in range(50)])
    rabbit.cut()
    env = {
        "DUETIME_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER": "3s",
        "DUETIME_FAILURE_BACKOFF": "100ms",
    }
    url = rabbit.url(RABBITMQ)
    started = time.monotonic()
    proc = run_cli(["run", "--store", f"sqlite:///{db}", "--endpoint", "long", "--transport", url], env)
    _, stderr = await asyncio.to_thread(proc.communicate, timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 3, stderr
    assert 3 <= took < 20, took
    assert "Traceback" not in stderr, stderr
    assert "critical: Failed to dispatch delayed messages to destination." in stderr
    assert sync.counts(datetime.now(UTC)).total == 50  # nothing lost, nothing dead-lettered
    rabbit.restore()
    burst = run_cli(
        ["run", "--burst", "--store", f"sqlite:///{db}", "--endpoint", "long", "--transport", url], {}
    )
    _, stderr = await asyncio.to_thread(burst.communicate, timeout=60)
    assert burst.returncode == 0, stderr
    assert len(set(await drain(direct, queue, 50, 20))) == 50


async def test_a_dispatcher_started_while_the_broker_is_down_waits_for_it(
    tmp_path: Path, rabbit: TcpProxy, broker_queue: tuple[RabbitMqTransport, str]
) -> None:
    direct, queue = broker_queue
    db = tmp_path / "s.db"
    sqlite_store(db, "late").store_many(
        [DelayedMessage(f"w{i}", queue, datetime.now(UTC)) for i in range(20)]
    )
    rabbit.cut()
    proc = run_cli(
        ["run", "--store", f"sqlite:///{db}", "--endpoint", "late", "--transport", rabbit.url(RABBITMQ)],
        {"DUETIME_FAILURE_BACKOFF": "200ms"},
    )
    # The broker comes back once the dispatcher has met it down (a fixed wait let a slow start
    # on a loaded machine reach the broker only after it was back).
    seen = await asyncio.to_thread(lines_until, proc, "transport unreachable", 60)
    assert proc.poll() is None, "".join(seen) + proc.communicate()[1]
    rabbit.restore()
    got = await drain(direct, queue, 20, 30)
    proc.send_signal(signal.SIGTERM)
    _, rest = await asyncio.to_thread(proc.communicate, timeout=30)
    stderr = "".join(seen) + rest
    assert proc.returncode == 0, stderr
    assert len(set(got)) == 20
    assert "Traceback" not in stderr, stderr
    unreachable = [line for line in stderr.splitlines() if "transport unreachable" in line]
    assert unreachable and all("cannot connect to" in line for line in unreachable[:1])


async def test_a_partitioned_broker_trips_the_dispatch_breaker(
    tmp_path: Path, rabbit: TcpProxy, broker_queue: tuple[RabbitMqTransport, str]
) -> None:
    _, queue = broker_queue
    sync = sqlite_store(tmp_path / "s.db", "part")
    transport = RabbitMqTransport.from_url(rabbit.url(RABBITMQ))
    criticals: list[CriticalError] = []
    settings = fast(time_to_trigger_dispatch_circuit_breaker=timedelta(seconds=3))
    dispatcher = Dispatcher(
        SqliteStore(sync), transport, settings, endpoint="part", on_critical_error=criticals.append
    )
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    rabbit.blackhole()
    sync.store_many([DelayedMessage(f"p{i}", queue, datetime.now(UTC)) for i in range(30)])
    started = time.monotonic()
    with pytest.raises(CriticalError, match="Failed to dispatch"):
        await asyncio.wait_for(task, 30)
    assert 3 <= time.monotonic() - started < 15
    assert len(criticals) == 1
    assert sync.counts(datetime.now(UTC)).total == 30
    rabbit.restore()
    await transport.close()


async def test_publishes_not_confirmed_within_publish_timeout_come_back_unsent(
    rabbit: TcpProxy, broker_queue: tuple[RabbitMqTransport, str]
) -> None:
    """A batch whose confirms do not come within ``publish_timeout`` answers each message as
    unreachable (the dispatcher gives them back to the store) after about that long, not never,
    and leaves no confirm awaited; a caller that gives up sooner gets its TimeoutError."""
    _, queue = broker_queue
    transport = RabbitMqTransport.from_url(rabbit.url(RABBITMQ) + "?publish_timeout=1")
    await transport.start()
    due = datetime.now(UTC)
    assert await transport.send_batch([DelayedMessage("ok", queue, due)]) == [None]
    channel = await transport.channel.get_underlay_channel()
    assert isinstance(channel, aiormq.Channel)
    rabbit.blackhole()
    started = time.monotonic()
    results = await transport.send_batch([DelayedMessage(f"t{i}", queue, due) for i in range(20)])
    assert 0.9 <= time.monotonic() - started < 5
    assert all(isinstance(r, TransportUnavailable) for r in results), results
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(transport.send_batch([DelayedMessage("gave-up", queue, due)]), 0.2)
    assert all(confirm.done() for confirm in channel.confirmations.values())  # nothing awaited
    rabbit.restore()
    await transport.close()


async def test_a_partitioned_database_trips_the_fetch_breaker() -> None:
    with postgres_schema() as pg, proxy_for(pg) as proxy:
        direct = SyncPostgresStore.from_url(pg)
        direct.setup_infrastructure("part")
        direct.initialize("part", TransactionMode.AT_LEAST_ONCE)
        store = PostgresStore.from_url(proxy.url(pg) + "&pool_timeout=1")
        from duetime.backends.memory import MemoryTransport

        criticals: list[CriticalError] = []
        settings = fast(time_to_trigger_fetch_circuit_breaker=timedelta(seconds=3))
        dispatcher = Dispatcher(
            store, MemoryTransport(), settings, endpoint="part", on_critical_error=criticals.append
        )
        task = asyncio.create_task(dispatcher.run())
        await asyncio.sleep(0.5)
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(CriticalError, match="Failed to fetch"):
            await asyncio.wait_for(task, 40)
        assert 3 <= time.monotonic() - started < 20
        proxy.restore()
        await asyncio.wait_for(store.close(), 20)
        direct.close()


def partitioned(
    proxy: TcpProxy,
    process: subprocess.Popen[bytes],
    ready: Callable[[], bool],
    *,
    settle: float,
    then: Callable[[], None] | None = None,
) -> tuple[int, float]:
    """Once ``ready()`` (and ``settle`` seconds more), partition ``process`` from its server and
    do ``then``: its exit code, and the seconds it took to end from there."""
    waited = time.monotonic()
    while not ready() and time.monotonic() - waited < 30:
        time.sleep(0.1)
    time.sleep(settle)
    try:
        proxy.blackhole()
        started = time.monotonic()
        if then is not None:
            then()
        return process.wait(60), time.monotonic() - started
    finally:
        process.kill()
        proxy.restore()


def listening(url: str) -> Callable[[], bool]:
    """Whether a receiver of the PostgreSQL queue at ``url`` is LISTENing on its channel."""
    import psycopg

    from duetime.backends.postgres.connection import QUEUE_TABLES, PgOptions, channel_of

    channel = channel_of(PgOptions.from_url(url).schema, QUEUE_TABLES)

    def ready() -> bool:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = %s", [f"LISTEN {channel}"]
            ).fetchone()
        return bool(found and found[0])

    return ready


def interrupt(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C a second after the partition: a call is under way on the dead connection."""
    time.sleep(1)
    process.send_signal(signal.SIGINT)


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_a_run_stopped_by_a_partition_leaves_for_its_supervisor(database: str, tmp_path: Path) -> None:
    """A driver blocked in a read on a partitioned connection never returns, and Python waited for
    its thread at exit: the dispatcher logged its critical error and then hung for ever instead of
    exiting with code 3 for its supervisor to restart it (MariaDB and PostgreSQL alike)."""
    from tests.conftest import duetime_cmd
    from tests.services import mariadb_database

    endpoint = "partitioned"
    log = tmp_path / "run.log"
    place = postgres_schema() if database == "postgresql" else mariadb_database()
    with place as url, proxy_for(url) as proxy:
        through = proxy.url(url)
        setup = subprocess.run(
            duetime_cmd("setup", "--store", through, "--endpoint", endpoint), capture_output=True, text=True
        )
        assert setup.returncode == 0, setup.stderr
        env = {
            **os.environ,
            "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "2",
            "DUETIME_MAX_SLEEP": "0.5",
            "DUETIME_STOP_TIMEOUT": "3",
        }
        with log.open("w") as out:  # the process keeps its own copy of the file
            run = subprocess.Popen(
                duetime_cmd(
                    "run",
                    "--store",
                    through,
                    "--endpoint",
                    endpoint,
                    "--transport",
                    f"sqlite:///{tmp_path}/q.db",
                ),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        # dispatching, its connections open: then the partition
        code, took = partitioned(proxy, run, lambda: "dispatching endpoint" in log.read_text(), settle=1)
        said = log.read_text()
    assert code == 3, said[-3000:]
    assert took < 30
    assert "stopping did not finish within 3 s" in said, said[-3000:]
    assert said.strip().splitlines()[-1].startswith("critical: Failed to fetch"), said[-3000:]


def test_ctrl_c_on_a_command_waiting_on_a_partitioned_server_still_ends_it(tmp_path: Path) -> None:
    """`queues receive` waited on a PostgreSQL queue when the partition came; Ctrl-C then hung for
    good: closing the queue waited on the event loop for the thread stuck on the dead connection,
    and past that the interpreter waits for it at exit. It now leaves 15 s after it starts to."""
    from tests.conftest import duetime_cmd

    log = tmp_path / "receive.log"
    with postgres_schema() as url, proxy_for(url) as proxy:
        through = proxy.url(url)
        declared = subprocess.run(
            duetime_cmd("queues", "declare", "orders", "--transport", through), capture_output=True, text=True
        )
        assert declared.returncode == 0, declared.stderr
        with log.open("w") as out:
            receive = subprocess.Popen(
                duetime_cmd("queues", "receive", "orders", "--wait", "120", "--transport", through),
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        # waiting on the queue's channel (however slow the start; a connection through the proxy
        # said only that it had begun, and one of `declare` could still be closing), then the
        # partition, then Ctrl-C
        code, took = partitioned(proxy, receive, listening(url), settle=1, then=lambda: interrupt(receive))
    said = log.read_text()
    assert code == 130, said[-2000:]
    assert took < 30
    assert "did not finish within 15 s" in said and "pg-queue-wait" in said, said[-2000:]


# --- poison ------------------------------------------------------------------------------------

GOOD_DUE = "2030-01-01T00:00:00+00:00"


def poison_rows() -> list[tuple[str, str, bytes | str]]:
    """(message id, headers as stored, body) as other writers might put them in a queue table."""
    route = {"duetime-route-to": "orders"}
    return [
        ("good-1", json.dumps(route | {"duetime-deliver-at": GOOD_DUE}), b"ok"),
        ("overflow", json.dumps(route | {"duetime-deliver-at": "0001-01-01T00:00:00+01:00"}), b"x"),
        ("number-header", json.dumps(route | {"duetime-deliver-at": GOOD_DUE, "n": 5}), b"x"),
        ("not-json", "this is not json", b"x"),
        ("text-body", json.dumps(route | {"duetime-deliver-at": GOOD_DUE}), "a text body"),
        ("good-2", json.dumps(route | {"duetime-deliver-at": GOOD_DUE}), b"ok"),
    ]


async def check_poison(store: object, transport: object, endpoint: str, error_queue: str) -> None:
    dispatcher = Dispatcher(store, transport, fast(error_queue=error_queue), endpoint=endpoint)  # type: ignore[arg-type]
    await dispatcher.start()
    door = FrontDoor(dispatcher, transport, wait=0.2)  # type: ignore[arg-type]
    assert await door.process_once() == 6
    stored = {m.message_id for m in (await store.list(ListQuery())).messages}  # type: ignore[attr-defined]
    assert stored == {"good-1", "good-2", "text-body"}
    assert (await store.get("text-body")).body == b"a text body"  # type: ignore[attr-defined]
    errors = await transport.receive(error_queue, 10, 0.2)  # type: ignore[attr-defined]
    reasons = {m.message_id: m.headers[ERROR_MESSAGE] for m in errors}
    assert set(reasons) == {"overflow", "number-header", "not-json"}
    assert "out of range" in reasons["overflow"]
    assert "'n' is int, not text" in reasons["number-header"]
    assert "not JSON" in reasons["not-json"]
    assert await door.process_once() == 0  # nothing sticks on the queue
    dispatcher.stop()


async def test_poison_rows_in_a_sqlite_front_door_queue(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    sqlite_store(db, "shop")
    with SyncSqliteQueue(db) as queue:
        for name in (front_door_queue("shop"), "orders", "error"):
            queue.declare(name)
    now = int(time.time() * 1_000_000)
    with sqlite_file(db) as conn:
        for message_id, headers, body in poison_rows():
            conn.execute(
                "INSERT INTO duetime_queue_messages (queue, message_id, headers, body, enqueued_at, visible_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (front_door_queue("shop"), message_id, headers, body, now, now),
            )
    store = SqliteStore.from_url(f"sqlite:///{db}")
    transport = SqliteQueueTransport(db)
    await check_poison(store, transport, "shop", "error")
    await transport.close()
    await store.close()


async def test_poison_rows_in_a_postgres_front_door_queue() -> None:
    import psycopg

    with postgres_schema() as pg:
        schema = pg.rsplit("schema=", 1)[1]
        store = PostgresStore.from_url(pg)
        await store.setup_infrastructure("shop")
        transport = PostgresQueueTransport.from_url(pg)
        await transport.start()
        for name in (front_door_queue("shop"), "orders", "error"):
            await transport.declare(name)
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            for message_id, headers, body in poison_rows():
                if headers == "this is not json":
                    continue  # a json column refuses it: PostgreSQL itself keeps this one out
                conn.execute(
                    f'INSERT INTO "{schema}".duetime_queue_messages (queue, message_id, headers, body)'
                    " VALUES (%s, %s, %s, %s)",
                    (
                        front_door_queue("shop"),
                        message_id,
                        headers,
                        body if isinstance(body, bytes) else body.encode(),
                    ),
                )
        dispatcher = Dispatcher(store, transport, fast(), endpoint="shop")
        await dispatcher.start()
        door = FrontDoor(dispatcher, transport, wait=0.2)
        assert await door.process_once() == 5
        errors = await transport.receive("error", 10, 0.2)
        assert {m.message_id for m in errors} == {"overflow", "number-header"}
        assert await store.get("good-1") is not None and await store.get("good-2") is not None
        await transport.close()
        await store.close()


async def test_an_out_of_range_envelope_on_rabbitmq_goes_to_the_error_queue(tmp_path: Path) -> None:
    require(RABBITMQ)
    endpoint = f"poison{uuid.uuid4().hex[:6]}"
    error_queue = f"{endpoint}.error"
    transport = RabbitMqTransport.from_url(RABBITMQ)
    sync = sqlite_store(tmp_path / "s.db", endpoint)
    dispatcher = Dispatcher(SqliteStore(sync), transport, fast(error_queue=error_queue), endpoint=endpoint)
    await dispatcher.start()
    door = FrontDoor(dispatcher, transport, wait=0.5)
    await door.start()
    envelopes = [
        DelayedMessage(
            mid,
            front_door_queue(endpoint),
            datetime.now(UTC),
            b"x",
            {"duetime-route-to": "orders", "duetime-deliver-at": due},
        )
        for mid, due in (("bad", "0001-01-01T00:00:00+01:00"), ("fine", GOOD_DUE))
    ]
    assert await transport.send_batch(envelopes) == [None, None]
    handled = 0
    for _ in range(10):
        handled += await door.process_once()
        if handled >= 2:
            break
    assert sync.get("fine") is not None and sync.get("bad") is None
    [rejected] = await transport.receive(error_queue, 10, 2.0)
    assert rejected.message_id == "bad"
    await transport.acknowledge([rejected])
    for name in (front_door_queue(endpoint), error_queue):
        await transport.delete(name)
    await transport.close()
