"""A NATS JetStream cluster of three servers of its own, the queues' streams kept on all three
(``replicas=3``), the transport's URL naming every server. The server leading the destination's
stream is killed (``kill -9``) while the dispatcher delivers: nothing acknowledged is lost,
nothing arrives early, and the dispatcher and the consumer carry on through the others."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

import duetime
from duetime.backends.nats.transport import NatsTransport, stream_name
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.topology.servers import NatsCluster, nats_cluster, stop

pytestmark = [pytest.mark.topology, pytest.mark.timeout(300)]

RESUME_WITHIN = 15.0


def _produce(store: str, sent: set[str], halt: threading.Event) -> None:
    with duetime.connect_sync(store, endpoint="shop") as client:
        while not halt.is_set():
            message_id = f"s-{uuid.uuid4().hex[:12]}"
            client.schedule("orders", b"stored", delay=random.uniform(0, 2), message_id=message_id)
            sent.add(message_id)
            time.sleep(0.02)


async def _consume(
    url: str, got: dict[str, int], early: list[str], arrivals: list[float], halt: threading.Event
) -> None:
    transport = NatsTransport.from_url(url)
    while not halt.is_set():
        try:
            await transport.start()
            batch = await transport.receive("orders", 100, 0.5)
        except Exception:
            await asyncio.sleep(0.2)
            continue
        now = time.time()
        for m in batch:
            got[m.message_id] = got.get(m.message_id, 0) + 1
            arrivals.append(now)
            due = m.headers.get("duetime-due-at")
            if due and datetime.fromisoformat(due).timestamp() - now > 0.05:
                early.append(m.message_id)
        try:
            await transport.acknowledge(batch)
        except Exception:
            await asyncio.sleep(0.2)  # not acknowledged: handed out again, counted twice
    await transport.close()


async def _leader(cluster: NatsCluster) -> str:
    transport = NatsTransport.from_url(cluster.url())
    await transport.start()
    try:
        info = await transport.js.stream_info(stream_name("orders"))
        return str(info.cluster.leader)
    finally:
        await transport.close()


def test_a_server_leading_the_stream_killed_loses_nothing(tmp_path: Path) -> None:
    with nats_cluster() as cluster:
        url = cluster.url(replicas="3")
        store = f"sqlite:///{tmp_path / 'store.db'}"
        done = run_cli(
            "setup", "--store", store, "--endpoint", "shop", "--transport", url, "--queue", "orders"
        )
        assert done.returncode == 0, done.stderr
        log = tmp_path / "run.log"
        run = spawn_run(duetime_cmd("run", "--store", store, "--endpoint", "shop", "--transport", url), log)
        sent: set[str] = set()
        got: dict[str, int] = {}
        early: list[str] = []
        arrivals: list[float] = []
        halt_producer, halt_consumer = threading.Event(), threading.Event()
        producer = threading.Thread(target=_produce, args=(store, sent, halt_producer))
        consumer = threading.Thread(
            target=lambda: asyncio.run(_consume(url, got, early, arrivals, halt_consumer))
        )
        try:
            wait_until_serving(log)
            producer.start()
            consumer.start()
            time.sleep(4)
            leader = asyncio.run(_leader(cluster))
            cluster.kill(leader)
            killed = time.time()
            time.sleep(6)
            halt_producer.set()
            producer.join(30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sent - set(got):
                time.sleep(0.3)
            time.sleep(1)
        finally:
            halt_producer.set()
            halt_consumer.set()
            stop(run)
            consumer.join(30)
        said = log.read_text(errors="replace")
        assert run.returncode == 0, said[-3000:]
        lost = sent - set(got)
        assert len(sent) > 100 and not lost, f"{len(lost)} of {len(sent)} never arrived; {said[-2000:]}"
        assert not early, early[:5]
        after = min((t for t in arrivals if t >= killed), default=None)
        figures = {
            "sent": len(sent),
            "doubled": sum(1 for n in got.values() if n > 1),
            "first_after_kill_s": None if after is None else round(after - killed, 2),
            "leader_killed": leader,
        }
        print("nats cluster figures:", json.dumps(figures))
        assert after is not None and after - killed < RESUME_WITHIN, figures
        assert "Traceback" not in said, said[-3000:]
