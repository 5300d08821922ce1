"""kill -9 at random moments during a 10,000-message run: nothing lost, nothing early,
and in exactly-once mode nothing doubled."""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.backends.sqlite import SyncSqliteQueue, SyncSqliteStore
from tests.conftest import duetime_cmd, spawn_run, wait_until_serving
from tests.integration.consumer import RecordingConsumer

TOTAL = 10_000
BATCH = 100


@pytest.mark.slow
@pytest.mark.parametrize("mode", [TransactionMode.EXACTLY_ONCE, TransactionMode.AT_LEAST_ONCE])
def test_sigkill_loses_nothing(tmp_path: Path, mode: TransactionMode) -> None:
    db = tmp_path / "crash.db"
    url = f"sqlite:///{db}?claim_timeout=1"
    store = SyncSqliteStore.from_url(url)
    store.setup_infrastructure("crash")
    store.initialize("crash", mode)
    queue = SyncSqliteQueue(db)
    queue.declare("crash.orders")
    queue.close()
    start = datetime.now(UTC)
    store.store_many(
        [
            DelayedMessage(f"c{i:05d}", "crash.orders", start + timedelta(seconds=random.uniform(-1, 4)))
            for i in range(TOTAL)
        ]
    )
    consumer = RecordingConsumer(db, "crash.orders")
    consumer.start()
    rng = random.Random(20261122)
    kills = 0
    deadline = time.monotonic() + 90
    args = duetime_cmd(
        "run",
        "--store",
        url,
        "--transport",
        f"sqlite:///{db}",
        "--endpoint",
        "crash",
        "--mode",
        mode.value,
        "--batch-size",
        str(BATCH),
        "--no-front-door",
    )
    try:
        while time.monotonic() < deadline:
            log = tmp_path / f"run-{kills}.log"
            proc = spawn_run(args, log)
            if kills < 10:
                time.sleep(rng.uniform(0.3, 1.2))
                proc.kill()
                proc.wait()
                kills += 1
                continue
            while time.monotonic() < deadline and len(set(consumer.ids())) < TOTAL:
                time.sleep(0.1)
            time.sleep(1.5)  # long enough for an expired claim to be sent again
            wait_until_serving(log)  # a stop signal during start-up is not a graceful stop
            proc.terminate()
            assert proc.wait(timeout=30) == 0, "graceful stop must exit 0"
            break
    finally:
        consumer.halt.set()
        consumer.join()
    seen = Counter(consumer.ids())
    missing = TOTAL - len(seen)
    duplicates = sum(n - 1 for n in seen.values())
    assert kills == 10
    assert missing == 0, f"{missing} messages lost"
    assert consumer.early() == [], "delivered before due"
    assert store.counts(datetime.now(UTC)).total == 0
    if mode is TransactionMode.EXACTLY_ONCE:
        assert duplicates == 0
    else:
        assert duplicates <= BATCH * kills
    store.close()
