"""The transport contract: every transport a dispatcher can deliver through subclasses this suite.

:class:`ContainmentContract` holds any transport, one that can be read back or not, to the rule
that one message its broker refuses fails alone: its batch-mates are delivered once and the
transport goes on. :class:`ReceivingContract` adds what a transport duetime can read from must do
(an MQTT topic's subscription as much as a broker's queue), and :class:`TransportContract` what a
transport with queues must also do (a missing queue, looking into one); each includes the cases
before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from duetime.errors import DestinationNotFound, MessageRefused
from duetime.interfaces import InspectableQueue, ReceivedMessage, ReceivingTransport, Transport
from duetime.message import DelayedMessage


def msg(i: int, destination: str, **headers: str) -> DelayedMessage:
    due = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(microseconds=i)
    return DelayedMessage(
        f"t-{i:04d}", destination, due, bytes([i % 256, 0, 255]) + f"body {i}".encode(), headers
    )


class ContainmentContract:
    """Subclasses provide a started ``transport`` fixture and, for their broker, the messages it
    refuses (:meth:`refused`); queue names are unique per test. A transport whose messages are
    not :func:`msg`'s shape (a Celery task, a Dramatiq message) overrides :meth:`good`, and one
    that cannot be read back overrides :meth:`delivered`."""

    @pytest.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        raise NotImplementedError
        yield  # pragma: no cover

    @pytest.fixture
    def queue(self, request: pytest.FixtureRequest) -> str:
        import uuid

        return f"contract.{uuid.uuid4().hex[:8]}"

    def good(self, i: int, queue: str) -> DelayedMessage:
        """A message the transport carries to ``queue``; ``i`` makes its id."""
        return msg(i, queue)

    def refused(self, queue: str) -> dict[str, DelayedMessage]:
        """Messages this transport's broker refuses, each named by why: a destination it refuses,
        a header it cannot carry (or that its readers would take for their own), a body over its
        limit, one that makes it close the channel or the whole connection. None by default: a
        transport that can carry anything has nothing to refuse."""
        return {}

    async def prepare(self, transport: Transport, queue: str) -> None:
        """Make ``queue`` ready to receive (a transport whose queues are made by each publish, as
        Celery's and Dramatiq's are, needs nothing)."""
        await transport.declare(queue)

    def identify(self, message: ReceivedMessage) -> str:
        """The id a received message was sent with (a transport that keeps it elsewhere, in its
        body as Dramatiq does, says where)."""
        return message.message_id

    async def delivered(self, transport: Transport, queue: str, count: int) -> list[str]:
        """The ids of the messages that arrived in ``queue``, in order, once they number
        ``count`` (or no more come), taken off the queue. ``transport`` must be able to read;
        one that cannot passes a reader of the same queues."""
        assert isinstance(transport, ReceivingTransport)
        got: list = []  # type: ignore[type-arg]
        for _ in range(50):
            got += await transport.receive(queue, count + 10 - len(got), 0.2)
            if len(got) >= count:
                got += await transport.receive(queue, 10, 0.3)  # and nothing more
                break
        await transport.acknowledge(got)
        return [self.identify(m) for m in got]

    async def test_a_refused_message_fails_alone_and_its_batch_mates_go_once(
        self, transport: Transport, queue: str
    ) -> None:
        """Each refused message between two good ones: the good ones are carried, once each; the
        refused one fails with a reason that is never retried (it goes to the error queue); the
        transport carries the next batch as if nothing had happened."""
        await self.prepare(transport, queue)
        sent: list[str] = []
        for n, (why, bad) in enumerate(self.refused(queue).items()):
            before, after = self.good(2 * n, queue), self.good(2 * n + 1, queue)
            results = await transport.send_batch([before, bad, after])
            assert results[0] is None and results[2] is None, (why, results)
            assert isinstance(results[1], (MessageRefused, DestinationNotFound)), (why, results[1])
            sent += [before.message_id, after.message_id]
        last = self.good(999, queue)
        assert await transport.send_batch([last]) == [None]
        sent.append(last.message_id)
        assert await self.delivered(transport, queue, len(sent)) == sent


class ReceivingContract(ContainmentContract):
    """What every transport duetime can read from must do, queues or not (an MQTT topic has a
    subscription where a broker has a queue): deliver id, headers, body and due time; keep a
    batch's order; acknowledge. Subclasses provide a started ``transport`` fixture."""

    async def receive_all(self, transport: Transport, queue: str, count: int) -> list:  # type: ignore[type-arg]
        """``count`` messages, each batch acknowledged as the next is asked for (``done=``), as a
        consumer does: a transport may hold back more while many are unacknowledged (an MQTT
        broker's in-flight window, 20 on Mosquitto)."""
        assert isinstance(transport, ReceivingTransport)
        got: list = []  # type: ignore[type-arg]
        last: list = []  # type: ignore[type-arg]
        for _ in range(50):
            last = await transport.receive(queue, count - len(got), 0.2, done=last)
            got += last
            if len(got) >= count:
                break
        await transport.acknowledge(last)
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

    async def test_a_new_message_that_reuses_an_id_is_delivered(
        self, transport: Transport, queue: str
    ) -> None:
        """An id may come back: a message scheduled again under a delivered one's id, a recurring
        tick sent again by ``backfill``. It is a new message, not a re-send, and arrives (a
        broker that drops repeats of an id, as JetStream does within its window, dropped it)."""
        await transport.declare(queue)
        first = msg(1, queue)
        again = DelayedMessage(first.message_id, queue, first.due_at + timedelta(seconds=1), b"again")
        same_body = DelayedMessage(first.message_id, queue, first.due_at + timedelta(seconds=2), first.body)
        for sent in (first, again, same_body):
            assert await transport.send_batch([sent]) == [None]
        got = await self.receive_all(transport, queue, 3)
        assert [(m.message_id, m.headers["duetime-due-at"]) for m in got] == [
            (m.message_id, m.due_at.isoformat()) for m in (first, again, same_body)
        ]

    async def test_a_batch_keeps_its_order(self, transport: Transport, queue: str) -> None:
        await transport.declare(queue)
        batch = [msg(i, queue) for i in range(50)]
        assert await transport.send_batch(batch) == [None] * 50
        got = await self.receive_all(transport, queue, 50)
        assert [m.message_id for m in got] == [m.message_id for m in batch]

    async def test_acknowledged_messages_are_gone(self, transport: Transport, queue: str) -> None:
        await transport.declare(queue)
        await transport.send_batch([msg(1, queue)])
        await self.receive_all(transport, queue, 1)
        assert isinstance(transport, ReceivingTransport)
        assert await transport.receive(queue, 10, 0.3) == []

    async def test_a_receive_acknowledges_what_was_done_before_it_takes(
        self, transport: Transport, queue: str
    ) -> None:
        """``receive(..., done=...)`` acknowledges the consumer's handled messages first: with
        more waiting, with the last one, and with nothing left to take."""
        assert isinstance(transport, ReceivingTransport)
        await transport.declare(queue)
        await transport.send_batch([msg(i, queue) for i in range(3)])
        first = await transport.receive(queue, 1, 2.0)
        second = await transport.receive(queue, 1, 2.0, done=first)
        third = await transport.receive(queue, 10, 2.0, done=second)
        assert [m.message_id for m in first + second + third] == ["t-0000", "t-0001", "t-0002"]
        assert await transport.receive(queue, 10, 0.3, done=third) == []
        assert await transport.acknowledge(first + second + third) == 0  # each was acknowledged already

    async def test_declare_is_idempotent_and_an_empty_batch_is_fine(
        self, transport: Transport, queue: str
    ) -> None:
        await transport.declare(queue)
        await transport.declare(queue)
        assert await transport.send_batch([]) == []


