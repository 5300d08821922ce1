"""The database going away is the normal case: cut and slow PostgreSQL through a proxy the test
owns. Breakers arm, back off and recover; the critical error comes only after the configured
time; nothing is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import (
    CriticalError,
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    FrontDoor,
    TransactionMode,
)
from duetime.backends.memory import MemoryTransport
from duetime.backends.postgres import (
    PostgresQueueTransport,
    PostgresStore,
    SyncPostgresQueue,
    SyncPostgresStore,
)
from duetime.backends.sqlite import SqliteQueueTransport, SyncSqliteQueue
from duetime.nservicebus.frontdoor import envelope_headers
from tests.integration.proxy import TcpProxy, proxy_for

pytestmark = pytest.mark.slow


@pytest.fixture
def proxy(pg: str) -> Iterator[TcpProxy]:
    with proxy_for(pg) as p:
        yield p


def fast(**kw: object) -> DelayedDeliverySettings:
    base: dict[str, object] = {"failure_backoff": timedelta(seconds=0.2), "max_sleep": timedelta(seconds=1)}
    return DelayedDeliverySettings(**(base | kw))  # type: ignore[arg-type]


def setup_store(url: str, endpoint: str) -> SyncPostgresStore:
    s = SyncPostgresStore.from_url(url)
    s.setup_infrastructure(endpoint)
    s.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    return s


async def test_fetch_breaker_arms_and_recovers_without_losing_anything(pg: str, proxy: TcpProxy) -> None:
    direct = setup_store(pg, "out")
    now = datetime.now(UTC)
    direct.store_many(
        [DelayedMessage(f"m{i}", "orders", now + timedelta(seconds=i * 0.02)) for i in range(150)]
    )
    transport = MemoryTransport()
    await transport.declare("orders")
    store = PostgresStore.from_url(proxy.url(pg) + "&pool_timeout=1")
    criticals: list[CriticalError] = []
    settings = fast(time_to_trigger_fetch_circuit_breaker=timedelta(seconds=8))
    dispatcher = Dispatcher(store, transport, settings, endpoint="out", on_critical_error=criticals.append)
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    proxy.cut()
    await asyncio.sleep(0.5)
    armed_seen = False
    for _ in range(30):
        armed_seen = armed_seen or dispatcher.fetch_breaker.armed
        await asyncio.sleep(0.1)
    proxy.restore()
    for _ in range(100):
        if len({m.message_id for m in transport.messages("orders")}) == 150:
            break
        await asyncio.sleep(0.1)
    dispatcher.stop()
    await task
    assert armed_seen and not dispatcher.fetch_breaker.armed
    assert criticals == []
    got = [m.message_id for m in transport.messages("orders")]
    assert set(got) == {f"m{i}" for i in range(150)}  # nothing lost
    # at-least-once: a batch sent just before the cut, whose delete the cut failed, may go again
    assert len(got) - len(set(got)) <= settings.batch_size
    await store.close()
    direct.close()


async def test_critical_error_only_after_the_configured_time(pg: str, proxy: TcpProxy) -> None:
    direct = setup_store(pg, "down")
    direct.store(DelayedMessage("keep", "orders", datetime.now(UTC) + timedelta(seconds=1)))
    store = PostgresStore.from_url(proxy.url(pg) + "&pool_timeout=0.5")
    transport = MemoryTransport()
    criticals: list[float] = []
    settings = fast(time_to_trigger_fetch_circuit_breaker=timedelta(seconds=3))
    dispatcher = Dispatcher(
        store,
        transport,
        settings,
        endpoint="down",
        on_critical_error=lambda e: criticals.append(time.monotonic()),
    )
    await dispatcher.start()
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.3)
    cut_at = time.monotonic()
    proxy.cut()
    with pytest.raises(CriticalError, match="fetch due delayed messages"):
        await asyncio.wait_for(task, 30)
    assert len(criticals) == 1
    assert 3.0 <= criticals[0] - cut_at < 12, f"critical after {criticals[0] - cut_at:.1f}s"
    assert direct.get("keep") is not None  # nothing lost
    await store.close()
    direct.close()


async def test_dispatch_breaker_trips_when_the_queue_database_stays_away(
    pg: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    direct = setup_store(pg, "disp")
    with SyncPostgresQueue.from_url(pg) as queue:  # closed: a pool left to the collector warns
        queue.declare("orders")
    direct.store_many([DelayedMessage(f"d{i}", "orders", datetime.now(UTC)) for i in range(20)])
    store = PostgresStore.from_url(pg)
    transport = PostgresQueueTransport.from_url(proxy.url(pg) + "&pool_timeout=0.5")
    settings = fast(time_to_trigger_dispatch_circuit_breaker=timedelta(seconds=2), number_of_retries=1000)
    dispatcher = Dispatcher(store, transport, settings, endpoint="disp")
    await dispatcher.start()  # healthy at start; the queue's database goes away afterwards
    proxy.cut()
    try:
        with pytest.raises(CriticalError, match="dispatch delayed messages"):
            await asyncio.wait_for(dispatcher.run(), 30)
        assert direct.counts(datetime.now(UTC)).total == 20  # all still stored
    finally:
        await store.close()
        await transport.close()
        direct.close()


async def test_store_breaker_trips_and_front_door_messages_stay_queued(
    pg: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    setup_store(pg, "door").close()
    queue_file = tmp_path / "door.db"
    sender = SyncSqliteQueue(queue_file)
    sender.declare("door.timeouts")
    now = datetime.now(UTC)
    sender.send(
        [
            DelayedMessage(
                f"f{i}", "door.timeouts", now, b"x", envelope_headers("orders", now + timedelta(hours=1))
            )
            for i in range(5)
        ]
    )
    store = PostgresStore.from_url(proxy.url(pg) + "&pool_timeout=0.5")
    receiver = SqliteQueueTransport(queue_file)
    settings = fast(time_to_wait_before_triggering_critical_error_on_timeout_outages=timedelta(seconds=2))
    dispatcher = Dispatcher(store, receiver, settings, endpoint="door")
    await dispatcher.start()
    door = FrontDoor(dispatcher, receiver, wait=0.1)
    proxy.cut()
    with pytest.raises(CriticalError, match="fetching timeouts from storage"):
        await asyncio.wait_for(asyncio.gather(dispatcher.run(), door.run()), 30)
    assert sender.depth("door.timeouts") == 5  # not acknowledged: they will be received again
    sender.close()
    await store.close()
    await receiver.close()


async def test_a_dropped_listen_connection_comes_back_and_wakes_the_dispatcher(
    pg: str, proxy: TcpProxy
) -> None:
    direct = setup_store(pg, "listen")
    with SyncPostgresQueue.from_url(pg) as queue:  # closed: a pool left to the collector warns
        queue.declare("orders")
    direct.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    store = PostgresStore.from_url(proxy.url(pg))
    store.listen_check = 0.5
    transport = PostgresQueueTransport.from_url(pg)
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(), endpoint="listen")
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(0.5)
    proxy.cut()
    await asyncio.sleep(1.0)
    proxy.restore()
    await asyncio.sleep(1.5)  # the listener reconnects
    due = datetime.now(UTC) + timedelta(seconds=1)
    direct.store(DelayedMessage("near", "orders", due))  # NOTIFY from another connection
    got = await transport.receive("orders", 10, 5.0)
    arrived = datetime.now(UTC)
    dispatcher.stop()
    await task
    assert [m.message_id for m in got] == ["near"]
    assert arrived - due < timedelta(milliseconds=700)
    await store.close()
    await transport.close()
    direct.close()


async def test_a_slow_database_delays_but_loses_nothing(pg: str, proxy: TcpProxy) -> None:
    direct = setup_store(pg, "slow")
    now = datetime.now(UTC)
    direct.store_many([DelayedMessage(f"s{i}", "orders", now) for i in range(300)])
    transport = MemoryTransport()
    await transport.declare("orders")
    proxy.slow(0.05)
    store = PostgresStore.from_url(proxy.url(pg))
    stats = await Dispatcher(store, transport, fast(batch_size=50), endpoint="slow").run_burst()
    assert stats.forwarded == 300 and len(transport.messages("orders")) == 300
    await store.close()
    direct.close()


def test_a_dispatcher_started_during_an_outage_waits_it_out_then_delivers(
    pg: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    """Three dispatchers started while the database is cut (a restart): none exits, each says
    it is waiting, and once the database is back every message is delivered. A start into an
    outage that outlasts the breaker's time ends with exit code 3 (a critical error, for the
    supervisor to restart it), not 1 ("fix the input")."""
    import os
    import signal
    import subprocess

    from tests.conftest import duetime_cmd, wait_until_serving

    direct = setup_store(pg, "late")
    queue = SyncPostgresQueue.from_url(pg)
    queue.declare("orders")
    now = datetime.now(UTC)
    direct.store_many([DelayedMessage(f"m{i}", "orders", now) for i in range(30)])
    through = proxy.url(pg) + "&pool_timeout=1"
    proxy.cut()
    env = {
        **os.environ,
        "DUETIME_FAILURE_BACKOFF": "0.2s",
        "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "30s",
    }
    args = duetime_cmd("run", "--store", through, "--endpoint", "late", "--transport", pg)
    logs = [tmp_path / f"run{i}.log" for i in range(3)]
    procs = []
    for log in logs:
        with log.open("wb") as out:
            procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=out, env=env))
    try:
        # each says it waits (imports take seconds on a loaded machine), and none has left
        deadline = time.monotonic() + 60
        while not all("the store does not answer while" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, [log.read_text()[-800:] for log in logs]
            time.sleep(0.2)
        time.sleep(2)  # several tries each
        assert [p.poll() for p in procs] == [None, None, None], [log.read_text()[-800:] for log in logs]
        proxy.restore()
        for log in logs:
            wait_until_serving(log, 60)
        deadline = time.monotonic() + 30
        while direct.counts(datetime.now(UTC)).total and time.monotonic() < deadline:
            time.sleep(0.2)
        assert direct.counts(datetime.now(UTC)).total == 0
        got = [m.message_id for m in queue.receive("orders", 100)]
        assert sorted(set(got)) == sorted(f"m{i}" for i in range(30))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in procs]
    assert codes == [0, 0, 0], [log.read_text()[-800:] for log in logs]
    # an outage longer than the breaker's time: critical, exit code 3
    proxy.cut()
    short = {**env, "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "3s"}
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=short)
    assert done.returncode == 3, done.stderr[-1500:]
    assert time.monotonic() - started >= 3
    assert "critical" in done.stderr and "Traceback" not in done.stderr
    direct.close()
    queue.close()


def test_a_delivery_log_behind_a_partition_delays_no_delivery_and_no_stop(
    pg: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    """Was: 2 of 30 delivered in 40 s, then SIGTERM hung 30 s and exited 1. The log's database
    stops answering (a partition) while the dispatcher runs: every message goes, and a stop ends
    the process in seconds with exit code 0."""
    import os
    import signal
    import subprocess

    from tests.conftest import duetime_cmd, wait_until_serving

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    setup_store(pg, "logged").close()  # the schema
    log_url = proxy.url(pg)
    log = tmp_path / "run.log"
    env = {**os.environ, "DUETIME_FAILURE_BACKOFF": "0.2s"}
    assert (
        subprocess.run(duetime_cmd("setup", "--store", store_url, "--queue", "orders"), env=env).returncode
        == 0
    )
    args = duetime_cmd("run", "--store", store_url, "--delivery-log", log_url)
    with log.open("wb") as out:
        run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=out, env=env)
    try:
        wait_until_serving(log)
        proxy.blackhole()
        stamp = datetime.now(UTC)
        from duetime.backends.sqlite import SyncSqliteStore

        with SyncSqliteStore.from_url(store_url) as direct:
            direct.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
            direct.store_many(
                [DelayedMessage(f"m{i}", "orders", stamp + timedelta(seconds=0.1 * i)) for i in range(30)]
            )
            deadline = time.monotonic() + 30
            while direct.counts(datetime.now(UTC)).total and time.monotonic() < deadline:
                time.sleep(0.2)
            assert direct.counts(datetime.now(UTC)).total == 0, log.read_text()[-1500:]
        with SyncSqliteQueue.from_url(store_url) as queue:
            assert len(queue.receive("orders", 100)) == 30
        stopping = time.monotonic()
        run.send_signal(signal.SIGTERM)
        code = run.wait(30)
        assert code == 0 and time.monotonic() - stopping < 15, log.read_text()[-1500:]
    finally:
        if run.poll() is None:
            run.kill()
        proxy.restore()
