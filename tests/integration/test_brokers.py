"""End to end on the real brokers: SQLite and PostgreSQL stores deliver through RabbitMQ, Redis
(stream and list) and NATS JetStream; nothing lost, nothing early, the unknown destination in the
error queue with its reason."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import (
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    ReceivingTransport,
    TransactionMode,
    Transport,
    open_store,
)
from tests.services import NATS, REDIS, delete_redis_keys, postgres_schema, require

BROKERS = ["rabbitmq", "redis-stream", "redis-list", "nats"]


@contextmanager
def store_url(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/e2e.db"
    else:
        with postgres_schema() as url:
            yield url


async def deliver_and_check(store_url: str, transport: Transport, total: int = 300) -> None:
    tag = uuid.uuid4().hex[:8]
    queue, error_queue = f"e2e.orders.{tag}", f"e2e.error.{tag}"
    await transport.declare(queue)
    store = open_store(store_url)
    await store.setup_infrastructure("e2e")
    settings = DelayedDeliverySettings(
        error_queue=error_queue, transaction_mode=TransactionMode.AT_LEAST_ONCE
    )
    dispatcher = Dispatcher(store, transport, settings, endpoint="e2e")
    await dispatcher.start()
    now = datetime.now(UTC)
    await store.store_many(
        [
            DelayedMessage(
                f"e{i:04d}", queue, now + timedelta(seconds=i / total), f"b{i}".encode(), {"n": str(i)}
            )
            for i in range(total)
        ]
        + [DelayedMessage("lost", f"e2e.typo.{tag}", now)]
    )
    task = asyncio.create_task(dispatcher.run())
    assert isinstance(transport, ReceivingTransport)
    got: list[Any] = []
    arrived: list[datetime] = []
    deadline = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < deadline:
        batch = await transport.receive(queue, 500, 0.2)
        arrived += [datetime.now(UTC)] * len(batch)
        got += batch
        await transport.acknowledge(batch)
        if len(got) >= total:
            break
    dispatcher.stop()
    await task
    ids = [m.message_id for m in got]
    assert sorted(ids) == [f"e{i:04d}" for i in range(total)]
    for m, at in zip(got, arrived, strict=True):
        assert at >= datetime.fromisoformat(m.headers["duetime-due-at"])  # never early
        assert m.body == f"b{int(m.headers['n'])}".encode()
    dead = await transport.receive(error_queue, 10, 2.0)
    await transport.acknowledge(dead)
    assert [m.message_id for m in dead] == ["lost"]
    assert "duetime-error-message" in dead[0].headers
    await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
async def test_stores_deliver_through_each_broker(
    broker: tuple[str, Any], store_kind: str, tmp_path: Path
) -> None:
    with store_url(store_kind, tmp_path) as url:
        await deliver_and_check(url, broker[1])


@pytest.mark.slow
async def test_redis_store_wakes_a_sleeping_dispatcher_from_another_process() -> None:
    import subprocess

    from duetime.backends.redis import RedisStore, RedisTransport, SyncRedisStore
    from tests.conftest import duetime_cmd

    require(REDIS)
    tag = uuid.uuid4().hex[:8]
    store_url = f"{REDIS}?prefix=duetime-wake-{tag}:"
    other = SyncRedisStore.from_url(store_url)
    other.setup_infrastructure("wake")
    other.initialize("wake", TransactionMode.AT_LEAST_ONCE)
    other.store(DelayedMessage("far", "orders", datetime.now(UTC) + timedelta(minutes=2)))
    transport = RedisTransport.from_url(f"{REDIS}?prefix=duetime-wake-{tag}:")
    await transport.start()
    await transport.declare("orders")
    store = RedisStore.from_url(store_url)
    dispatcher = Dispatcher(store, transport, endpoint="wake")
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.sleep(0.5)
        due = datetime.now(UTC) + timedelta(seconds=1)
        script = (
            "import sys; from datetime import datetime; from duetime.backends.redis import SyncRedisStore;"
            "from duetime import DelayedMessage, TransactionMode; s = SyncRedisStore.from_url(sys.argv[1]);"
            "s.initialize('wake', TransactionMode.AT_LEAST_ONCE);"
            "s.store(DelayedMessage('near', 'orders', datetime.fromisoformat(sys.argv[2]))); s.close()"
        )
        subprocess.run([duetime_cmd()[0], "-c", script, store_url, due.isoformat()], check=True)
        # A loaded machine can take longer than the second to start that process: the dispatcher
        # is judged from when the message was there to see, not from a due time already past.
        there = max(due, datetime.now(UTC))
        got = await transport.receive("orders", 10, 5.0)
        arrived = datetime.now(UTC)
        await transport.acknowledge(got)
        assert [m.message_id for m in got] == ["near"]
        assert due <= arrived < there + timedelta(milliseconds=500)
    finally:
        dispatcher.stop()
        await task
        await store.close()
        await transport.close()
        other.close()
        delete_redis_keys(f"duetime-wake-{tag}:")


async def test_nats_environments_with_their_own_subject_prefix_share_a_server() -> None:
    """Streams were named by the queue alone: a second prefix's declare found the first one's
    stream, took it for its own, and every send failed as "not declared". A stream named the old
    way for another prefix does not block the default prefix either."""
    from duetime.backends.nats import NatsTransport

    require(NATS)
    tag = uuid.uuid4().hex[:8]
    queue = f"shared.{tag}"
    staging = NatsTransport.from_url(f"{NATS}?subject_prefix=staging-{tag}.")
    prod = NatsTransport.from_url(f"{NATS}?subject_prefix=prod-{tag}.")
    default = NatsTransport.from_url(NATS)
    for t in (staging, prod, default):
        await t.start()
    old_style = f"DUETIME_shared_{tag}_x"
    try:
        # what a duetime of before left: a stream for another prefix under the queue's plain name
        await staging.js.add_stream(name=old_style, subjects=[staging.subject(queue)])
        for t in (staging, prod, default):
            await t.declare(queue)
            await t.declare(queue)  # idempotent: found by its subject
        now = datetime.now(UTC)
        for t, body in ((staging, b"s"), (prod, b"p"), (default, b"d")):
            assert await t.send_batch([DelayedMessage(f"{body.decode()}-{tag}", queue, now, body)]) == [None]
        for t, body in ((staging, b"s"), (prod, b"p"), (default, b"d")):
            got = await t.receive(queue, 10, 1.0)
            assert [m.body for m in got] == [body]
            await t.acknowledge(got)
            assert await t.has_queue(queue)
    finally:
        for t in (staging, prod, default):
            with contextlib.suppress(Exception):
                await t.delete(queue)
            await t.close()
