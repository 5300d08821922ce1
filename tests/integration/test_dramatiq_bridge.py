"""The Dramatiq bridge with real Dramatiq workers on the real RabbitMQ and Redis: messages sent with
a delay or an eta wait in duetime, run once and never before they are due; cancel and reschedule
work by message id; a worker killed with SIGKILL while thousands wait loses none."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from duetime import connect_sync
from tests.integration.bridges import DRAMATIQ_APP, App, app, error_queue_copies, once_each
from tests.services import RABBITMQ, REDIS, require, unique

BROKERS = {"amqp": RABBITMQ, "redis": REDIS}


def start_worker(a: App, queue: str) -> None:
    a.start(
        sys.executable, "-m", "dramatiq", a.name, "--processes", "1", "--threads", "4", "--queues", queue,
        name="worker",
    )  # fmt: skip


def stored(store: str) -> int:
    with connect_sync(store) as client:
        return len(client.list(limit=10_000).messages)


def settings(queue: str, url: str, store: str) -> dict[str, str]:
    return {"T_BROKER": url, "T_QUEUE": queue, "T_STORE": store, "T_NAMESPACE": queue}


def transport(url: str, queue: str) -> str:
    return f"dramatiq+{url}" + (f"?namespace={queue}" if url.startswith("redis") else "")


@pytest.mark.slow
@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_delayed_messages_run_once_when_due_and_cancel_works(tmp_path: Path, broker: str) -> None:
    url = BROKERS[broker]
    require(url)
    queue = unique("dramatiq")
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(tmp_path, DRAMATIQ_APP, f"app_{queue}", settings(queue, url, store)) as a:
        tasks = a.load()
        not_before: dict[str, float] = {}
        ids: dict[str, str] = {}
        for i in range(30):
            delay_ms = 1000 + (i % 3) * 500
            # Dramatiq's clock is whole milliseconds (its current_millis() rounds down): the due
            # time it gives is up to 1 ms before time.time() + delay
            not_before[str(i)] = (int(time.time() * 1000) + delay_ms) / 1000
            ids[str(i)] = tasks.record.send_with_options(args=(str(i),), delay=delay_ms).message_id
        eta_ms = int((time.time() + 2) * 1000)
        tasks.record.send_with_options(args=("eta",), eta=eta_ms)
        not_before["eta"] = eta_ms / 1000
        moved = tasks.record.send_with_options(args=("moved",), delay=3_600_000)
        not_before["moved"] = time.time() + 1.5  # before the call: it reads its clock later
        assert tasks.bridge.reschedule(moved.message_id, delay=1.5) == 1
        assert tasks.bridge.cancel(ids["0"]) == 1
        assert tasks.bridge.cancel(ids["1"]) == 1
        assert stored(store) == 30  # 32 sent, 2 cancelled: all in the store, none on the broker

        with connect_sync(store) as client:  # not from the bridge: refused, to the error queue
            client.schedule(queue, b"not a message", delay=0, message_id=f"{queue}-stray")
        errors = f"{queue}.errors"

        start_worker(a, queue)
        a.dispatcher(store, transport(url, queue), "--retries", "0", "--error-queue", errors)
        a.wait_for(30, 60)
        time.sleep(1.0)
        ran = a.ran()
        assert once_each(ran) == dict.fromkeys(set(not_before) - {"0", "1"}, 1)
        for record in ran:
            assert record["at"] >= not_before[record["tag"]], f"{record['tag']} ran early"
        assert stored(store) == 0
        if broker == "amqp":
            [copy] = error_queue_copies(errors, 1)
            assert copy.message_id == f"{queue}-stray"
            assert copy.headers["duetime-error-type"] == "duetime.errors.InvalidMessage"


@pytest.mark.slow
def test_a_worker_killed_while_thousands_wait_loses_none(tmp_path: Path) -> None:
    """Plain Dramatiq keeps delayed messages in the worker's memory until due; with the bridge
    they wait in the store, so a SIGKILL costs nothing. The dispatcher starts after the kill, so
    that what is measured is the wait, whatever the machine's speed (see the Celery test)."""
    url = BROKERS["amqp"]
    require(url)
    queue, total = unique("dramatiq"), 2000
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(tmp_path, DRAMATIQ_APP, f"app_{queue}", settings(queue, url, store)) as a:
        tasks = a.load()
        start_worker(a, queue)
        for i in range(total):
            tasks.record.send_with_options(args=(str(i),), delay=5000 + (i % 40) * 100)
        assert stored(store) == total, "a delayed message went to the broker, not the store"
        a.kill(a.workers[0])
        start_worker(a, queue)
        a.dispatcher(store, transport(url, queue))
        a.wait_for(total, 90)
        time.sleep(0.5)
        counts = once_each(a.ran())
        assert len(counts) == total and set(counts.values()) == {1}


@pytest.mark.slow
def test_a_recurring_message_runs_each_tick_once(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from duetime.recurring import every

    url = BROKERS["amqp"]
    require(url)
    queue = unique("dramatiq")
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(tmp_path, DRAMATIQ_APP, f"app_{queue}", settings(queue, url, store)) as a:
        tasks = a.load()
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
        made = tasks.bridge.recurring(
            "beat", tasks.record.message("beat"), when=every("1s", start=start, count=3)
        )
        assert made.destination == queue
        start_worker(a, queue)
        a.dispatcher(store, transport(url, queue))
        a.wait_for(3, 60)
        time.sleep(1.5)  # a fourth would come now
        ran = sorted(a.ran(), key=lambda r: r["at"])
        assert [r["tag"] for r in ran] == ["beat"] * 3
        assert all(r["at"] >= (start + timedelta(seconds=k)).timestamp() for k, r in enumerate(ran))
