"""An operator's reads never wait in front of the dispatcher's work: a count, a page of
messages or a group's size that takes long (a million rows counted) runs on a thread of its own,
while claims and removals go on. On MariaDB the backlog gauge's count held deliveries up to
0.4 s every ten seconds when they shared one thread."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.interfaces import ListQuery
from duetime.registry import open_store
from tests.services import store_url

#: Every store that ships with duetime (each runs a blocking driver on threads).
BRIDGED = ["sqlite", "postgresql", "mariadb", "redis"]


@pytest.mark.parametrize("kind", BRIDGED)
@pytest.mark.parametrize("read", ["counts", "list", "count_group"])
async def test_a_slow_read_never_holds_up_claims_and_removals(kind: str, read: str, tmp_path: Path) -> None:
    with store_url(kind, tmp_path) as url:
        store: Any = open_store(url)
        await store.setup_infrastructure("reads")
        await store.initialize("reads", TransactionMode.AT_LEAST_ONCE)
        now = datetime.now(UTC)
        await store.store_many(
            [DelayedMessage(f"m{i}", "orders", now - timedelta(seconds=1)) for i in range(3)]
        )
        sync = store.sync
        real = getattr(sync, read)
        reading, done = threading.Event(), threading.Event()

        def slow(*args: Any) -> Any:  # a read that takes as long as the test wants
            reading.set()
            done.wait(30)
            return real(*args)

        setattr(sync, read, slow)
        args = {"counts": (now,), "list": (ListQuery(),), "count_group": ("g",)}[read]
        pending = asyncio.ensure_future(getattr(store, read)(*args))
        try:
            assert await asyncio.to_thread(reading.wait, 10)
            claimed = await asyncio.wait_for(store.fetch_due(datetime.now(UTC), 10), 10)
            assert sorted(m.message_id for m in claimed) == ["m0", "m1", "m2"]
            assert await asyncio.wait_for(store.remove_many(["m0", "m1", "m2"]), 10) == 3
            assert not pending.done()  # the read was in flight all along
        finally:
            done.set()
            await pending
            await store.close()
