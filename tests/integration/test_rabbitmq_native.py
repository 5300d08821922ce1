"""RabbitMQ native delays on the real broker: the levels, timing, catch-all, NServiceBus names,
the native/stored switch, and migration from a store into the topology."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.rabbitmq.catchall import inspect_catchall
from duetime.backends.rabbitmq.delayrouter import NATIVE, STORE, DelayRouter, StoreNotEmpty
from duetime.backends.rabbitmq.native import DelayTooLong, Names, NativeDelays, routing_key
from duetime.backends.rabbitmq.transport import RabbitMqTransport
from duetime.backends.sqlite import SqliteStore
from tests.services import RABBITMQ, REDIS_AT, require

pytestmark = pytest.mark.slow


@pytest.fixture
async def native() -> AsyncIterator[NativeDelays]:
    require(RABBITMQ)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    await transport.start()
    topology = NativeDelays(transport, "duetime")
    await topology.setup()
    yield topology
    await transport.close()


async def queue(transport: RabbitMqTransport, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await transport.declare(name)
    return name


async def collect(
    transport: RabbitMqTransport, name: str, count: int, timeout: float
) -> list[tuple[Any, datetime]]:
    """(message, arrival time) until ``count`` arrived or the deadline passed."""
    got: list[tuple[Any, datetime]] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        batch = await transport.receive(name, 500, 0.2)
        now = datetime.now(UTC)
        got += [(m, now) for m in batch]
        await transport.acknowledge(batch)
    return got


async def test_a_five_second_delay_arrives_no_earlier_and_within_two_seconds(native: NativeDelays) -> None:
    t = native.transport
    dest = await queue(t, "native5")
    sent = await native.send(dest, b"five", delay=5)
    [(message, arrived)] = await collect(t, dest, 1, 15)
    assert message.body == b"five" and message.message_id == sent.message_id
    assert sent.due_at <= arrived <= sent.due_at + timedelta(seconds=2)
    assert not any(k.startswith("x-death") or k.startswith("x-first-death") for k in message.headers)
    await t.delete(dest)


async def test_the_seeds_four_level_example_queue_by_queue() -> None:
    require(RABBITMQ)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    await transport.start()
    tag = uuid.uuid4().hex[:6]
    names = Names(f"t{tag}.level-", f"t{tag}.delivery", f"t{tag}.catchall")
    small = NativeDelays(transport, names, levels=4)
    await small.setup()
    dest = await queue(transport, "destination")
    await small.bind_destination(dest)
    channel = transport.channel
    level3 = await channel.get_exchange(names.level(3))
    # as the seed tells it: published to the level 3 exchange with 0.1.0.1.destination
    await level3.publish(
        aio_pika.Message(b"x", message_id="seed"), routing_key=routing_key(5, dest, levels=4)
    )
    await asyncio.sleep(0.5)
    depths = await small.waiting()
    assert depths[names.level(2)] == 1 and depths[names.level(3)] == 0  # bit 3 is 0: straight on
    await asyncio.sleep(4.0)  # level 2 holds it for 4 s, then level 1 (bit 0) passes it to level 0
    depths = await small.waiting()
    assert depths[names.level(2)] == 0 and depths[names.level(0)] == 1
    [(message, _)] = await collect(transport, dest, 1, 5)
    assert message.message_id == "seed"
    await small.teardown()
    await transport.delete(dest)
    await transport.close()


async def test_a_thousand_random_delays_all_arrive_where_they_should(native: NativeDelays) -> None:
    t = native.transport
    dests = [await queue(t, f"many{i}") for i in range(3)]
    rng = random.Random(3)
    now = datetime.now(UTC)
    messages = [
        DelayedMessage(
            f"r{i}", rng.choice(dests), now + timedelta(seconds=rng.uniform(0, 20)), str(i).encode()
        )
        for i in range(1000)
    ]
    results = await native.send_batch(messages, now=now)
    # A native delay counts from when RabbitMQ took the message, and the batch's delays from
    # ``now``: the time the batch took to publish (seconds, on a loaded machine) is lateness too.
    published = datetime.now(UTC) - now
    assert results == [None] * 1000
    wanted = {m.message_id: m for m in messages}
    arrived: dict[str, tuple[str, datetime]] = {}
    batches = await asyncio.gather(
        *(collect(t, dest, sum(1 for m in messages if m.destination == dest), 40) for dest in dests)
    )
    for dest, got in zip(dests, batches, strict=True):
        for message, at in got:
            assert message.message_id not in arrived
            arrived[message.message_id] = (dest, at)
    assert set(arrived) == set(wanted)
    for ident, (dest, at) in arrived.items():
        assert dest == wanted[ident].destination
        assert at >= wanted[ident].due_at - timedelta(milliseconds=5)  # never early (rounded up)
        assert at <= wanted[ident].due_at + published + timedelta(seconds=3)
    for dest in dests:
        await t.delete(dest)


async def test_over_the_maximum_is_refused_not_truncated(native: NativeDelays) -> None:
    dest = await queue(native.transport, "toolong")
    with pytest.raises(DelayTooLong, match=r"8\.5 years"):
        await native.send(dest, b"x", delay=2**28)
    await native.transport.delete(dest)


async def test_a_deleted_destination_ends_in_the_catch_all_without_blocking_others(
    native: NativeDelays,
) -> None:
    t = native.transport
    gone, alive = await queue(t, "gone"), await queue(t, "alive")
    await native.send(gone, b"lost?", delay=2, message_id=f"g-{gone}")
    await native.send(alive, b"fine", delay=3, message_id=f"a-{alive}")
    await t.delete(gone)
    [(message, _)] = await collect(t, alive, 1, 10)
    assert message.message_id == f"a-{alive}"
    listed = await inspect_catchall(native)
    assert (f"g-{gone}", gone, "waiting in the catch-all") in listed
    await t.declare(gone)
    native.bound.discard(gone)
    sent_back = await inspect_catchall(native, send_back=True)
    assert (f"g-{gone}", gone, "sent back") in sent_back
    [(message, _)] = await collect(t, gone, 1, 5)
    assert message.body == b"lost?"
    await t.delete(gone)
    await t.delete(alive)


async def test_nservicebus_names_interoperate() -> None:
    require(RABBITMQ)
    transport = RabbitMqTransport.from_url(RABBITMQ)
    await transport.start()
    nsb = NativeDelays(transport, "nsb-v2")
    await nsb.setup()
    assert await nsb.verify() == []
    dest = await queue(transport, "NsbEndpoint")
    await nsb.send(dest, b"from python", delay=1, message_id="py")
    # what an NServiceBus endpoint publishes: the full 28-bit key to nsb.v2.delay-level-27
    level27 = await transport.channel.get_exchange("nsb.v2.delay-level-27")
    await level27.publish(aio_pika.Message(b"from nsb", message_id="nsb"), routing_key=routing_key(2, dest))
    got = await collect(transport, dest, 2, 10)
    assert sorted(m.message_id for m, _ in got) == ["nsb", "py"]
    await transport.delete(dest)
    await transport.close()


async def test_one_call_routes_natively_or_to_the_store_and_the_store_can_be_retired(
    native: NativeDelays, tmp_path: Path
) -> None:
    t = native.transport
    dest = await queue(t, "both")
    store = SqliteStore.from_url(f"sqlite:///{tmp_path / 's.db'}")
    await store.setup_infrastructure("both")
    await store.initialize("both", TransactionMode.AT_LEAST_ONCE)
    router = DelayRouter(native, store, native_up_to=timedelta(seconds=2))
    assert await router.schedule(dest, b"short", delay=1, message_id="short") == NATIVE
    assert await router.schedule(dest, b"long", delay=3, message_id="long") == STORE
    with pytest.raises(StoreNotEmpty):
        await router.retire_store()
    dispatcher = Dispatcher(store, t, DelayedDeliverySettings(), endpoint="both")
    task = asyncio.create_task(dispatcher.run())
    got = await collect(t, dest, 2, 15)
    dispatcher.stop()
    await task
    assert sorted(m.message_id for m, _ in got) == ["long", "short"]
    await router.retire_store()
    assert not router.store_enabled
    assert await router.schedule(dest, b"later", delay=3600 * 24 * 365, message_id="year") == NATIVE
    await store.close()
    await t.delete(dest)


async def test_a_message_arriving_before_its_due_time_is_held_until_then(native: NativeDelays) -> None:
    t = native.transport
    dest = await queue(t, "skew")
    now = datetime.now(UTC)
    message = DelayedMessage("skewed", dest, now + timedelta(seconds=3), b"x")
    # a sender whose clock runs 2 s ahead computes a 1 s delay for a message due in 3 s
    assert await native.send_batch([message], now=now + timedelta(seconds=2)) == [None]
    [(got, arrived)] = await collect(t, dest, 1, 10)
    assert arrived >= message.due_at
    assert "x-death" not in got.headers
    await t.delete(dest)


def test_the_rabbitmq_commands(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    require(RABBITMQ)
    for _ in range(2):  # idempotent
        done = run_cli("rabbitmq", "setup", "--url", RABBITMQ, cwd=tmp_path)
        assert done.returncode == 0 and "28 levels" in done.stdout, done.stderr
    verified = run_cli("rabbitmq", "verify", "--url", RABBITMQ, cwd=tmp_path)
    assert verified.returncode == 0 and "complete" in verified.stdout
    status = run_cli("rabbitmq", "status", "--json", cwd=tmp_path, env={"DUETIME_TRANSPORT": RABBITMQ})
    assert status.returncode == 0 and all(isinstance(n, int) for n in json.loads(status.stdout).values())
    parked = run_cli(
        "rabbitmq", "catchall", "--json", "--limit", "5", cwd=tmp_path, env={"DUETIME_TRANSPORT": RABBITMQ}
    )
    assert parked.returncode == 0, parked.stderr
    assert all(
        {"id", "destination", "what_happened"} == set(json.loads(line)) for line in parked.stdout.splitlines()
    )
    too_long = run_cli("rabbitmq", "send", "nowhere", "x", "--in", "3200d", "--url", RABBITMQ, cwd=tmp_path)
    assert too_long.returncode == 1 and "8.5 years" in too_long.stderr
    # wrong names (was a stack of aio-pika's "Event loop is closed" after the line) and a URL that
    # is not RabbitMQ's (was an internal error): one line each, before connecting
    for args, said in [
        (["verify", "--url", RABBITMQ, "--names", "bogus"], "names must be one of"),
        (["setup", "--url", f"sqlite:///{tmp_path / 'x.db'}"], "is not a RabbitMQ URL"),
        (["status"], "is not a RabbitMQ URL"),
    ]:
        wrong = run_cli("rabbitmq", *args, cwd=tmp_path, env={"DUETIME_TRANSPORT": f"redis://{REDIS_AT}/0"})
        assert wrong.returncode == 1, wrong.stderr
        [line] = wrong.stderr.strip().splitlines()
        assert said in line, line
    store = f"sqlite:///{tmp_path / 'r.db'}"
    assert run_cli("setup", "--store", store, "--endpoint", "shop", cwd=tmp_path).returncode == 0
    assert (
        run_cli(
            "schedule", "orders", "x", "--in", "1h", "--store", store, "--endpoint", "shop", cwd=tmp_path
        ).returncode
        == 0
    )
    refused = run_cli(
        "rabbitmq", "retire-store", "--store", store, "--endpoint", "shop", "--url", RABBITMQ, cwd=tmp_path
    )
    assert refused.returncode == 1 and "still holds 1" in refused.stderr
    empty = f"sqlite:///{tmp_path / 'e.db'}"
    assert run_cli("setup", "--store", empty, "--endpoint", "quiet", cwd=tmp_path).returncode == 0
    retired = run_cli(
        "rabbitmq", "retire-store", "--store", empty, "--endpoint", "quiet", "--url", RABBITMQ, cwd=tmp_path
    )
    assert retired.returncode == 0 and "can be retired" in retired.stdout, retired.stderr
