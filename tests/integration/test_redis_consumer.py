"""A Redis stream consumer on the shared Redis: a receive is one round trip (its acknowledgements
and its read in one pipeline), and what a consumer took and left is still taken back by another
after the visibility timeout, a receive already waiting included."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from duetime import DelayedMessage
from duetime.backends.redis import RedisTransport
from tests.services import REDIS, require


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """Keys of the test's own on the shared Redis, removed after."""
    import redis.asyncio as aioredis

    require(REDIS)
    name = f"duetime-consumer-{uuid.uuid4().hex[:8]}:"
    yield name
    client = aioredis.Redis.from_url(REDIS)
    keys = [k async for k in client.scan_iter(match=f"{name}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def opened(prefix: str, visibility: float = 30.0) -> RedisTransport:
    transport = RedisTransport.from_url(f"{REDIS}?prefix={prefix}&visibility_timeout={visibility}")
    await transport.start()
    await transport.declare("orders")
    return transport


def batch(*numbers: int) -> list[DelayedMessage]:
    return [DelayedMessage.create("orders", f"b{n}".encode(), delay=0, message_id=f"m-{n}") for n in numbers]


async def test_a_receive_is_one_round_trip_and_looks_for_abandoned_entries_once_a_second(prefix: str) -> None:
    transport = await opened(prefix)
    calls: list[str] = []
    client: Any = transport.redis
    real_pipeline, real_autoclaim = client.pipeline, client.xautoclaim

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        calls.append("pipeline")
        return real_pipeline(*args, **kwargs)

    async def xautoclaim(*args: Any, **kwargs: Any) -> Any:
        calls.append("xautoclaim")
        return await real_autoclaim(*args, **kwargs)

    client.pipeline, client.xautoclaim = pipeline, xautoclaim
    try:
        await transport.send_batch(batch(1, 2, 3))
        calls.clear()
        first = await transport.receive("orders", 1, 0)
        second = await transport.receive("orders", 1, 0, done=first)
        third = await transport.receive("orders", 5, 0, done=second)
        assert [m.message_id for m in first + second + third] == ["m-1", "m-2", "m-3"]
        # the first receive looks for abandoned entries; the next two are one pipeline each,
        # their acknowledgements in it
        assert calls == ["xautoclaim", "pipeline", "pipeline", "pipeline"], calls
        assert [m.message_id for m in await transport.peek("orders", 10)] == ["m-3"]
        await transport.receive("orders", 5, 0, done=third)
        assert await transport.peek("orders", 10) == []
    finally:
        client.pipeline, client.xautoclaim = real_pipeline, real_autoclaim
        await transport.close()


async def test_what_a_consumer_took_and_left_reaches_one_already_waiting(prefix: str) -> None:
    """The second consumer is waiting (a long receive) before the first one's entry has been
    left for the visibility timeout; it takes it soon after, within its wait."""
    gone, waiting = await opened(prefix, visibility=0.6), await opened(prefix, visibility=0.6)
    try:
        await gone.send_batch(batch(1))
        [taken] = await gone.receive("orders", 10, 0)
        await gone.close()  # went away without acknowledging
        await waiting.receive("orders", 10, 0)  # its first look: too soon, nothing to take back
        started = time.monotonic()
        again = await asyncio.wait_for(waiting.receive("orders", 10, 5.0), 10)
        assert [m.message_id for m in again] == [taken.message_id]
        assert time.monotonic() - started < 1.5, "taken back within a look of the visibility's end"
        await waiting.acknowledge(again)
        assert await waiting.peek("orders", 10) == []
    finally:
        await waiting.close()


async def test_acknowledging_many_of_several_queues_counts_each_once(prefix: str) -> None:
    transport = await opened(prefix)
    try:
        await transport.declare("invoices")
        other = DelayedMessage.create("invoices", b"i", delay=0, message_id="i-1")
        await transport.send_batch([*batch(1, 2), other])
        got = await transport.receive("orders", 10, 0) + await transport.receive("invoices", 10, 0)
        assert await transport.acknowledge(got) == 3
        assert await transport.acknowledge(got) == 0  # already gone
    finally:
        await transport.close()


@pytest.mark.parametrize("wait", [False, True])
async def test_a_server_that_does_not_know_the_send_script_is_given_it(
    prefix: str, wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is sent by the script's SHA1; a server new to it (restarted, or another text of it)
    answers NOSCRIPT, is given the text and asked again, and the batch goes once."""
    import hashlib

    from duetime.backends.redis import transport as module

    text = f"{module.SEND}\n-- {uuid.uuid4().hex}"  # a text no server has seen
    monkeypatch.setattr(module, "SEND", text)
    monkeypatch.setattr(module, "SEND_SHA", hashlib.sha1(text.encode()).hexdigest())
    options = "&wait=1&wait_timeout=50" if wait else ""  # WAIT in a pipeline beside the script
    transport = RedisTransport.from_url(f"{REDIS}?prefix={prefix}{options}")
    await transport.start()
    try:
        await transport.declare("orders")
        sent = await transport.send_batch(batch(1, 2))
        assert sent == [None, None] if not wait else all(isinstance(r, Exception) for r in sent), sent
        assert [m.message_id for m in await transport.peek("orders", 10)] == ["m-1", "m-2"]
    finally:
        await transport.close()
