"""Brokers: PostgreSQL -> RabbitMQ dispatch, and front-door ingestion, beside raw aio-pika/psycopg.

    .venv/bin/python bench/broker_bench.py          # 20,000 messages
    .venv/bin/python bench/broker_bench.py --quick  # 5,000

Aims: dispatch from PostgreSQL into RabbitMQ >= 0.8x the raw publish-with-confirms rate
of the same client library; front-door ingestion likewise beside a raw consume-insert-ack loop.
The raw limit is aiormq with the batch's frames written without waiting for
each flush (aio-pika's publish waits), confirms awaited together; both baselines are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import aiormq
import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.raw_amqp import aio_pika_rate, aiormq_rate
from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, FrontDoor, TransactionMode
from duetime.backends.postgres import PostgresStore, SyncPostgresStore
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.nservicebus.frontdoor import envelope_headers, front_door_queue

PG = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
AMQP = os.environ.get("DUETIME_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
SCHEMA = "duetime_broker_bench"
URL = f"{PG}?schema={SCHEMA}"


def reset_pg() -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    s = SyncPostgresStore.from_url(URL)
    s.setup_infrastructure("bench")
    s.close()


def messages(n: int, queue: str) -> list[DelayedMessage]:
    past = datetime.now(UTC) - timedelta(minutes=5)
    return [DelayedMessage(f"b{i:08d}", queue, past, b"x" * 100, {"k": "v"}) for i in range(n)]


async def raw_publish(n: int, queue: str, batch: int) -> float:
    """aio-pika publish with confirms and mandatory, a batch's confirms awaited together."""
    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    rate = await aio_pika_rate(channel, n, batch, queue, headers={"k": "v"})
    await connection.close()
    return rate


async def raw_aiormq(n: int, queue: str, batch: int) -> float:
    """aiormq, a batch's frames pipelined and its confirms awaited together."""
    connection = await aiormq.connect(AMQP)
    channel = await connection.channel(publisher_confirms=True)
    rate = await aiormq_rate(channel, n, batch, queue, headers={"k": "v"})
    await connection.close()
    return rate


async def transport_publish(n: int, queue: str, batch: int) -> float:
    """duetime's RabbitMQ transport alone: send_batch of ``batch`` messages, no store."""
    every = messages(n, queue)
    batches = [every[i : i + batch] for i in range(0, n, batch)]
    transport = RabbitMqTransport.from_url(AMQP)
    await transport.start()
    started = time.perf_counter()
    for each in batches:
        results = await transport.send_batch(each)
        assert results == [None] * len(each), results[:3]
    elapsed = time.perf_counter() - started
    await transport.close()
    return n / elapsed


async def purge(queue: str) -> None:
    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel()
    declared = await channel.declare_queue(queue, passive=True)
    await declared.purge()
    await connection.close()


async def duetime_dispatch(n: int, queue: str) -> float:
    store = SyncPostgresStore.from_url(URL)
    store.initialize("bench", TransactionMode.AT_LEAST_ONCE)
    for i in range(0, n, 50_000):
        store.store_many(messages(n, queue)[i : i + 50_000])
    store.close()
    astore, transport = PostgresStore.from_url(URL), RabbitMqTransport.from_url(AMQP)
    dispatcher = Dispatcher(astore, transport, DelayedDeliverySettings(batch_size=100), endpoint="bench")
    await dispatcher.start()
    started = time.perf_counter()
    stats = await dispatcher.run_burst()
    elapsed = time.perf_counter() - started
    assert stats.forwarded == n, stats
    await astore.close()
    await transport.close()
    return n / elapsed


async def fill_front_door(n: int, endpoint: str) -> None:
    transport = RabbitMqTransport.from_url(AMQP)
    await transport.declare(front_door_queue(endpoint))
    later = datetime.now(UTC) + timedelta(hours=1)
    batch = [
        DelayedMessage(
            f"f{i:08d}",
            front_door_queue(endpoint),
            later,
            b"x" * 100,
            envelope_headers("orders", later, {"k": "v"}),
        )
        for i in range(n)
    ]
    for i in range(0, n, 500):
        assert await transport.send_batch(batch[i : i + 500]) == [None] * len(batch[i : i + 500])
    await transport.close()


