"""``wait=N`` on the shared Redis, which has no replica: every write is told it was not replicated
after ``wait_timeout``, and nothing is lost or changed for it. A producer's ``schedule`` raises
``NotReplicated`` (the message is on the master: sent again with the same id it is a duplicate);
the transport reports the batch unavailable, so the dispatcher keeps it and sends it again."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

import duetime
from duetime import DelayedMessage, DestinationUnavailable, DuplicateMessageId, NotReplicated
from duetime.backends.redis import RedisTransport
from duetime.errors import TransportUnavailable
from tests.services import REDIS, require


@pytest.fixture
def prefix() -> Iterator[str]:
    """Keys of the test's own on the shared Redis, removed after."""
    import redis

    require(REDIS)
    name = f"duetime-wait-{uuid.uuid4().hex[:8]}:"
    yield name
    with redis.Redis.from_url(REDIS) as client:
        for key in client.scan_iter(f"{name}*"):
            client.delete(key)


def test_a_schedule_no_replica_confirmed_raises_and_the_message_is_kept(prefix: str) -> None:
    url = f"{REDIS}?prefix={prefix}&wait=1&wait_timeout=150"
    with duetime.connect_sync(url, endpoint="shop") as client:
        started = time.monotonic()
        with pytest.raises(
            NotReplicated, match=r"only 0 of the 1 replica\(s\) asked for \(wait=1\).* 150 ms"
        ):
            client.schedule("orders", b"\x00\xffkept", delay=60, message_id="m-1")
        assert 0.14 < time.monotonic() - started < 5
        with pytest.raises(DuplicateMessageId):  # sent again with the same id: it was kept
            client.schedule("orders", b"\x00\xffkept", delay=60, message_id="m-1")
        kept = client.get("m-1")
        assert kept is not None and kept.body == b"\x00\xffkept"


def test_a_batch_no_replica_confirmed_is_an_outage_not_a_failure(prefix: str) -> None:
    async def go() -> list[Exception | None]:
        transport = RedisTransport.from_url(f"{REDIS}?prefix={prefix}&wait=1&wait_timeout=100")
        await transport.start()
        try:
            await transport.declare("orders")
            batch = [DelayedMessage.create("orders", b"x", delay=0, message_id=f"m-{i}") for i in range(3)]
            return await transport.send_batch(batch)
        finally:
            await transport.close()

    results = asyncio.run(go())
    assert len(results) == 3
    for outcome in results:
        # an outage of the destination (breaker, back-off, sent again), never the error queue
        assert isinstance(outcome, TransportUnavailable | DestinationUnavailable), outcome
        assert "only 0 of the 1 replica(s)" in str(outcome)
