"""Redis under Sentinel: a master, an asynchronous replica and three sentinels of their own. The
store and the transport are named by the sentinels (``redis+sentinel://…/mymaster/0``); the master
is killed (``kill -9``) while producers schedule and the dispatcher delivers, and the sentinels
promote the replica. The dispatcher follows the new master without tripping its breakers; what
an asynchronous replica loses in the failover (acknowledged writes it had not received yet) is
counted, and with ``wait=1`` (each write waits for the replica: Redis's ``WAIT``) it is none."""

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
from duetime.backends.redis.transport import RedisTransport
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.topology.servers import sentinel_redis, stop
from tests.topology.tally import Tally, until_all_arrived

pytestmark = [pytest.mark.topology, pytest.mark.timeout(300)]

RESUME_WITHIN = 15.0


def _produce(store: str, tally: Tally, halt: threading.Event) -> None:
    client = None
    while not halt.is_set():
        message_id = f"s-{uuid.uuid4().hex[:12]}"
        try:
            if client is None:
                client = duetime.connect_sync(store, endpoint="shop")
            client.schedule("orders", b"stored", delay=random.uniform(0, 2), message_id=message_id)
            tally.sent.add(message_id)
        except Exception:
            tally.raised.add(message_id)
            time.sleep(0.1)
        time.sleep(0.005)
    if client is not None:
        client.close()


async def _consume(url: str, tally: Tally, halt: threading.Event) -> None:
    transport = RedisTransport.from_url(url)
    while not halt.is_set():
        try:
            await transport.start()
            batch = await transport.receive("orders", 100, 0.5)
            for m in batch:
                tally.got(m.message_id, m.headers.get("duetime-due-at"))
            await transport.acknowledge(batch)
        except Exception:
            await asyncio.sleep(0.2)
    await transport.close()


@pytest.mark.parametrize("wait", ["0", "1"])
def test_a_master_killed_and_its_replica_promoted(tmp_path: Path, wait: str) -> None:
    with sentinel_redis() as redis:
        options = {"wait": wait} if wait != "0" else {}
        store, transport = redis.url(**options), redis.url(**options)
        done = run_cli(
            "setup", "--store", store, "--endpoint", "shop", "--transport", transport, "--queue", "orders"
        )
        assert done.returncode == 0, done.stderr
        log = tmp_path / "run.log"
        run = spawn_run(
            duetime_cmd("run", "--store", store, "--endpoint", "shop", "--transport", transport), log
        )
        tally = Tally()
        halt_producer, halt_consumer = threading.Event(), threading.Event()
        producers = [threading.Thread(target=_produce, args=(store, tally, halt_producer)) for _ in range(2)]
        consumer = threading.Thread(target=lambda: asyncio.run(_consume(transport, tally, halt_consumer)))
        try:
            wait_until_serving(log)
            for producer in producers:
                producer.start()
            consumer.start()
            time.sleep(4)
            redis.kill(redis.master_port)
            killed = time.time()
            time.sleep(8)
            halt_producer.set()
            for producer in producers:
                producer.join(30)
            until_all_arrived([tally], 60)
        finally:
            halt_producer.set()
            halt_consumer.set()
            stop(run)
            consumer.join(30)
        said = log.read_text(errors="replace")
        assert run.returncode == 0, said[-3000:]
        figures = {"wait": wait} | tally.figures(killed)
        print("sentinel figures:", json.dumps(figures))
        assert figures["sent"] > 100 and not tally.early, figures
        assert figures["first_after_s"] is not None and figures["first_after_s"] < RESUME_WITHIN, figures
        if wait != "0":
            assert not figures["lost"], figures  # every acknowledged write was on a replica
        assert "Traceback" not in said, said[-3000:]
