"""RabbitMQ native delays: send rate beside raw publish-with-confirms, and lateness.

    .venv/bin/python bench/native_bench.py             # 20,000 sends, 2,000 timed deliveries
    .venv/bin/python bench/native_bench.py --quick

Every send loop publishes on one channel with confirms, 1,000 publishes in flight per batch: raw
aio-pika (which waits for each frame's flush), raw aiormq with the frames pipelined (the fastest this
client publishes safely: the baseline), and duetime's native send, which pipelines
the same way.
Lateness: messages due at random (fractional) times 1-12 s ahead; arrival minus the requested due
time, which includes the round-up to whole seconds and the hops between levels.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiormq

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.raw_amqp import aio_pika_rate, aiormq_rate
from duetime import DelayedMessage
from duetime.backends.rabbitmq.native import Names, NativeDelays, delay_seconds, first_level, routing_key
from duetime.backends.rabbitmq.transport import RabbitMqTransport

URL = os.environ.get("DUETIME_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")


async def underlay(transport: RabbitMqTransport) -> aiormq.Channel:
    """The transport's own aiormq channel, as duetime publishes on it."""
    channel = await transport.channel.get_underlay_channel()
    assert isinstance(channel, aiormq.Channel)
    return channel


async def native_rate(native: NativeDelays, queue: str, total: int) -> float:
    due = datetime.now(UTC) + timedelta(hours=1)
    start = time.perf_counter()
    for offset in range(0, total, 1000):
        batch = [
            DelayedMessage(f"n{offset + i}", queue, due, b"x" * 100) for i in range(min(1000, total - offset))
        ]
        results = await native.send_batch(batch)
        assert all(r is None for r in results), results[:3]
    return total / (time.perf_counter() - start)


async def lateness(native: NativeDelays, queue: str, total: int) -> list[float]:
    rng = random.Random(5)
    now = datetime.now(UTC)
    messages = [
        DelayedMessage(f"l{i}", queue, now + timedelta(seconds=rng.uniform(1, 12)), b"") for i in range(total)
    ]
    due = {m.message_id: m.due_at for m in messages}
    assert all(r is None for r in await native.send_batch(messages, now=now))
    late: list[float] = []
    deadline = time.monotonic() + 40
    while len(late) < total and time.monotonic() < deadline:
        got = await native.transport.receive(queue, 500, 0.2)
        arrived = datetime.now(UTC)
        late += [(arrived - due[m.message_id]).total_seconds() * 1000 for m in got]
        await native.transport.acknowledge(got)
    assert len(late) == total, f"{len(late)} of {total} arrived"
    return late


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sends, timed = (4000, 500) if args.quick else (20_000, 2000)
    transport = RabbitMqTransport(URL)
    await transport.start()
    tag = uuid.uuid4().hex[:6]
    native = NativeDelays(
        transport, Names(f"bench{tag}.level-", f"bench{tag}.delivery", f"bench{tag}.catchall")
    )
    await native.setup()
    raw_q, native_q, late_q = (f"bench-{tag}-{k}" for k in ("raw", "native", "late"))
    for q in (raw_q, native_q, late_q):
        await transport.declare(q)
    quorum_q = f"bench-{tag}-quorum"
    await transport.channel.declare_queue(quorum_q, durable=True, arguments={"x-queue-type": "quorum"})
    try:
        raw = await aio_pika_rate(transport.channel, sends, 1000, raw_q)
        quorum = await aio_pika_rate(transport.channel, sends, 1000, quorum_q)
        piped = await aiormq_rate(await underlay(transport), sends, 1000, raw_q)
        piped_quorum = await aiormq_rate(await underlay(transport), sends, 1000, quorum_q)
        seconds = delay_seconds(timedelta(hours=1))
        first = first_level(seconds)
        assert first is not None
        await native.bind_destination(native_q)
        levels = await aiormq_rate(
            await underlay(transport), sends, 1000, routing_key(seconds, native_q), native.names.level(first)
        )
        ours = await native_rate(native, native_q, sends)
        print(f"raw aio-pika publish with confirms, classic queue   {raw:10,.0f} msg/s")
        print(f"raw aio-pika publish with confirms, quorum queue    {quorum:10,.0f} msg/s")
        print(f"raw aiormq pipelined with confirms, classic queue   {piped:10,.0f} msg/s")
        print(f"raw aiormq pipelined with confirms, quorum queue    {piped_quorum:10,.0f} msg/s")
        print(f"raw aiormq pipelined into the delay levels (1 h)    {levels:10,.0f} msg/s")
        print(
            f"native delayed send (1 h, into the delay levels)    {ours:10,.0f} msg/s   "
            f"ratio {ours / levels:.2f} to the same route, {ours / piped_quorum:.2f} to a quorum queue"
        )
        late = sorted(await lateness(native, late_q, timed))
        q = statistics.quantiles(late, n=100)
        print(
            f"lateness of {timed:,} native delays (arrival - requested due): p50 {q[49]:.0f} ms  "
            f"p99 {q[98]:.0f} ms  max {late[-1]:.0f} ms  min {late[0]:.0f} ms (early: {sum(1 for x in late if x < 0)})"
        )
    finally:
        await native.teardown(force=True)
        for q in (raw_q, native_q, late_q, quorum_q):
            await transport.delete(q)
        await transport.close()


if __name__ == "__main__":
    asyncio.run(main())
