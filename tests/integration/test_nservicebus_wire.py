"""NServiceBus on the wire, on the real RabbitMQ: each test plays an NServiceBus endpoint with a raw
AMQP client (aiormq), declaring and publishing what NServiceBus declares and publishes, as its
published source does (the timeout manager; NServiceBus.RabbitMQ's delay levels and headers)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec
from pamqp import encode

from duetime import DelayedDeliverySettings, Dispatcher, FrontDoor
from duetime.backends.rabbitmq.native import Names, NativeDelays
from duetime.backends.rabbitmq.transport import RabbitMqTransport
from duetime.backends.rabbitmq.wire import Int32, Int64
from duetime.backends.sqlite import SqliteStore, SyncSqliteStore
from duetime.nservicebus.frontdoor import front_door_queue, legacy_front_door_queue
from duetime.nservicebus_wire import from_wire, to_wire
from tests.services import RABBITMQ, require

pytestmark = pytest.mark.slow


class Endpoint:
    """What an NServiceBus.RabbitMQ endpoint does on the broker, with a raw AMQP channel."""

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self.channel = channel
        self.made: list[tuple[str, str]] = []

    async def conventional_queue(self, name: str, *, quorum: bool = False) -> None:
        """R4 ConventionalRoutingTopology.Initialize: the queue, a fanout exchange of its name, bound."""
        arguments = {"x-queue-type": "quorum"} if quorum else {}
        await self.channel.queue_declare(name, durable=True, arguments=arguments)
        await self.channel.exchange_declare(name, exchange_type="fanout", durable=True)
        await self.channel.queue_bind(name, name, routing_key="")
        self.made += [("queue", name), ("exchange", name)]

    async def send(self, address: str, body: bytes, headers: dict[str, str]) -> None:
        """R3/R4: a conventional-topology send, properties filled from the headers."""
        enclosed = headers.get("NServiceBus.EnclosedMessageTypes")
        properties = spec.Basic.Properties(
            message_id=headers["NServiceBus.MessageId"],
            delivery_mode=2,
            headers=dict(headers),
            correlation_id=headers.get("NServiceBus.CorrelationId"),
            message_type=enclosed.split(",")[0] if enclosed else None,
            content_type=headers.get("NServiceBus.ContentType", "application/octet-stream"),
            reply_to=headers.get("NServiceBus.ReplyToAddress"),
        )
        await self.channel.basic_publish(body, exchange=address, routing_key="", properties=properties)

    async def get(self, queue: str, timeout: float = 10.0) -> Any:
        """One message as NServiceBus's receiver sees it (raw properties and headers)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                got = await self.channel.basic_get(queue, no_ack=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise
            if got.delivery_tag is not None and got.body is not None and got.header is not None:
                return got
            await asyncio.sleep(0.1)
        return None

    async def cleanup(self) -> None:
        for kind, name in reversed(self.made):
            if kind == "queue":
                await self.channel.queue_delete(name)
            else:
                await self.channel.exchange_delete(name)


@pytest.fixture
async def nsb() -> AsyncIterator[Endpoint]:
    require(RABBITMQ)
    connection = await aiormq.connect(RABBITMQ)
    endpoint = Endpoint(await connection.channel())
    yield endpoint
    channel = await connection.channel()
    endpoint.channel = channel
    await endpoint.cleanup()
    await connection.close()


def timeout_headers(message_id: str, *, expire: datetime, saga: str | None, **more: str) -> dict[str, str]:
    """A deferred send as NServiceBus 7 makes it (N3, N4): all the sender's headers, plus Expire."""
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.CorrelationId": f"corr-{message_id}",
        "NServiceBus.ReplyToAddress": "Sales",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Sales.OrderTimeout, Sales, Version=1.0.0.0",
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.Version": "7.8.6",
        "NServiceBus.TimeSent": to_wire(datetime.now(UTC)),
        "NServiceBus.Timeout.Expire": to_wire(expire),
        **({"NServiceBus.SagaId": saga} if saga else {}),
        **more,
    }


async def running(
    tmp_path: Path, endpoint: str, transport: RabbitMqTransport
) -> tuple[Dispatcher, FrontDoor, SqliteStore]:
    sync = SyncSqliteStore(tmp_path / "s.db")
    sync.setup_infrastructure(endpoint)
    store = SqliteStore(sync)
    dispatcher = Dispatcher(
        store, transport, DelayedDeliverySettings(error_queue=f"{endpoint}.error"), endpoint=endpoint
    )
    await dispatcher.start()
    door = FrontDoor(dispatcher, transport, wait=0.1)
    await door.start()
    return dispatcher, door, store


