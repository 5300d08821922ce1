"""The Celery bridge with real Celery workers on the real RabbitMQ and Redis: tasks sent with a
countdown or eta wait in duetime, run once and never before they are due; revoke cancels them in
the store; a worker killed with SIGKILL while thousands wait loses none."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import connect_sync
from tests.integration.bridges import CELERY_APP, App, app, error_queue_copies, once_each
from tests.services import RABBITMQ, REDIS, require, unique

BROKERS = {"amqp": RABBITMQ.rstrip("/") + "//", "redis": REDIS}


def start_worker(a: App, queue: str) -> None:
    a.start(
        sys.executable, "-m", "celery", "-A", a.name, "worker", "-P", "threads", "-c", "4", "-Q", queue,
        "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING",
        "-n", f"{queue}@%h", name="worker",
    )  # fmt: skip


def stored(store: str) -> int:
    with connect_sync(store) as client:
        return len(client.list(limit=10_000).messages)


@pytest.mark.slow
@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_countdown_and_eta_tasks_run_once_when_due_and_revoke_cancels(tmp_path: Path, broker: str) -> None:
    url = BROKERS[broker]
    require(url)
    queue = unique("celery")
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(
        tmp_path, CELERY_APP, f"app_{queue}", {"T_BROKER": url, "T_QUEUE": queue, "T_STORE": store}
    ) as a:
        tasks = a.load()
        not_before: dict[str, float] = {}
        for i in range(30):
            countdown = 1 + (i % 3) * 0.5
            not_before[str(i)] = time.time() + countdown
            tasks.record.apply_async((str(i),), countdown=countdown, task_id=f"{queue}-{i}")
        eta = datetime.now(UTC) + timedelta(seconds=2)
        tasks.record.apply_async(("eta",), eta=eta)
        not_before["eta"] = eta.timestamp()
        moved = tasks.record.apply_async(("moved",), countdown=3600)
        not_before["moved"] = time.time() + 1.5  # before the call: it reads its clock later
        assert tasks.bridge.reschedule(moved.id, countdown=1.5) == 1
        tasks.app.AsyncResult(f"{queue}-0").revoke()
        tasks.app.control.revoke([f"{queue}-1"])
        assert stored(store) == 30  # 32 sent, 2 revoked: all in the store, none on the broker

        with connect_sync(store) as client:  # not from the bridge: refused, to the error queue
            client.schedule(queue, b"not a task", delay=0, message_id=f"{queue}-stray")
        errors = f"{queue}.errors"

        start_worker(a, queue)
        a.dispatcher(store, f"celery+{url}", "--retries", "0", "--error-queue", errors)
        a.wait_for(30, 60)
        time.sleep(1.0)  # the revoked ones were due by now: they must not have run
        ran = a.ran()
        assert once_each(ran) == dict.fromkeys(set(not_before) - {"0", "1"}, 1)
        for record in ran:
            assert record["at"] >= not_before[record["tag"]], f"{record['tag']} ran early"
            assert record["eta"], "the worker sees the task's ETA, as Celery sent it"
        assert stored(store) == 0
        if broker == "amqp":
            [copy] = error_queue_copies(errors, 1)
            assert copy.message_id == f"{queue}-stray"
            assert copy.headers["duetime-error-type"] == "duetime.errors.InvalidMessage"


@pytest.mark.slow
def test_a_worker_killed_while_thousands_wait_loses_none(tmp_path: Path) -> None:
    """Plain Celery on Redis keeps every ETA task in the worker (kombu#337); with the bridge they
    wait in the store, so a SIGKILL costs nothing.

    The dispatcher starts after the kill: a task already handed to a worker is Celery's, and a
    worker killed while running it loses it (Celery acknowledges before running unless
    ``acks_late``). Started before, on a machine slow enough that scheduling outlasts the shortest
    countdown, the kill could find a task running and the test would measure Celery, not duetime."""
    url = BROKERS["redis"]
    require(url)
    queue, total = unique("celery"), 2000
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(
        tmp_path, CELERY_APP, f"app_{queue}", {"T_BROKER": url, "T_QUEUE": queue, "T_STORE": store}
    ) as a:
        tasks = a.load()
        start_worker(a, queue)
        for i in range(total):
            tasks.record.apply_async((str(i),), countdown=5 + (i % 40) * 0.1)
        assert stored(store) == total, "a delayed task went to the broker, not the store"
        a.kill(a.workers[0])
        start_worker(a, queue)
        a.dispatcher(store, f"celery+{url}")
        a.wait_for(total, 90)
        time.sleep(0.5)
        counts = once_each(a.ran())
        assert len(counts) == total and set(counts.values()) == {1}


@pytest.mark.slow
def test_a_recurring_task_runs_each_tick_once_with_a_task_id_of_its_own(tmp_path: Path) -> None:
    """What a beat_schedule entry did, through the bridge: each tick a task of its own."""
    from duetime.recurring import every
    from duetime.recurring.schedule import tick_id

    url = BROKERS["amqp"]
    require(url)
    queue = unique("celery")
    store = f"sqlite:///{tmp_path}/duetime.db"
    with app(
        tmp_path, CELERY_APP, f"app_{queue}", {"T_BROKER": url, "T_QUEUE": queue, "T_STORE": store}
    ) as a:
        tasks = a.load()
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
        made = tasks.bridge.recurring("beat", tasks.record.s("beat"), when=every("1s", start=start, count=3))
        assert made.destination == queue
        start_worker(a, queue)
        a.dispatcher(store, f"celery+{url}")
        a.wait_for(3, 60)
        time.sleep(1.5)  # a fourth would come now
        ran = a.ran()
        assert [r["tag"] for r in ran] == ["beat"] * 3
        assert sorted(r["id"] for r in ran) == [
            tick_id("beat", start + timedelta(seconds=k)) for k in range(3)
        ]
        assert all(
            r["at"] >= (start + timedelta(seconds=k)).timestamp()
            for k, r in enumerate(sorted(ran, key=lambda r: r["at"]))
        )
