"""A RabbitMQ batch written as one frame buffer (``batchwrite``), against the real broker.

The batch registers its confirms in aiormq's own books and writes every frame at once; these tests
hold it to what ``basic_publish`` one at a time guaranteed: each publish answered alone (ack,
unroutable, refused), bodies bigger than a frame intact and in order, and a write that never
reached the socket leaving the channel's delivery tags as they were, so later confirms still match.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aiormq
import pytest
from aio_pika.exceptions import DeliveryError
from pamqp.commands import Basic

from duetime import MessageRefused
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.backends.rabbitmq.batchwrite import PIECE_BYTES, Publish, write_batch
from tests.services import RABBITMQ, require


@pytest.fixture
async def transport_and_queue() -> AsyncIterator[tuple[RabbitMqTransport, str]]:
    require(RABBITMQ)
    queue = f"batch.{uuid.uuid4().hex[:8]}"
    transport = RabbitMqTransport.from_url(RABBITMQ + "?publish_timeout=2")
    await transport.declare(queue)
    yield transport, queue
    await transport.delete(queue)
    await transport.close()


def publish(queue: str, body: bytes, message_id: str | None = None) -> Publish:
    return Publish("", queue, body, Basic.Properties(delivery_mode=2, message_id=message_id))


async def bodies(transport: RabbitMqTransport, queue: str, want: int) -> list[bytes]:
    got: list[bytes] = []
    for _ in range(50):
        batch = await transport.receive(queue, 100, 0.2)
        got += [m.body for m in batch]
        await transport.acknowledge(batch)
        if len(got) >= want:
            break
    return got


async def underlay(transport: RabbitMqTransport) -> aiormq.Channel:
    await transport.start()
    channel = await transport.channel.get_underlay_channel()
    assert isinstance(channel, aiormq.Channel)
    return channel


async def test_each_publish_of_a_batch_is_answered_alone_and_big_bodies_arrive_whole(
    transport_and_queue: tuple[RabbitMqTransport, str],
) -> None:
    transport, queue = transport_and_queue
    big = bytes(range(256)) * 1200  # 300 KB: split over several body frames
    outcomes = await transport.publish_all(
        [
            publish(queue, b"first"),
            publish(f"missing.{uuid.uuid4().hex[:8]}", b"nowhere"),
            publish("k" * 256, b"refused"),  # longer than AMQP allows a routing key
            publish(queue, big),
            publish(queue, b"", "empty"),
            publish(queue, b"last"),
        ]
    )
    assert outcomes[0] is None and outcomes[3:] == [None, None, None], outcomes
    assert isinstance(outcomes[1], DeliveryError) and outcomes[1].message is not None
    assert isinstance(outcomes[2], MessageRefused)  # its own failure: never sent, never an outage
    assert await bodies(transport, queue, 4) == [b"first", big, b"", b"last"]
    channel = await underlay(transport)
    await asyncio.sleep(0.1)  # the acks' bookkeeping runs on the next turn of the loop
    assert not channel.message_id_delivery_tag


async def test_a_write_that_never_reached_the_socket_gives_its_delivery_tags_back(
    transport_and_queue: tuple[RabbitMqTransport, str],
) -> None:
    """A full write queue (the broker blocked the connection, say) holds the write; giving up on it
    leaves nothing registered, and the next batch's confirms match the broker's delivery tags (a
    tag not given back would leave every later publish waiting for an ack that never comes)."""
    transport, queue = transport_and_queue
    assert await transport.publish_all([publish(queue, b"before")]) == [None]
    channel = await underlay(transport)
    tag, pending = channel.delivery_tag, dict(channel.confirmations)
    real = channel.write_queue
    full: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
    full.put_nowait(object())
    channel.write_queue = full
    task = asyncio.create_task(write_batch(channel, [publish(queue, b"held") for _ in range(5)]))  # noqa: RUF006 (kept, awaited below)
    await asyncio.sleep(0.2)
    assert not task.done() and channel.delivery_tag == tag + 5
    task.cancel()
    assert isinstance((await asyncio.gather(task, return_exceptions=True))[0], asyncio.CancelledError)
    assert channel.delivery_tag == tag
    assert dict(channel.confirmations) == pending
    timed_out = await transport.publish_all([publish(queue, b"timed out") for _ in range(2)])
    assert [type(o) for o in timed_out] == [TimeoutError, TimeoutError], timed_out
    assert channel.delivery_tag == tag
    channel.write_queue = real  # the fixture's close needs none of it if an assertion failed
    assert await transport.publish_all([publish(queue, f"after{i}".encode()) for i in range(3)]) == [None] * 3
    assert await bodies(transport, queue, 4) == [b"before", b"after0", b"after1", b"after2"]


async def test_a_write_stopped_between_its_pieces_undoes_only_what_was_not_queued(
    transport_and_queue: tuple[RabbitMqTransport, str],
) -> None:
    """A big batch goes in pieces of about PIECE_BYTES: stopped while the second piece waits for
    room, the first piece's publishes stay queued and are confirmed; the rest are undone."""
    transport, queue = transport_and_queue
    channel = await underlay(transport)
    tag = channel.delivery_tag
    big = [bytes([i]) * (PIECE_BYTES * 6 // 10) for i in range(3)]  # two fill the first piece
    real = channel.write_queue
    room_for_one: asyncio.Queue[object] = asyncio.Queue(maxsize=2)
    room_for_one.put_nowait(object())
    channel.write_queue = room_for_one
    task = asyncio.create_task(write_batch(channel, [publish(queue, body) for body in big]))
    await asyncio.sleep(0.2)
    assert not task.done() and room_for_one.full()
    task.cancel()
    assert isinstance((await asyncio.gather(task, return_exceptions=True))[0], asyncio.CancelledError)
    assert channel.delivery_tag == tag + 2
    first_two = [channel.confirmations[tag + 1], channel.confirmations[tag + 2]]
    assert tag + 3 not in channel.confirmations
    room_for_one.get_nowait()  # the stand-in; then the queued piece goes out for real
    real.put_nowait(room_for_one.get_nowait())
    channel.write_queue = real
    assert [type(f) for f in await asyncio.wait_for(asyncio.gather(*first_two), 10)] == [Basic.Ack, Basic.Ack]
    assert await transport.publish_all([publish(queue, b"after")]) == [None]
    assert await bodies(transport, queue, 3) == [big[0], big[1], b"after"]