async def until(check: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_an_nservicebus_sender_reaches_the_front_door_and_its_timeout_comes_back_as_nservicebus_sends_it(
    nsb: Endpoint, tmp_path: Path
) -> None:
    endpoint = f"Sales-{uuid.uuid4().hex[:6]}"
    # NServiceBus declared the timeouts queue already, as a quorum queue (its installers)
    await nsb.conventional_queue(front_door_queue(endpoint), quorum=True)
    destination = f"Sales.Orders-{uuid.uuid4().hex[:6]}"
    await nsb.conventional_queue(destination)
    transport = RabbitMqTransport.from_url(RABBITMQ)  # queue_type=classic: the quorum queue is accepted
    dispatcher, door, store = await running(tmp_path, endpoint, transport)
    saga = str(uuid.uuid4())
    soon = datetime.now(UTC) + timedelta(seconds=3)  # stored: more than NServiceBus's 1 s away (N6)
    routed = timeout_headers(
        "t-routed", expire=soon, saga=saga, **{"NServiceBus.Timeout.RouteExpiredTimeoutTo": destination}
    )
    replied = timeout_headers(
        "t-reply", expire=soon, saga=None, **{"NServiceBus.ReplyToAddress": destination}
    )
    # published to the fanout exchange named after the queue (the conventional topology, R4)
    await nsb.send(front_door_queue(endpoint), b'{"order": 1}', routed)
    await nsb.send(front_door_queue(endpoint), b'{"order": 2}', replied)
    task = asyncio.gather(dispatcher.run(), door.run())
    first = await nsb.get(destination)
    second = await nsb.get(destination)
    dispatcher.stop()
    await task
    assert first is not None and second is not None
    by_id = {m.header.properties.message_id: m for m in (first, second)}
    assert set(by_id) == {"t-routed", "t-reply"}  # R5: the message-id property NServiceBus requires
    got = by_id["t-routed"]
    props, headers = got.header.properties, got.header.properties.headers
    assert got.body == b'{"order": 1}'
    # N6/N7: the stored headers as NServiceBus keeps them (Expire and RouteExpiredTimeoutTo too) ...
    for key, value in routed.items():
        if key != "NServiceBus.TimeSent":
            assert headers[key] == value, key
    # ... plus the time of dispatch (wire format) and the id of the timeout
    sent = from_wire(headers["NServiceBus.TimeSent"])
    assert sent is not None and soon - timedelta(seconds=1) <= sent <= datetime.now(UTC)
    assert len(headers["NServiceBus.TimeSent"]) == 28
    assert headers["NServiceBus.RelatedToTimeoutId"] == "t-routed"
    # R3: the AMQP properties an NServiceBus.RabbitMQ sender fills
    assert props.correlation_id == "corr-t-routed" and props.message_type == "Sales.OrderTimeout"
    assert props.content_type == "application/json" and props.reply_to == "Sales"
    assert props.delivery_mode == 2
    assert by_id["t-reply"].header.properties.headers["NServiceBus.RelatedToTimeoutId"] == "t-reply"
    assert door.stored == 2
    await store.close()
    await transport.close()


async def test_a_timeout_already_due_on_arrival_is_forwarded_with_its_headers_as_they_came(
    nsb: Endpoint, tmp_path: Path
) -> None:
    """N6: when ``Time - 1 s <= UtcNow`` the timeout manager forwards the message at once with its
    incoming id and headers unchanged: the sender's TimeSent, no RelatedToTimeoutId (no timeout
    was stored). duetime gave such envelopes the headers of a stored timeout (20 of 20 differed)."""
    endpoint = f"Sales-{uuid.uuid4().hex[:6]}"
    await nsb.conventional_queue(front_door_queue(endpoint), quorum=True)
    destination = f"Sales.Orders-{uuid.uuid4().hex[:6]}"
    await nsb.conventional_queue(destination)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    dispatcher, door, store = await running(tmp_path, endpoint, transport)
    now = datetime.now(UTC)
    sent = {
        f"due-{i}": timeout_headers(
            f"due-{i}",
            expire=now + timedelta(milliseconds=500) if i % 2 else now - timedelta(minutes=i),
            saga=str(uuid.uuid4()),
            **{"NServiceBus.Timeout.RouteExpiredTimeoutTo": destination},
        )
        for i in range(20)
    }
    for headers in sent.values():
        await nsb.send(front_door_queue(endpoint), b"{}", headers)
    task = asyncio.gather(dispatcher.run(), door.run())
    got = [await nsb.get(destination) for _ in sent]
    dispatcher.stop()
    await task
    assert all(m is not None for m in got)
    for m in got:
        props, headers = m.header.properties, m.header.properties.headers
        came = sent[props.message_id]  # its incoming id
        assert "NServiceBus.RelatedToTimeoutId" not in headers
        assert {k: v.decode() if isinstance(v, bytes) else v for k, v in headers.items() if k in came} == came
        assert set(headers) - set(came) == {"duetime-due-at"}  # duetime's own, said in the README
    await store.close()
    await transport.close()


async def test_a_completed_saga_clears_its_timeouts(nsb: Endpoint, tmp_path: Path) -> None:
    endpoint = f"Billing-{uuid.uuid4().hex[:6]}"
    await nsb.conventional_queue(front_door_queue(endpoint))
    destination = f"Billing.In-{uuid.uuid4().hex[:6]}"
    await nsb.conventional_queue(destination)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    dispatcher, door, store = await running(tmp_path, endpoint, transport)
    done_saga, live_saga = str(uuid.uuid4()), str(uuid.uuid4())
    later = datetime.now(UTC) + timedelta(hours=1)
    route = {"NServiceBus.Timeout.RouteExpiredTimeoutTo": destination}
    for i, saga in enumerate([done_saga, done_saga, live_saga]):
        await nsb.send(
            front_door_queue(endpoint), b"t", timeout_headers(f"t{i}", expire=later, saga=saga, **route)
        )
    task = asyncio.gather(dispatcher.run(), door.run())
    await until(lambda: _count(store, 3))
    assert {(await store.get(f"t{i}")).group for i in range(3)} == {done_saga, live_saga}  # type: ignore[union-attr]
    # N8: the control message a saga sends when it completes (empty body)
    control = {
        "NServiceBus.MessageId": str(uuid.uuid4()),
        "NServiceBus.ControlMessage": "True",
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.SagaId": done_saga,
        "NServiceBus.ClearTimeouts": "True",
    }
    await nsb.send(front_door_queue(endpoint), b"", control)
    await nsb.send(front_door_queue(endpoint), b"", control)  # a redelivery is harmless
    await until(lambda: _count(store, 1))
    dispatcher.stop()
    await task
    assert await store.get("t0") is None and await store.get("t1") is None
    assert (await store.get("t2")) is not None
    assert door.cleared == 2 and door.rejected == 0
    assert await nsb.get(f"{endpoint}.error", timeout=0.5) is None  # not an error any more
    await store.close()
    await transport.close()


async def _count(store: SqliteStore, total: int) -> bool:
    return (await store.counts(datetime.now(UTC))).total == total


async def test_the_old_queue_name_keeps_working(nsb: Endpoint, tmp_path: Path) -> None:
    endpoint = f"Old-{uuid.uuid4().hex[:6]}"
    old = legacy_front_door_queue(endpoint)
    await nsb.channel.queue_declare(old, durable=True)  # what duetime before 0.9 declared
    nsb.made.append(("queue", old))
    nsb.made.append(("queue", front_door_queue(endpoint)))
    nsb.made.append(("exchange", front_door_queue(endpoint)))
    await nsb.channel.queue_declare(destination := f"old-dest-{uuid.uuid4().hex[:6]}", durable=True)
    nsb.made.append(("queue", destination))
    headers = {"duetime-route-to": destination, "duetime-deliver-at": datetime.now(UTC).isoformat()}
    await nsb.channel.basic_publish(
        b"left", routing_key=old, properties=spec.Basic.Properties(message_id="old-1", headers=headers)
    )
    transport = RabbitMqTransport.from_url(RABBITMQ)
    dispatcher, door, store = await running(tmp_path, endpoint, transport)
    assert door.queues == [old, front_door_queue(endpoint)]
    task = asyncio.gather(dispatcher.run(), door.run())
    got = await nsb.get(destination)
    dispatcher.stop()
    await task
    assert got is not None and got.body == b"left"
    await store.close()
    await transport.close()


async def test_native_publishes_carry_delay_in_seconds_and_nservicebus_properties(nsb: Endpoint) -> None:
    require(RABBITMQ)
    tag = uuid.uuid4().hex[:6]
    transport = RabbitMqTransport.from_url(RABBITMQ)
    names = Names(f"t{tag}.nsb.v2.delay-level-", f"t{tag}.nsb.v2.delay-delivery", None)
    native = NativeDelays(transport, names, levels=3)
    await native.setup()
    destination = f"NsbDest-{tag}"
    await nsb.conventional_queue(destination)  # has its own exchange: bound by exchange (R4, T4)
    headers = timeout_headers("native-1", expire=datetime.now(UTC), saga=None)
    await native.send(destination, b"n", delay=2, headers=headers, message_id="duetime-id")
    got = await nsb.get(destination, timeout=15)
    assert got is not None
    props = got.header.properties
    raw = props.headers
    assert raw["NServiceBus.Transport.RabbitMQ.DelayInSeconds"] == 2  # R1/R3: what NServiceBus reads
    assert props.message_id == "native-1"  # NServiceBus.MessageId, not duetime's id
    assert props.correlation_id == "corr-native-1" and props.reply_to == "Sales"
    assert await nsb.get(destination, timeout=1) is None  # exactly one copy (exchange-bound, not both)
    # duetime's own consumer strips it on arrival with the dead-letter bookkeeping (R5)
    await native.send(destination, b"m", delay=1, message_id="m2")
    [arrived] = await _receive(transport, destination)
    assert "NServiceBus.Transport.RabbitMQ.DelayInSeconds" not in arrived.headers
    assert not any(k.startswith("x-") for k in arrived.headers)
    await native.teardown(force=True)
    await transport.close()


async def _receive(transport: RabbitMqTransport, queue: str) -> list[Any]:
    for _ in range(60):
        got = await transport.receive(queue, 10, 0.2)
        if got:
            await transport.acknowledge(got)
            return got
    return []


def test_integers_keep_the_width_nservicebus_gives_them() -> None:
    """x-message-ttl is an Int64 at every level (R1, R2); DelayInSeconds an Int32 (R3)."""
    table = encode.field_table({"ttl": Int64(1000), "delay": Int32(5), "plain": 5})
    assert b"\x03ttll" + (1000).to_bytes(8, "big") in table
    assert b"\x05delayI" + (5).to_bytes(4, "big") in table
    assert b"\x05plainb\x05" in table  # everything else as pamqp always did


async def test_v1_names_declare_and_verify_what_nservicebus_4_to_6_declares(nsb: Endpoint) -> None:
    """R2: classic lazy queues with an Int64 TTL and a dead-letter exchange, no quorum arguments.
    An endpoint that declared them first is verified and set up without 406, and the other way."""
    require(RABBITMQ)
    for first in ("nservicebus", "duetime"):
        tag = uuid.uuid4().hex[:6]
        names = Names(f"t{tag}.nsb.delay-level-", f"t{tag}.nsb.delay-delivery", None, classic_lazy=True)
        transport = RabbitMqTransport.from_url(RABBITMQ)
        native = NativeDelays(transport, names, levels=4)

        async def as_nservicebus(names: Names = names) -> None:
            ch = nsb.channel
            await ch.exchange_declare(names.delivery, exchange_type="topic", durable=True)
            for level in range(4):
                dead = names.level(level - 1) if level else names.delivery
                await ch.exchange_declare(names.level(level), exchange_type="topic", durable=True)
                await ch.queue_declare(
                    names.level(level),
                    durable=True,
                    arguments={
                        "x-queue-mode": "lazy",
                        "x-message-ttl": Int64(2**level * 1000),
                        "x-dead-letter-exchange": dead,
                    },
                )

        if first == "nservicebus":
            await as_nservicebus()
            assert await native.verify() == []
            await native.setup()
        else:
            await native.setup()
            await as_nservicebus()  # no PRECONDITION_FAILED: the same arguments
            assert await native.verify() == []
        args = await native.queue_arguments(3)
        assert args == {
            "x-message-ttl": 8000,
            "x-dead-letter-exchange": names.level(2),
            "x-queue-mode": "lazy",
        }
        assert isinstance(args["x-message-ttl"], Int64)
        await native.teardown(force=True)
        await transport.close()


async def test_conventional_topology_declares_the_exchange_for_every_queue(nsb: Endpoint) -> None:
    require(RABBITMQ)
    transport = RabbitMqTransport.from_url(RABBITMQ + "?topology=conventional")
    queue = f"conv-{uuid.uuid4().hex[:6]}"
    await transport.declare(queue)
    await nsb.send(queue, b"via exchange", {"NServiceBus.MessageId": "c1"})
    got = await nsb.get(queue)
    assert got is not None and got.body == b"via exchange"
    nsb.made += [("queue", queue), ("exchange", queue)]
    await transport.close()
