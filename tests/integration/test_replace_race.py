"""A replace racing a dispatch, on every store and its delivery paths: each answer is the truth.

Producers replace messages at about their due time while a dispatcher forwards them. "replaced"
means only the new content is delivered; a refusal (MessageInFlight) means only the old one; and
"stored" (the old one had gone already) means the old one and then the new one. Nothing is lost,
nothing is doubled, and each content goes out with its own due time.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import duetime
from duetime.errors import MessageInFlight
from duetime.interfaces import IfExists, ReplacingStore
from duetime.settings import DelayedDeliverySettings, TransactionMode
from tests.services import REDIS, delete_redis_keys, require, store_url

MESSAGES = 240
#: The messages fall due over this long; each is replaced within REACH of its due time.
SPREAD = timedelta(seconds=2)
REACH = timedelta(milliseconds=60)

CASES = [
    ("sqlite", TransactionMode.EXACTLY_ONCE),
    ("postgresql", TransactionMode.EXACTLY_ONCE),
    ("postgresql", TransactionMode.AT_LEAST_ONCE),
    ("mariadb", TransactionMode.AT_LEAST_ONCE),
    ("redis", TransactionMode.AT_LEAST_ONCE),
]


@pytest.fixture
def transport_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The store's own queue where it has one; a Redis queue of the test's own elsewhere."""
    kind, _ = request.node.callspec.params["case"]
    if kind in ("sqlite", "postgresql"):
        yield None
        return
    require(REDIS)
    prefix = f"race-{uuid.uuid4().hex[:8]}:"
    try:
        yield f"{REDIS}?prefix={prefix}"
    finally:
        delete_redis_keys(prefix)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{k}-{m.value}" for k, m in CASES])
async def test_each_answer_of_a_replace_racing_a_dispatch_is_what_is_delivered(
    case: tuple[str, TransactionMode], transport_url: str | None, tmp_path: Path
) -> None:
    kind, mode = case
    with store_url(kind, tmp_path) as url:
        store = duetime.open_store(url)
        producer_store = duetime.open_store(url)  # the producers' own connections
        transport = duetime.open_transport(transport_url or url)
        try:
            await store.setup_infrastructure("race")
            await producer_store.initialize("race", TransactionMode.AT_LEAST_ONCE)
            await transport.start()
            await transport.declare("race")
            start = datetime.now().astimezone() + timedelta(seconds=1)
            old = [
                duetime.DelayedMessage(f"r-{i:04d}", "race", start + SPREAD * i / MESSAGES, b"old")
                for i in range(MESSAGES)
            ]
            await producer_store.store_many(old)
            settings = DelayedDeliverySettings(transaction_mode=mode)
            async with duetime.Service(store, transport, settings, endpoint="race"):
                answers = await _replace_around_due_times(producer_store, old)
                wanted = len(old) + sum(a == "stored" for a in answers.values())
                got = await _receive_all(transport, wanted)
        finally:
            await transport.close()
            await producer_store.close()
            await store.close()
    delivered: dict[str, list[bytes]] = defaultdict(list)
    due_of = {m.message_id: m.due_at for m in old}
    for message_id, body, due_header in got:
        delivered[message_id].append(body)
        # the due time delivered is the content's own: a replace moved it with the body
        moved = timedelta(milliseconds=100) if body == b"new" else timedelta(0)
        assert datetime.fromisoformat(due_header) == due_of[message_id] + moved, message_id
    expected = {"replaced": [b"new"], "refused": [b"old"], "stored": [b"old", b"new"]}
    for message in old:
        answer = answers[message.message_id]
        assert delivered[message.message_id] == expected[answer], (message.message_id, answer)
    seen = {a: sum(v == a for v in answers.values()) for a in expected}
    assert 0 < seen["replaced"] < MESSAGES, seen  # the race was run on both sides of the dispatch
    assert sum(seen.values()) == MESSAGES


async def _replace_around_due_times(store: Any, old: list[duetime.DelayedMessage]) -> dict[str, str]:
    """Replace each message at a moment within REACH of its due time, eight calls at a time."""
    assert isinstance(store, ReplacingStore)
    answers: dict[str, str] = {}
    rng = random.Random(7)
    loop = asyncio.get_running_loop()

    lanes = asyncio.Semaphore(8)

    async def replace(message: duetime.DelayedMessage, moment: datetime) -> None:
        await asyncio.sleep(max(0.0, (moment - datetime.now().astimezone()).total_seconds()))
        newer = message.with_changes(body=b"new", due_at=message.due_at + timedelta(milliseconds=100))
        async with lanes:
            try:
                answers[message.message_id] = (await store.put(newer, IfExists.REPLACE)).outcome
            except MessageInFlight:
                answers[message.message_id] = "refused"

    started = loop.time()
    await asyncio.gather(*(replace(m, m.due_at + REACH * rng.uniform(-1, 1)) for m in old))
    assert loop.time() - started < 30
    return answers


async def _receive_all(transport: Any, wanted: int) -> list[tuple[str, bytes, str]]:
    """Everything the queue gets, until ``wanted`` have come and a second passed with no more
    (so that a doubled delivery would be seen)."""
    got: list[tuple[str, bytes, str]] = []
    quiet = 0.0
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline and (len(got) < wanted or quiet < 1.0):
        batch = await transport.receive("race", 100, 0.2)
        if batch:
            await transport.acknowledge(batch)
            got += [(m.message_id, m.body, m.headers["duetime-due-at"]) for m in batch]
            quiet = 0.0
        else:
            quiet += 0.2
    assert len(got) == wanted, json.dumps({"wanted": wanted, "got": len(got)})
    return got
