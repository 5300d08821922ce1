"""The transport contract on every transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from duetime.backends.memory import MemoryTransport
from duetime.backends.sqlite import SqliteQueueTransport
from tests.contract.transport_contract import TransportContract
from tests.services import postgres_schema


class TestMemoryTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[MemoryTransport]:
        t = MemoryTransport()
        await t.start()
        yield t
        await t.close()


class TestSqliteQueueTransport(TransportContract):
    @pytest.fixture
    async def transport(self, tmp_path: Path) -> AsyncIterator[SqliteQueueTransport]:
        t = SqliteQueueTransport(tmp_path / "q.db")
        await t.start()
        yield t
        await t.close()


class TestPostgresQueueTransport(TransportContract):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[object]:
        from duetime.backends.postgres import PostgresQueueTransport

        with postgres_schema() as url:
            t = PostgresQueueTransport.from_url(url)
            await t.start()
            yield t
            await t.close()