class TransportContract(ReceivingContract):
    """A transport with queues: a message for a queue that is not there fails alone, and an
    operator can look into a queue and pick from it. Subclasses provide a started ``transport``
    fixture; queue names are unique per test."""

    async def test_a_missing_destination_fails_only_its_own_message(
        self, transport: Transport, queue: str
    ) -> None:
        await transport.declare(queue)
        results = await transport.send_batch([msg(1, queue), msg(2, queue + ".missing"), msg(3, queue)])
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], DestinationNotFound)
        got = await self.receive_all(transport, queue, 2)
        assert [m.message_id for m in got] == ["t-0001", "t-0003"]

    async def test_peek_shows_the_oldest_and_leaves_them_there(
        self, transport: Transport, queue: str
    ) -> None:
        assert isinstance(transport, InspectableQueue)
        await transport.declare(queue)
        await transport.send_batch([msg(i, queue, tenant="acme") for i in range(5)])
        first = await transport.peek(queue, 3)
        assert [m.message_id for m in first] == ["t-0000", "t-0001", "t-0002"]
        assert first[0].headers["tenant"] == "acme" and first[0].body == msg(0, queue).body
        assert [m.message_id for m in await transport.peek(queue, 10)] == [f"t-{i:04d}" for i in range(5)]
        assert await transport.depth(queue) == 5
        got = await self.receive_all(transport, queue, 5)
        assert [m.message_id for m in got] == [f"t-{i:04d}" for i in range(5)]

    async def test_take_by_id_and_acknowledge_removes_just_those(
        self, transport: Transport, queue: str
    ) -> None:
        assert isinstance(transport, InspectableQueue)
        await transport.declare(queue)
        await transport.send_batch([msg(i, queue) for i in range(5)])
        taken = await transport.take(queue, ["t-0001", "t-0003", "not-there"])
        assert sorted(m.message_id for m in taken) == ["t-0001", "t-0003"]
        assert taken[0].body == msg(1, queue).body
        assert await transport.acknowledge(taken) == 2
        assert await transport.take(queue, ["t-0001"]) == []
        assert [m.message_id for m in await transport.peek(queue, 10)] == ["t-0000", "t-0002", "t-0004"]
        assert await transport.depth(queue) == 3
        got = await self.receive_all(transport, queue, 3)
        assert [m.message_id for m in got] == ["t-0000", "t-0002", "t-0004"]

    async def test_knows_which_queues_are_declared(self, transport: Transport, queue: str) -> None:
        assert isinstance(transport, InspectableQueue)
        await transport.declare(queue)
        assert await transport.has_queue(queue)
        assert not await transport.has_queue(queue + ".missing")
