"""The RabbitMQ native delay topology as a target of ``duetime bulk migrate``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from duetime import DelayedMessage, TransactionMode
from duetime.backends.rabbitmq.native import NativeDelays
from duetime.message import DUE_AT_HEADER
from tests.integration.test_rabbitmq_native import collect, native, queue
from tests.services import RABBITMQ

__all__ = ["native"]  # the fixture


async def test_a_store_migrates_into_the_topology_keeping_each_due_time(
    spark: Any, native: NativeDelays, tmp_path: Path
) -> None:
    from duetime.bulk.migrate import MigrationSpec, migrate
    from duetime.registry import open_sync_store

    t = native.transport
    dest = await queue(t, "migrated")
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = open_sync_store(url)
    store.setup_infrastructure("old")
    store.initialize("old", TransactionMode.AT_LEAST_ONCE)
    now = datetime.now(UTC)
    messages = [
        DelayedMessage(f"m{i}", dest, now + timedelta(seconds=8 + i % 5, milliseconds=i), b"x")
        for i in range(50)
    ]
    store.store_many(messages)
    store.close()
    target = f"{RABBITMQ}?native=duetime&ledger={tmp_path / 'ledger.db'}"
    result = await asyncio.to_thread(migrate, spark, MigrationSpec(url, target, "old"))
    # on a loaded machine the Spark job can outlast the first due times: those are due at once
    migrated = datetime.now(UTC)
    assert result.inserted == 50 and result.remaining == 0
    got = await collect(t, dest, 50, 30)
    due = {m.message_id: m.due_at for m in messages}
    assert sorted(m.message_id for m, _ in got) == sorted(due)
    for message, at in got:
        assert message.headers[DUE_AT_HEADER] == due[message.message_id].isoformat()  # kept exactly
        assert (
            due[message.message_id] - timedelta(milliseconds=5)
            <= at
            <= max(due[message.message_id], migrated) + timedelta(seconds=3)
        )
    await t.delete(dest)
