"""The transport contract on every transport."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from duetime.backends.memory import MemoryTransport
from duetime.backends.sqlite import SqliteQueueTransport
from duetime.interfaces import ReceivedMessage
from duetime.message import DelayedMessage
from duetime.testing.transport_contract import ContainmentContract, ReceivingContract, TransportContract, msg
from tests.services import MQTT, NATS, RABBITMQ, REDIS, postgres_schema, require


class TestMemoryTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[MemoryTransport]:
        t = MemoryTransport()
        await t.start()
        yield t
        await t.close()


class TestSqliteQueueTransport(TransportContract):
    @pytest.fixture
    async def transport(self, tmp_path: Path) -> AsyncIterator[SqliteQueueTransport]:
        t = SqliteQueueTransport(tmp_path / "q.db")
        await t.start()
        yield t
        await t.close()


class TestPostgresQueueTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.postgres import PostgresQueueTransport

        with postgres_schema() as url:
            t = PostgresQueueTransport.from_url(url)
            await t.start()
            yield t
            await t.close()


class TestRabbitMqTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.rabbitmq import RabbitMqTransport

        require(RABBITMQ)
        t = RabbitMqTransport.from_url(f"{RABBITMQ}?max_message_size=65536")
        await t.start()
        yield t
        for queue in list(t.declared):
            await t.delete(queue)
        await t.close()

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        return {
            "a 200 KB header (over the frame size: the broker would close the connection)": msg(
                100, queue, big="x" * 200_000
            ),
            "45,000 three-byte characters (135,000 bytes: over the frame size)": msg(
                101, queue, h="€" * 45_000
            ),
            "a header name over 128 bytes (the client would cut it)": msg(102, queue, **{"n" * 200: "v"}),
            "2,000 header names of 40 three-byte characters (240,000 bytes)": msg(
                106, queue, **{f"{i:04d}" + "€" * 36: "" for i in range(2_000)}
            ),
            "a body over the URL's max_message_size": DelayedMessage(
                "t-0103", queue, datetime(2030, 1, 1, tzinfo=UTC), b"y" * 70_000, {}
            ),
            "a queue name RabbitMQ reserves (amq.)": msg(104, "amq.contract"),
            "a queue name over 255 bytes (150 two-byte characters)": msg(105, "é" * 150),
        }


@pytest.mark.parametrize("mode", ["stream", "list"])
class TestRedisTransport(TransportContract):
    @pytest.fixture
    async def transport(self, mode: str) -> AsyncIterator[object]:
        import uuid

        from duetime.backends.redis import RedisTransport

        require(REDIS)
        prefix = f"duetime-test-{uuid.uuid4().hex[:8]}:"
        t = RedisTransport.from_url(f"{REDIS}?mode={mode}&prefix={prefix}")
        await t.start()
        yield t
        keys = [k async for k in t.redis.scan_iter(match=f"{prefix}*")]
        if keys:
            await t.redis.delete(*keys)
        await t.close()


class TestNatsTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        import uuid

        from duetime.backends.nats import NatsTransport

        require(NATS)
        t = NatsTransport.from_url(f"{NATS}?subject_prefix=duetime-test-{uuid.uuid4().hex[:8]}.")
        await t.start()
        yield t
        for queue in list(t.declared):
            await t.delete(queue)
        await t.close()

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        return {
            "Status: 404 (nats-py would hide it from every consumer)": msg(100, queue, Status="404"),
            "Status: 503 (nats-py would fail the read)": msg(101, queue, Status="503"),
            "status in lower case": msg(102, queue, status="408"),
            "Description": msg(103, queue, Description="No Messages"),
            "JetStream's own header": msg(104, queue, **{"Nats-Expected-Stream": "other"}),
            "a header name with a colon": msg(105, queue, **{"a:b": "v"}),
            "a body over the server's max_payload": DelayedMessage(
                "t-0106", queue, datetime(2030, 1, 1, tzinfo=UTC), b"z" * (1024 * 1024 + 10), {}
            ),
        }

    async def test_a_stream_message_with_a_status_header_is_read_like_any_other(
        self, transport: object, queue: str
    ) -> None:
        """Put there by another publisher (a sender to the front door, a duetime of before): nats-py
        took it for a JetStream status message, hid it (404) or failed the read (503)."""
        from duetime.backends.nats import NatsTransport

        assert isinstance(transport, NatsTransport)
        await transport.declare(queue)
        for i, status in enumerate(("404", "503", "408")):
            await transport.js.publish(
                transport.subject(queue),
                f"body {i}".encode(),
                headers={"Status": status, "Description": "No Messages", "duetime-message-id": f"s-{i}"},
            )
        got = await self.receive_all(transport, queue, 3)
        assert [(m.message_id, m.body, m.headers["Status"]) for m in got] == [
            ("s-0", b"body 0", "404"),
            ("s-1", b"body 1", "503"),
            ("s-2", b"body 2", "408"),
        ]
        assert await transport.receive(queue, 10, 0.3) == []

    async def test_peek_skips_what_the_consumer_acknowledged(self, transport: object, queue: str) -> None:
        """A stream keeps acknowledged messages; the error queue's view must not show them."""
        from duetime.backends.nats import NatsTransport

        assert isinstance(transport, NatsTransport)
        await transport.declare(queue)
        await transport.send_batch([msg(0, queue)])
        await self.receive_all(transport, queue, 1)
        await transport.send_batch([msg(i, queue) for i in (1, 2)])
        assert [m.message_id for m in await transport.peek(queue, 10)] == ["t-0001", "t-0002"]
        assert await transport.depth(queue) == 2


