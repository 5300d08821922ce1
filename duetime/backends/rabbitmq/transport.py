"""RabbitMQ transport (aio-pika): persistent messages, publisher confirms, ``mandatory``.

Each batch is published in one go and its confirms are awaited together, so a batch costs one
wait, not one per message. A message whose queue does not exist comes back unroutable and fails
alone (DestinationNotFound), without delaying the others. ``connect_robust`` reconnects after a
broker restart; a publish that fails meanwhile fails its message and the breakers count it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from aio_pika.exceptions import DeliveryError

from duetime.backends.rabbitmq.arrival import arrival_headers, early_by
from duetime.errors import ConfigurationError, DestinationNotFound, TransportError
from duetime.interfaces import ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers
from duetime.names import check_name
from duetime.urls import number_option, redact

QUEUE_TYPES = {"classic", "quorum"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


class RabbitMqTransport:
    """Delivers to queues on RabbitMQ through the default exchange; consumable too."""

    def __init__(self, url: str, *, queue_type: str = "classic", prefetch: int = 500) -> None:
        if queue_type not in QUEUE_TYPES:
            raise ConfigurationError(f"queue_type must be one of {sorted(QUEUE_TYPES)}, got {queue_type!r}.")
        self.url, self.queue_type, self.prefetch = url, queue_type, prefetch
        self.display = redact(url)
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._consume_channel: AbstractChannel | None = None
        self._buffers: dict[str, asyncio.Queue[AbstractIncomingMessage]] = {}
        self._in_flight: dict[str, AbstractIncomingMessage] = {}
        self.declared: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> RabbitMqTransport:
        parts = urlsplit(url)
        ours = dict(parse_qsl(parts.query))
        kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("queue_type", "prefetch")]
        plain = urlunsplit(parts._replace(query="&".join(f"{k}={v}" for k, v in kept)))
        return cls(
            plain,
            queue_type=ours.get("queue_type", "classic"),
            prefetch=int(number_option(ours, "prefetch", 500, whole=True)),
        )

    async def start(self) -> None:
        if self._connection is None:
            self._connection = await aio_pika.connect_robust(self.url, timeout=10)
            self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)

    @property
    def channel(self) -> AbstractChannel:
        if self._channel is None:
            raise ConfigurationError("The RabbitMQ transport is not started: await transport.start() first.")
        return self._channel

    async def declare(self, queue: str) -> None:
        await self.start()
        arguments: dict[str, Any] = {"x-queue-type": self.queue_type}
        await self.channel.declare_queue(check_name("queue", queue), durable=True, arguments=arguments)
        self.declared.add(queue)

    async def delete(self, queue: str) -> None:
        await self.start()
        await self.channel.queue_delete(queue)
        self.declared.discard(queue)

    def _message(self, m: DelayedMessage) -> aio_pika.Message:
        headers = outgoing_headers(m)
        return aio_pika.Message(
            m.body,
            headers=headers,  # type: ignore[arg-type]
            message_id=m.message_id,
            content_type=headers.get("content-type"),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        if not messages:
            return []
        exchange = self.channel.default_exchange
        publishes = [
            exchange.publish(self._message(m), routing_key=m.destination, mandatory=True) for m in messages
        ]
        outcomes = await asyncio.gather(*publishes, return_exceptions=True)
        results: list[Exception | None] = []
        for m, outcome in zip(messages, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                results.append(None)
            elif isinstance(outcome, DeliveryError) and outcome.message is not None:
                results.append(
                    DestinationNotFound(f"Queue {m.destination!r} does not exist (returned unroutable).")
                )
            elif isinstance(outcome, Exception):
                results.append(TransportError(f"publishing to {m.destination!r} failed: {outcome!r}"))
            else:
                raise outcome
        return results

    async def _buffer(self, queue: str) -> asyncio.Queue[AbstractIncomingMessage]:
        if queue not in self._buffers:
            await self.start()
            assert self._connection is not None
            if self._consume_channel is None:
                self._consume_channel = await self._connection.channel()
                await self._consume_channel.set_qos(prefetch_count=self.prefetch)
            buffer: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            declared = await self._consume_channel.declare_queue(queue, passive=True)
            await declared.consume(buffer.put)
            self._buffers[queue] = buffer
        return self._buffers[queue]

    async def receive(self, queue: str, max_messages: int, wait: float) -> list[ReceivedMessage]:
        buffer = await self._buffer(queue)
        taken: list[AbstractIncomingMessage] = []
        with contextlib.suppress(TimeoutError):
            taken.append(await asyncio.wait_for(buffer.get(), wait) if wait > 0 else buffer.get_nowait())
        with contextlib.suppress(asyncio.QueueEmpty):
            while len(taken) < max_messages:
                taken.append(buffer.get_nowait())
        received = []
        hold = timedelta(0)
        for incoming in taken:
            receipt = f"{queue}:{incoming.delivery_tag}"
            self._in_flight[receipt] = incoming
            raw = dict(incoming.headers or {})
            if "x-death" in raw:  # came through the native delay levels: strip their bookkeeping,
                hold = max(hold, early_by(raw, datetime.now(UTC)))  # and never hand it out early
                raw = arrival_headers(raw)
            headers = {k: _text(v) for k, v in raw.items()}
            received.append(
                ReceivedMessage(
                    queue,
                    incoming.message_id or "",
                    headers,
                    incoming.body,
                    receipt,
                    2 if incoming.redelivered else 1,
                )
            )
        if hold > timedelta(0):  # the broker's clock ran ahead of ours: wait out the difference
            await asyncio.sleep(hold.total_seconds())
        return received

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        done = 0
        for m in messages:
            incoming = self._in_flight.pop(m.receipt, None)
            if incoming is not None:
                await incoming.ack()
                done += 1
        return done

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
        self._connection = self._channel = self._consume_channel = None
        self._buffers.clear()
