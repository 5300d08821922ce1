"""The raw RabbitMQ publish loops the broker benches measure duetime against, written once.

Both publish persistent 100-byte messages, mandatory, with publisher confirms, a batch at a time with
the batch's confirms awaited together. aio-pika's ``publish`` waits for each frame to be flushed
before the next is queued; aiormq with ``wait=False`` writes a batch's frames back to back, the
fastest this client publishes safely (the baseline).
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from pamqp.commands import Basic

BODY = b"x" * 100


async def aio_pika_rate(
    channel: AbstractChannel, total: int, batch: int, queue: str, headers: dict[str, str] | None = None
) -> float:
    """Messages per second through aio-pika's default exchange into ``queue``."""
    started = time.perf_counter()
    for first in range(0, total, batch):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(
                        BODY,
                        headers=headers,
                        message_id=f"raw{i}",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=queue,
                    mandatory=True,
                )
                for i in range(first, min(total, first + batch))
            )
        )
    return total / (time.perf_counter() - started)


async def aiormq_rate(
    channel: aiormq.abc.AbstractChannel,
    total: int,
    batch: int,
    routing_key: str,
    exchange: str = "",
    headers: dict[str, str] | None = None,
) -> float:
    """Messages per second through aiormq, frames pipelined: into the queue ``routing_key`` by the
    default exchange, or through ``exchange`` (the delay levels, as a native send routes)."""
    started = time.perf_counter()
    for first in range(0, total, batch):
        await asyncio.gather(
            *(
                channel.basic_publish(
                    BODY,
                    exchange=exchange,
                    routing_key=routing_key,
                    mandatory=True,
                    wait=False,
                    properties=Basic.Properties(delivery_mode=2, message_id=f"piped{i}", headers=headers),
                )
                for i in range(first, min(total, first + batch))
            )
        )
    return total / (time.perf_counter() - started)
