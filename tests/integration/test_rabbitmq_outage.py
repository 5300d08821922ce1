"""RabbitMQ going away mid-delivery (cut through a proxy the test owns, as a broker restart looks
to a client): the transport reconnects, nothing is lost, duplicates stay within one batch."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.backends.sqlite import SqliteStore, SyncSqliteStore
from tests.integration.proxy import proxy_for
from tests.services import RABBITMQ, require


@pytest.mark.slow
async def test_dispatcher_rides_out_a_broker_restart(tmp_path: Path) -> None:
    require(RABBITMQ)
    queue = f"outage.orders.{uuid.uuid4().hex[:8]}"
    direct = RabbitMqTransport.from_url(RABBITMQ)
    await direct.declare(queue)
    await direct.declare(f"{queue}.error")
    sync = SyncSqliteStore(tmp_path / "s.db")
    sync.setup_infrastructure("outage")
    now = datetime.now(UTC)
    total = 3000
    sync.initialize("outage", "at-least-once")  # type: ignore[arg-type]
    sync.store_many(
        [DelayedMessage(f"o{i:05d}", queue, now + timedelta(seconds=i / total * 3)) for i in range(total)]
    )
    with proxy_for(RABBITMQ) as proxy:
        transport = RabbitMqTransport.from_url(proxy.url(RABBITMQ))
        settings = DelayedDeliverySettings(
            error_queue=f"{queue}.error", number_of_retries=1000, failure_backoff=timedelta(seconds=0.2)
        )
        dispatcher = Dispatcher(SqliteStore(sync), transport, settings, endpoint="outage")
        task = asyncio.create_task(dispatcher.run())
        got: list[str] = []
        await asyncio.sleep(1.0)
        proxy.cut()  # the broker "restarts": every connection drops, new ones are refused
        await asyncio.sleep(2.0)
        proxy.restore()
        deadline = asyncio.get_running_loop().time() + 40
        while asyncio.get_running_loop().time() < deadline:
            batch = await direct.receive(queue, 1000, 0.1)
            got += [m.message_id for m in batch]
            await direct.acknowledge(batch)
            if len(set(got)) >= total:
                break
        dispatcher.stop()
        await task
        await transport.close()
        sync.close()
    seen = Counter(got)
    assert len(seen) == total, f"{total - len(seen)} lost"
    assert sum(n - 1 for n in seen.values()) <= settings.batch_size
    assert dispatcher.stats.forwarded >= total
    await direct.delete(queue)
    await direct.delete(f"{queue}.error")
    await direct.close()
