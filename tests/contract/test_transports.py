"""The transport contract on every transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from duetime.backends.memory import MemoryTransport
from duetime.backends.sqlite import SqliteQueueTransport
from duetime.testing.transport_contract import TransportContract, msg
from tests.services import NATS, RABBITMQ, REDIS, postgres_schema, require


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
        t = RabbitMqTransport.from_url(RABBITMQ)
        await t.start()
        yield t
        for queue in list(t.declared):
            await t.delete(queue)
        await t.close()


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
