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
from pathlib import Path

import pytest

import duetime
from duetime.backends.nats.transport import NatsTransport, stream_name
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.topology.servers import NatsCluster, nats_cluster, stop
from tests.topology.tally import Tally, until_all_arrived

pytestmark = [pytest.mark.topology, pytest.mark.timeout(300)]

RESUME_WITHIN = 15.0


def _produce(store: str, tally: Tally, halt: threading.Event) -> None:
    with duetime.connect_sync(store, endpoint="shop") as client:
        while not halt.is_set():
            message_id = f"s-{uuid.uuid4().hex[:12]}"
            client.schedule("orders", b"stored", delay=random.uniform(0, 2), message_id=message_id)
            tally.sent.add(message_id)
            time.sleep(0.02)


async def _consume(url: str, tally: Tally, halt: threading.Event) -> None:
    transport = NatsTransport.from_url(url)
    while not halt.is_set():
        try:
            await transport.start()
            batch = await transport.receive("orders", 100, 0.5)
        except Exception:
            await asyncio.sleep(0.2)
            continue
        for m in batch:
            tally.got(m.message_id, m.headers.get("duetime-due-at"))
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
        tally = Tally()
        halt_producer, halt_consumer = threading.Event(), threading.Event()
        producer = threading.Thread(target=_produce, args=(store, tally, halt_producer))
        consumer = threading.Thread(target=lambda: asyncio.run(_consume(url, tally, halt_consumer)))
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
            until_all_arrived([tally], 60)
        finally:
            halt_producer.set()
            halt_consumer.set()
            stop(run)
            consumer.join(30)
        said = log.read_text(errors="replace")
        assert run.returncode == 0, said[-3000:]
        lost = tally.missing()
        assert len(tally.sent) > 100 and not lost, (
            f"{len(lost)} of {len(tally.sent)} never arrived; {said[-2000:]}"
        )
        assert not tally.early, tally.early[:5]
        figures = tally.figures(killed) | {"leader_killed": leader}
        print("nats cluster figures:", json.dumps(figures))
        assert figures["first_after_s"] is not None and figures["first_after_s"] < RESUME_WITHIN, figures
        assert "Traceback" not in said, said[-3000:]
