"""A store and its own queue transport, set up for exactly-once moves: memory, SQLite or PostgreSQL
(for the tests of ``TransactionalStore.move_due``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from duetime import TransactionMode, open_store, open_transport


@contextlib.asynccontextmanager
async def moving_pair(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any]]:
    """``kind``'s store and transport, set up for endpoint "moves", with the queue "orders"."""
    if kind == "memory":
        from duetime.backends.memory import MemoryStore, MemoryTransport

        store: Any = MemoryStore()
        transport: Any = MemoryTransport()
    else:
        url = f"sqlite:///{tmp_path / 'moves.db'}" if kind == "sqlite" else request.getfixturevalue("pg")
        store, transport = open_store(url), open_transport(url)
    await store.setup_infrastructure("moves")
    await store.initialize("moves", TransactionMode.EXACTLY_ONCE)
    await transport.start()
    await transport.declare("orders")
    try:
        yield store, transport
    finally:
        await transport.close()
        await store.close()
