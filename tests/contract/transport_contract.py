"""The transport contract: every transport a dispatcher can deliver through subclasses this suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from duetime import DelayedMessage, DestinationNotFound, ReceivingTransport, Transport


def msg(i: int, destination: str, **headers: str) -> DelayedMessage:
    due = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(microseconds=i)
    return DelayedMessage(
        f"t-{i:04d}", destination, due, bytes([i % 256, 0, 255]) + f"body {i}".encode(), headers
    )


class TransportContract:
    """Subclasses provide a started ``transport`` fixture; queue names are unique per test."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        raise NotImplementedError
        yield  # pragma: no cover

    @pytest.fixture
    def queue(self, request: pytest.FixtureRequest) -> str:
        import uuid

        return f"contract.{uuid.uuid4().hex[:8]}"

    async def receive_all(self, transport: Transport, queue: str, count: int) -> list:  # type: ignore[type-arg]
        assert isinstance(transport, ReceivingTransport)
        got: list = []  # type: ignore[type-arg]
        for _ in range(50):
            got += await transport.receive(queue, count - len(got), 0.2)
            if len(got) >= count:
                break
        await transport.acknowledge(got)
        return got

    async def test_delivers_id_headers_body_and_due_time(self, transport: Transport, queue: str) -> None:
        await transport.declare(queue)
        sent = msg(1, queue, tenant="acme", unicode="žluťoučký")
        assert await transport.send_batch([sent]) == [None]
        [got] = await self.receive_all(transport, queue, 1)
        assert got.message_id == sent.message_id
        assert got.body == sent.body
        assert got.headers["tenant"] == "acme" and got.headers["unicode"] == "žluťoučký"
        assert got.headers["duetime-due-at"] == sent.due_at.isoformat()

    async def test_a_batch_keeps_its_order(self, transport: Transport, queue: str) -> None:
        await transport.declare(queue)
        batch = [msg(i, queue) for i in range(50)]
        assert await transport.send_batch(batch) == [None] * 50
        got = await self.receive_all(transport, queue, 50)
        assert [m.message_id for m in got] == [m.message_id for m in batch]

    async def test_a_missing_destination_fails_only_its_own_message(
        self, transport: Transport, queue: str
    ) -> None:
        await transport.declare(queue)
        results = await transport.send_batch([msg(1, queue), msg(2, queue + ".missing"), msg(3, queue)])
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], DestinationNotFound)
        got = await self.receive_all(transport, queue, 2)
        assert [m.message_id for m in got] == ["t-0001", "t-0003"]

    async def test_acknowledged_messages_are_gone(self, transport: Transport, queue: str) -> None:
        await transport.declare(queue)
        await transport.send_batch([msg(1, queue)])
        await self.receive_all(transport, queue, 1)
        assert isinstance(transport, ReceivingTransport)
        assert await transport.receive(queue, 10, 0.3) == []

    async def test_declare_is_idempotent_and_an_empty_batch_is_fine(
        self, transport: Transport, queue: str
    ) -> None:
        await transport.declare(queue)
        await transport.declare(queue)
        assert await transport.send_batch([]) == []
