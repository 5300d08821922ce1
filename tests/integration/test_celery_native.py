"""``--names celery``: duetime's native delay topology is the one kombu's native delayed delivery
(Celery 5.5+) declares, on the real RabbitMQ. kombu's own code declares it over duetime's without
a 406, publishes a delayed message through it, and a duetime native send reaches a queue kombu
bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from kombu import Connection, Exchange, Queue
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    calculate_routing_key,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from duetime.backends.rabbitmq.native import NativeDelays
from duetime.backends.rabbitmq.transport import RabbitMqTransport
from tests.services import RABBITMQ, require, unique

pytestmark = pytest.mark.slow


@pytest.fixture
async def celery_names() -> AsyncIterator[NativeDelays]:
    require(RABBITMQ)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    await transport.start()
    topology = NativeDelays(transport, "celery")
    await topology.setup()
    yield topology
    await transport.close()


def kombu_queue(name: str) -> None:
    """A queue bound for native delayed delivery as a Celery worker binds it (topic exchange)."""
    with Connection(RABBITMQ) as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")  # 406 if ours differ
        queue = Queue(
            name, Exchange(name, type="topic"), routing_key=name, queue_arguments={"x-queue-type": "quorum"}
        )
        queue.bind(conn.default_channel).declare()
        bind_queue_to_native_delayed_delivery_exchange(conn, queue)


async def arrivals(transport: RabbitMqTransport, queue: str, timeout: float) -> list[tuple[bytes, datetime]]:
    got: list[tuple[bytes, datetime]] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while not got and asyncio.get_running_loop().time() < deadline:
        batch = await transport.receive(queue, 10, 0.2)
        got += [(m.body, datetime.now(UTC)) for m in batch]
        await transport.acknowledge(batch)
    return got


async def cleanup(transport: RabbitMqTransport, name: str) -> None:
    await transport.delete(name)
    channel = await transport._connection.channel()  # type: ignore[union-attr]
    await channel.exchange_delete(name)
    await channel.close()


async def test_kombu_publishes_through_the_topology_duetime_declared(celery_names: NativeDelays) -> None:
    name = unique("kombu-native")
    await asyncio.to_thread(kombu_queue, name)
    try:
        assert await celery_names.verify() == []  # and kombu's declarations were accepted

        def publish() -> None:
            with Connection(RABBITMQ) as conn:
                conn.Producer().publish(
                    b"from kombu",
                    exchange="celery_delayed_27",
                    routing_key=calculate_routing_key(1, name),
                    content_type="application/octet-stream",
                    content_encoding="binary",
                )

        sent = datetime.now(UTC)
        await asyncio.to_thread(publish)
        [(body, at)] = await arrivals(celery_names.transport, name, 10)
        assert body == b"from kombu"
        assert at - sent >= timedelta(seconds=1), "held by the level queue for its second"
    finally:
        await cleanup(celery_names.transport, name)


async def test_a_duetime_native_send_reaches_a_queue_kombu_bound(celery_names: NativeDelays) -> None:
    name = unique("kombu-native")
    await asyncio.to_thread(kombu_queue, name)
    try:
        message = await celery_names.send(name, b"from duetime", delay=1)
        [(body, at)] = await arrivals(celery_names.transport, name, 10)
        assert body == b"from duetime"
        assert at >= message.due_at, "never early"
    finally:
        await cleanup(celery_names.transport, name)


def test_the_celery_names_are_kombus() -> None:
    from kombu.transport.native_delayed_delivery import CELERY_DELAYED_DELIVERY_EXCHANGE, level_name

    from duetime.backends.rabbitmq.native import NAMES, level_binding

    names = NAMES["celery"]
    assert names.delivery == CELERY_DELAYED_DELIVERY_EXCHANGE
    assert [names.level(n) for n in range(28)] == [level_name(n) for n in range(28)]
    assert level_binding(27, "1") == "1.#" and level_binding(0, "0") == "*." * 27 + "0.#"
