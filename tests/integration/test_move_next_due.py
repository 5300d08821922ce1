"""An exactly-once move reads the next due time in its own call, so the dispatcher sleeps without
asking again: what it reads is what the store's own ``next_due`` says right after, on every store
that moves (memory, SQLite, PostgreSQL) — after a move of some, of the last, and of none."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage
from duetime.interfaces import TransactionalStore
from tests.integration.moving import moving_pair


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def moving(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    async with moving_pair(request.param, request, tmp_path) as pair:
        yield pair


async def test_a_move_reads_the_next_due_time_its_store_would_say(moving: tuple[Any, Any]) -> None:
    store, transport = moving
    assert isinstance(store, TransactionalStore)
    now = datetime.now(UTC)
    later = now + timedelta(minutes=5)
    await store.store_many(
        [
            DelayedMessage("due-1", "orders", now - timedelta(seconds=2)),
            DelayedMessage("due-2", "orders", now - timedelta(seconds=1)),
            DelayedMessage("later", "orders", later),
        ]
    )

    def move(limit: int) -> Any:
        return store.move_due(now, limit, transport, "error", lambda m, reason: {})

    some = await move(1)  # one of two due: the other is next
    assert [m.message_id for m in some.moved] == ["due-1"]
    assert some.next_due is not None and some.next_due.at == await store.next_due()
    assert some.next_due.at is not None and some.next_due.at <= now
    rest = await move(10)  # the last due: the later one is next
    assert [m.message_id for m in rest.moved] == ["due-2"]
    assert rest.next_due is not None and rest.next_due.at == await store.next_due()
    assert rest.next_due.at is not None and abs(rest.next_due.at - later) < timedelta(milliseconds=1)
    none = await move(10)  # nothing due: still read
    assert none.moved == [] and none.next_due is not None
    assert none.next_due.at is not None and abs(none.next_due.at - later) < timedelta(milliseconds=1)
    await store.cancel("later")
    empty = await move(10)
    assert empty.next_due is not None and empty.next_due.at is None  # nothing left at all