class _ReadFromRabbitMq(ContainmentContract):
    """Celery's and Dramatiq's transports publish to RabbitMQ queues, read back here with a plain
    AMQP client (they cannot read themselves). Their queues are made by each publish."""

    async def prepare(self, transport: object, queue: str) -> None:
        pass

    async def delivered(self, transport: object, queue: str, count: int) -> list[str]:
        from duetime.backends.rabbitmq import RabbitMqTransport

        reader = RabbitMqTransport.from_url(RABBITMQ)
        await reader.start()
        try:
            ids = await super().delivered(reader, queue, count)
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):  # Dramatiq's delay and dead-letter queues
                await reader.delete(name)
            return ids
        finally:
            await reader.close()


class TestCeleryTransport(_ReadFromRabbitMq):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.celery.transport import CeleryTransport

        require(RABBITMQ)
        t = CeleryTransport.from_url(f"celery+{RABBITMQ}")
        await t.start()
        yield t
        await t.close()

    @staticmethod
    def task(message_id: str, queue: str, exchange: dict[str, Any], destination: str = "") -> DelayedMessage:
        from duetime.backends.celery.envelope import PUBLISH_HEADER, CeleryPublish

        publish = CeleryPublish(
            exchange=exchange["name"],
            routing_key=queue,
            headers={"id": message_id, "task": "contract.task"},
            properties={"message_id": message_id, "correlation_id": message_id},
            declare={"name": queue, "exchange": exchange, "routing_key": queue, "auto_delete": True},
            destination=destination or queue,
        )
        body = json.dumps([[message_id], {}, {}]).encode()
        return DelayedMessage(
            message_id,
            destination or queue,
            datetime(2030, 1, 1, tzinfo=UTC),
            body,
            {PUBLISH_HEADER: publish.to_header()},
        )

    def good(self, i: int, queue: str) -> DelayedMessage:
        return self.task(f"t-{i:04d}", queue, {"name": f"{queue}.x", "type": "direct", "auto_delete": True})

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        other = f"contract.other.{uuid.uuid4().hex[:8]}"
        return {
            # a Celery app using kombu's delayed exchange without the broker's plugin: RabbitMQ
            # closes the whole connection (503 COMMAND_INVALID)
            "an exchange of a type the broker lacks": self.task(
                "t-0100", other, {"name": other, "type": "x-delayed-message"}, destination=other
            ),
            # RabbitMQ closes the channel (403 ACCESS_REFUSED)
            "a queue name RabbitMQ reserves (amq.)": self.task(
                "t-0101", "amq.contract", {"name": f"{other}.x", "type": "direct"}, destination="amq.contract"
            ),
        }


