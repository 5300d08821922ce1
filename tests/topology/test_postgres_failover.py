"""A PostgreSQL primary crashes (``kill -9``) and its synchronous standby is promoted while
producers schedule and dispatchers deliver: exactly-once into the PostgreSQL queue and
at-least-once into RabbitMQ, two dispatchers each, every process given both servers in one URL
(``target_session_attrs=read-write``). Nothing acknowledged is lost, nothing arrives early, the
exactly-once messages arrive once, and delivery resumes within seconds of the promotion, well
inside the breakers' 30 s: a failover is not a critical error."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import duetime
from duetime.backends.postgres import SyncPostgresQueue
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.services import RABBITMQ, delete_rabbitmq_queues, require, with_option
from tests.topology.servers import replicated_postgres, stop
from tests.topology.tally import Tally, until_all_arrived

pytestmark = [pytest.mark.topology, pytest.mark.timeout(400)]

#: Delivery must resume this soon after the standby is promoted (the breakers allow 30 s).
RESUME_WITHIN = 10.0


def _produce(url: str, endpoint: str, destination: str, out: Tally, halt: threading.Event) -> None:
    """Schedule until told to stop, through every outage: a call that raises is counted, not retried."""
    client: Any = None
    while not halt.is_set():
        message_id = f"{endpoint}-{uuid.uuid4().hex[:12]}"
        try:
            if client is None:
                client = duetime.connect_sync(url, endpoint=endpoint)
            client.schedule(destination, b"x", delay=random.uniform(0, 1.5), message_id=message_id)
            out.sent.add(message_id)
        except Exception:
            out.raised.add(message_id)
            time.sleep(0.1)
        time.sleep(0.01)
    if client is not None:
        client.close()


def _consume_queue(url: str, queue: str, into: Tally, halt: threading.Event) -> None:
    consumer: SyncPostgresQueue | None = None
    while not halt.is_set():
        try:
            if consumer is None:
                consumer = SyncPostgresQueue.from_url(url)
            batch = consumer.receive(queue, 100, wait=0.5)
            for m in batch:
                into.got(m.message_id, m.headers.get("duetime-due-at"))
            consumer.acknowledge(batch)
        except Exception:
            time.sleep(0.2)
    if consumer is not None:
        consumer.close()


def _consume_rabbitmq(queue: str, into: Tally, halt: threading.Event) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
    channel = connection.channel()
    try:
        while not halt.is_set():
            method, properties, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            headers = properties.headers or {}
            into.got(str(properties.message_id), headers.get("duetime-due-at"))
    finally:
        connection.close()


def _ok(*args: str) -> None:
    done = run_cli(*args, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_primary_killed_and_its_standby_promoted_loses_and_doubles_nothing(tmp_path: Path) -> None:
    require(RABBITMQ)
    tag = uuid.uuid4().hex[:8]
    rabbit_queue, rabbit_errors = f"failover-{tag}", f"failover-{tag}.error"
    with replicated_postgres() as pair:
        url = with_option(pair.url(), schema=f"f_{tag}")
        _ok("setup", "--store", url, "--endpoint", "exact", "--queue", "orders")
        _ok("setup", "--store", url, "--endpoint", "loose", "--transport", RABBITMQ, "--queue", rabbit_queue,
            "--queue", rabbit_errors)  # fmt: skip
        runs = []
        for n in range(2):
            for endpoint, extra in (
                ("exact", []),
                ("loose", ["--transport", RABBITMQ, "--error-queue", rabbit_errors]),
            ):
                log = tmp_path / f"{endpoint}{n}.log"
                runs.append(
                    (spawn_run(duetime_cmd("run", "--store", url, "--endpoint", endpoint, *extra), log), log)
                )
        halt_producers, halt_consumers = threading.Event(), threading.Event()
        tallies = {"exact": Tally(), "loose": Tally()}
        threads = [
            threading.Thread(
                target=_produce, args=(url, "exact", "orders", tallies["exact"], halt_producers)
            ),
            threading.Thread(
                target=_produce, args=(url, "loose", rabbit_queue, tallies["loose"], halt_producers)
            ),
            threading.Thread(target=_consume_queue, args=(url, "orders", tallies["exact"], halt_consumers)),
            threading.Thread(target=_consume_rabbitmq, args=(rabbit_queue, tallies["loose"], halt_consumers)),
        ]
        try:
            for _, log in runs:
                wait_until_serving(log)
            for thread in threads:
                thread.start()
            time.sleep(4)
            pair.kill_primary()
            time.sleep(1)  # the outage: nothing is writable
            pair.promote()
            promoted = time.time()
            time.sleep(5)
            halt_producers.set()
            for thread in threads[:2]:
                thread.join(30)
            until_all_arrived(tallies.values(), 60)
        finally:
            halt_producers.set()
            halt_consumers.set()
            for process, _ in runs:
                stop(process)
            for thread in threads:
                if thread.is_alive():
                    thread.join(30)
        logs = {log.name: log.read_text(errors="replace") for _, log in runs}
        for (process, log), text in zip(runs, logs.values(), strict=True):
            assert process.returncode == 0, f"{log.name} ended with {process.returncode}: {text[-3000:]}"
        figures = {}
        for endpoint, tally in tallies.items():
            assert len(tally.sent) > 100, (endpoint, len(tally.sent))
            lost = tally.missing()
            assert not lost, f"{endpoint}: {len(lost)} acknowledged messages never arrived"
            assert not tally.early, f"{endpoint}: early {tally.early[:5]}"
            assert not set(tally.times) - tally.sent - tally.raised, "a message nobody sent"
            figures[endpoint] = tally.figures(promoted)
            resumed = figures[endpoint]["first_after_s"]
            assert resumed is not None and resumed < RESUME_WITHIN, (endpoint, figures)
        assert figures["exact"]["doubled"] == 0, figures
        print("failover figures:", json.dumps(figures))
        (tmp_path / "figures.json").write_text(json.dumps(figures))
        with SyncPostgresQueue.from_url(url) as queue:
            assert queue.depth("error") == 0  # a failover dead-letters nothing
        for text in logs.values():
            assert "dead-letter" not in text.lower() and "Traceback" not in text, text[-3000:]
    delete_rabbitmq_queues(rabbit_queue, rabbit_errors)