async def raw_ingest(n: int, queue: str) -> float:
    """Baseline front door: consume (prefetch 500), insert a batch with executemany, ack it."""
    connection = await aio_pika.connect_robust(AMQP)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)
    q = await channel.declare_queue(queue, passive=True)
    table = f'"{SCHEMA}"."bench.delayed"'
    done = 0
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(PG, autocommit=True) as conn, q.iterator() as it:
        pending: list[aio_pika.abc.AbstractIncomingMessage] = []
        async for incoming in it:
            pending.append(incoming)
            if len(pending) >= 100 or done + len(pending) >= n:
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.executemany(
                        f"INSERT INTO {table} (message_id, destination, due_at, headers, body) VALUES (%s, %s, %s, %s, %s)",
                        [
                            (m.message_id, "orders", datetime.now(UTC), json.dumps({"k": "v"}), m.body)
                            for m in pending
                        ],
                    )
                for m in pending:
                    await m.ack()
                done += len(pending)
                pending = []
                if done >= n:
                    break
    elapsed = time.perf_counter() - started
    await connection.close()
    return n / elapsed


async def duetime_ingest(n: int, endpoint: str) -> float:
    store, transport = PostgresStore.from_url(URL), RabbitMqTransport.from_url(AMQP)
    await store.setup_infrastructure(endpoint)
    dispatcher = Dispatcher(store, transport, DelayedDeliverySettings(batch_size=100), endpoint=endpoint)
    await dispatcher.start()
    door = FrontDoor(dispatcher, transport, wait=0.5)
    await door.start()
    started = time.perf_counter()
    while door.stored < n:
        await door.process_once()
    elapsed = time.perf_counter() - started
    await store.close()
    await transport.close()
    return n / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    n = 5_000 if parser.parse_args().quick else 20_000
    queue = f"bench.orders.{uuid.uuid4().hex[:6]}"
    setup = RabbitMqTransport.from_url(AMQP)
    await setup.declare(queue)
    print(f"broker bench: {n} messages of 100 bytes; RabbitMQ {AMQP.split('@')[-1]}, PostgreSQL\n")
    print("dispatch PostgreSQL -> RabbitMQ (persistent, confirms, mandatory; batches of 100; best of 2)")
    raw = max([await raw_publish(n, queue, 100) for _ in range(2)])
    await purge(queue)
    limit = max([await raw_aiormq(n, queue, 100) for _ in range(2)])
    await purge(queue)
    alone = max([await transport_publish(n, queue, 100) for _ in range(2)])
    await purge(queue)
    ours = 0.0
    for _ in range(2):
        reset_pg()
        ours = max(ours, await duetime_dispatch(n, queue))
        await purge(queue)
    print(f"  raw aio-pika publish with confirms   {raw:10,.0f} msg/s")
    print(f"  raw aiormq, frames pipelined         {limit:10,.0f} msg/s")
    print(
        f"  duetime transport alone (send_batch) {alone:10,.0f} msg/s   ratio {alone / limit:.2f} to aiormq"
    )
    print(
        f"  duetime dispatch                     {ours:10,.0f} msg/s   "
        f"ratio {ours / raw:.2f} to aio-pika, {ours / limit:.2f} to aiormq\n"
    )
    print("front door: <endpoint>.Timeouts -> PostgreSQL store, acknowledged after commit")
    reset_pg()
    await fill_front_door(n, "rawdoor")
    raw_i = await raw_ingest(n, "rawdoor.Timeouts")
    reset_pg()
    await fill_front_door(n, "door")
    ours_i = await duetime_ingest(n, "door")
    print(f"  raw consume-insert-ack loop          {raw_i:10,.0f} msg/s")
    print(f"  duetime front door                   {ours_i:10,.0f} msg/s   ratio {ours_i / raw_i:.2f}")
    for name in (queue, "rawdoor.Timeouts", "door.Timeouts", "error"):
        await setup.delete(name)
    await setup.channel.exchange_delete("door.Timeouts")  # the front door's NServiceBus exchange
    await setup.close()
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


if __name__ == "__main__":
    asyncio.run(main())