class TestDramatiqTransport(_ReadFromRabbitMq):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        import pika

        from duetime.backends.dramatiq.transport import DramatiqTransport

        require(RABBITMQ)
        self.other_arguments = f"contract.args.{uuid.uuid4().hex[:8]}"
        connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
        connection.channel().queue_declare(self.other_arguments, arguments={"x-max-length": 5})
        t = DramatiqTransport.from_url(f"dramatiq+{RABBITMQ}")
        await t.start()
        yield t
        await t.close()
        channel = connection.channel()
        for name in (self.other_arguments, f"{self.other_arguments}.DQ", f"{self.other_arguments}.XQ"):
            channel.queue_delete(name)
        connection.close()

    def identify(self, message: ReceivedMessage) -> str:
        return str(json.loads(message.body)["message_id"])  # Dramatiq keeps it in its body

    @staticmethod
    def actor_message(message_id: str, queue: str) -> DelayedMessage:
        from dramatiq import Message

        body = Message(
            queue_name=queue, actor_name="contract", args=(), kwargs={}, options={}, message_id=message_id
        ).encode()
        return DelayedMessage(message_id, queue, datetime(2030, 1, 1, tzinfo=UTC), body, {})

    def good(self, i: int, queue: str) -> DelayedMessage:
        return self.actor_message(f"t-{i:04d}", queue)

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        return {
            # RabbitMQ closes the channel (403 ACCESS_REFUSED)
            "a queue name RabbitMQ reserves (amq.)": self.actor_message("t-0100", "amq.contract"),
            # RabbitMQ closes the channel (406 PRECONDITION_FAILED)
            "a queue that exists with other arguments": self.actor_message("t-0101", self.other_arguments),
        }


class TestWebhookTransport(ContainmentContract):
    """Webhooks, read back at a real receiver (uvicorn) that checks every signature. The
    endpoints come from a store, as `duetime run` has them: :meth:`prepare` registers one per
    queue. A batch's requests go at once, so arrival order within a batch is not kept: ids are
    compared sorted."""

    SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.memory import MemoryStore
        from duetime.backends.webhooks.transport import WebhookTransport
        from duetime.settings import TransactionMode
        from tests.webhook_receiver import receiving

        with receiving(self.SECRET) as receiver:
            self.receiver = receiver
            self.store = MemoryStore()
            await self.store.setup_infrastructure("contract")
            await self.store.initialize("contract", TransactionMode.AT_LEAST_ONCE)
            t = WebhookTransport()
            t.attach_store(self.store)
            await t.start()
            yield t
            await t.close()

    async def prepare(self, transport: object, queue: str) -> None:
        from duetime.webhooks import WebhookEndpoint

        hook = WebhookEndpoint(
            queue, self.receiver.url(f"/ok/{queue}"), (self.SECRET,), datetime.now(UTC), headers=("h",),
            allow=("127.0.0.1",),
        )  # fmt: skip
        await self.store.add_webhook(hook)
        await transport.declare(queue)  # type: ignore[attr-defined]

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        due = datetime(2030, 1, 1, tzinfo=UTC)
        return {
            "an id HTTP cannot carry unchanged (a line break)": DelayedMessage("t-01\n00", queue, due, b"x"),
            "an id beyond ASCII": DelayedMessage("t-0101-é", queue, due, b"x"),
            "a header passed on that holds a line break": msg(102, queue, h="a\r\nInjected: yes"),
            "no webhook registered by that name": msg(103, queue + ".unregistered"),
        }

    async def delivered(self, transport: object, queue: str, count: int) -> list[str]:
        from tests.services import until

        def arrived() -> list[str]:
            return [r.headers["webhook-id"] for r in self.receiver.to(f"/ok/{queue}") if r.status == 200]

        await asyncio.to_thread(until, lambda: len(arrived()) >= count, 10, f"{count} webhooks")
        await asyncio.sleep(0.3)  # and nothing more
        assert all(r.verified for r in self.receiver.requests)
        assert all("injected" not in r.headers for r in self.receiver.requests)
        return sorted(arrived())


class TestMqttTransport(ReceivingContract):
    """MQTT 5 against the real Mosquitto: a declared topic is a persistent session subscribed to
    it, so what is published waits there for ``receive``."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.mqtt.transport import MqttTransport

        require(MQTT)
        t = MqttTransport.from_url(MQTT)
        await t.start()
        self.declared: list[str] = []
        yield t
        for topic in self.declared:
            await t.delete(topic)
        await t.close()

    @pytest.fixture
    def queue(self) -> str:
        topic = f"contract/{uuid.uuid4().hex[:8]}"
        self.declared.append(topic)
        return topic

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        return {
            "a wildcard topic (+)": msg(100, queue + "/+"),
            "a wildcard topic (#)": msg(101, queue + "/#"),
            "one of the broker's own topics ($SYS)": msg(102, "$SYS/contract"),
            "a header holding NUL (user properties cannot)": msg(103, queue, h="a\x00b"),
        }
