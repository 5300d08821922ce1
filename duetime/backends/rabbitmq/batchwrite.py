"""A batch of publishes written to the socket as one frame buffer, each with its own confirm.

aiormq's ``basic_publish`` costs, per message, a task, the channel's lock, a timeout context, a
put on the connection's write queue and a socket write of its own; in the dispatcher that made
duetime's send 0.72-0.85x the raw aiormq loop, the ceiling the benchmarks measure against. Here a batch
takes the lock once, registers each message's confirm exactly as ``basic_publish`` does (the
channel's delivery tag, its ``confirmations`` and ``message_id_delivery_tag`` maps, so aiormq's own
reader resolves acks, nacks and returns and rejects everything when the channel closes), and puts
every frame on the write queue in one piece (pieces of about a megabyte for big batches): one
write, one wake-up of the writer.

This leans on attributes of the concrete ``aiormq.Channel`` that ``basic_publish`` itself uses,
not on its abstract interface: hence aiormq below 8 in ``pyproject.toml``, the exact version in
``constraints.txt``, and the transport's tests of acks, returns, timeouts and a cut connection.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import aiormq
from aiormq.abc import ChannelFrame
from aiormq.exceptions import ChannelInvalidStateError
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

#: AMQP's limit on a routing key (a short string).
MAX_ROUTING_KEY = 255


@dataclass(frozen=True, slots=True)
class Publish:
    """One message to publish: where to, and what."""

    exchange: str
    routing_key: str
    body: bytes
    properties: Basic.Properties


#: A batch goes to the write queue in pieces of about this many body bytes: big messages are not
#: all copied into one buffer, and the socket gets the first piece while the rest is marshalled.
PIECE_BYTES = 1 << 20


async def write_batch(channel: aiormq.Channel, publishes: Sequence[Publish]) -> list[asyncio.Future[object]]:
    """Queue every publish (persistent as its properties say, ``mandatory``; routing keys of at
    most MAX_ROUTING_KEY bytes) in as few writes as its size allows: one below PIECE_BYTES. One
    future per publish, in order, settled by the broker's ack, or failed by its nack, by the
    message coming back unroutable, or by the channel closing. Cancelled or failed part way, the
    publishes not yet queued are undone (their delivery tags given back, their futures
    cancelled); those queued go out and are settled as usual."""
    if not channel.publisher_confirms:
        raise ValueError("write_batch needs a channel with publisher confirms")
    confirmations: list[asyncio.Future[object]] = []
    async with channel.lock:
        if channel.is_closed:
            raise ChannelInvalidStateError(f"{channel!r} is closed")
        first = queued = channel.delivery_tag  # queued: the last tag whose frames are on the queue
        frames: list[object] = []
        piece = 0
        try:
            for number, p in enumerate(publishes, start=1):
                channel.delivery_tag += 1
                tag = channel.delivery_tag
                message_id = p.properties.message_id or uuid.uuid4().hex
                p.properties.message_id = message_id
                confirmation = channel.create_future()
                channel.confirmations[tag] = confirmation
                channel.message_id_delivery_tag[message_id] = tag
                confirmation.add_done_callback(functools.partial(_forget, channel, message_id, tag))
                confirmations.append(confirmation)
                frames.append(Basic.Publish(exchange=p.exchange, routing_key=p.routing_key, mandatory=True))
                frames.append(ContentHeader(properties=p.properties, body_size=len(p.body)))
                frames.extend(_body_frames(p.body, channel.max_content_size))
                piece += len(p.body)
                if piece >= PIECE_BYTES or number == len(publishes):
                    payload = ChannelFrame.marshall(channel_number=channel.number, frames=frames)  # type: ignore[arg-type]
                    await channel.write_queue.put(payload)
                    queued, frames, piece = tag, [], 0
        except BaseException:  # the rest never reached the write queue: undo it
            channel.delivery_tag = queued
            for undone, confirmation in enumerate(confirmations, start=first + 1):
                if undone > queued:
                    channel.confirmations.pop(undone, None)
                    confirmation.cancel()
            raise
    return confirmations


def _body_frames(body: bytes, size: int) -> list[ContentBody]:
    """The body in frames no bigger than the connection's negotiated frame size allows."""
    return [ContentBody(body[i : i + size]) for i in range(0, len(body), size)]


def _forget(channel: aiormq.Channel, message_id: str, tag: int, _: object) -> None:
    """Drop a settled publish's message id from the map returns are matched by (as aiormq does)."""
    if channel.message_id_delivery_tag.get(message_id) == tag:
        del channel.message_id_delivery_tag[message_id]
