"""kill -9 the dispatcher at random moments while it delivers 10,000 messages to RabbitMQ:
none lost, duplicates at most one batch per kill, none early."""

from __future__ import annotations

import asyncio
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.backends.sqlite import SyncSqliteStore
from tests.conftest import duetime_cmd
from tests.services import RABBITMQ, require

TOTAL, BATCH, KILLS = 10_000, 100, 10


class RabbitConsumer(threading.Thread):
    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.arrivals: list[tuple[str, datetime, datetime]] = []
        self.headers: dict[str, dict[str, str]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        t = RabbitMqTransport.from_url(RABBITMQ)
        await t.start()
        while not self.halt.is_set():
            got = await t.receive(self.queue, 500, 0.1)
            now = datetime.now(UTC)
            self.arrivals += [
                (m.message_id, datetime.fromisoformat(m.headers["duetime-due-at"]), now) for m in got
            ]
            self.headers.update((m.message_id, dict(m.headers)) for m in got)
            await t.acknowledge(got)
        await t.close()


@pytest.mark.slow
def test_sigkill_while_delivering_to_rabbitmq(tmp_path: Path) -> None:
    require(RABBITMQ)
    tag = uuid.uuid4().hex[:8]
    queue, error_queue = f"crash.orders.{tag}", f"crash.error.{tag}"

    async def declare(*names: str, delete: bool = False) -> None:
        t = RabbitMqTransport.from_url(RABBITMQ)
        for name in names:
            await (t.delete(name) if delete else t.declare(name))
        await t.close()

    asyncio.run(declare(queue, error_queue))
    db = tmp_path / "crash.db"
    store = SyncSqliteStore.from_url(f"sqlite:///{db}?claim_timeout=1")
    store.setup_infrastructure("crash")
    store.initialize("crash", TransactionMode.AT_LEAST_ONCE)
    rng = random.Random(2026)
    start = datetime.now(UTC)
    store.store_many(
        [
            DelayedMessage(f"r{i:05d}", queue, start + timedelta(seconds=rng.uniform(-1, 4)))
            for i in range(TOTAL)
        ]
    )
    consumer = RabbitConsumer(queue)
    consumer.start()
    args = duetime_cmd(
        "run",
        "--store",
        f"sqlite:///{db}?claim_timeout=1",
        "--transport",
        RABBITMQ,
        "--endpoint",
        "crash",
        "--batch-size",
        str(BATCH),
        "--error-queue",
        error_queue,
        "--no-front-door",
    )
    kills = 0
    deadline = time.monotonic() + 120
    proc: Any = None
    try:
        while kills < KILLS:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.4, 1.2))
            proc.kill()
            proc.wait()
            kills += 1
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while len({i for i, _, _ in consumer.arrivals}) < TOTAL and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
        consumer.halt.set()
        consumer.join()
        asyncio.run(declare(queue, error_queue, delete=True))
    assert code == 0
    seen = Counter(i for i, _, _ in consumer.arrivals)
    assert len(seen) == TOTAL, f"{TOTAL - len(seen)} lost"
    assert sum(n - 1 for n in seen.values()) <= BATCH * kills
    assert [i for i, due, at in consumer.arrivals if at < due] == []
    assert store.counts(datetime.now(UTC)).total == 0
    store.close()
