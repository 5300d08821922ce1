"""Two dispatchers on two hosts (network namespaces, each with an address of its own) share one
PostgreSQL store, exactly-once into its queue. One host is cut off from the network mid-delivery
(its link goes down: the server sees nothing). Its claims come back after the claim time, the
other host delivers them, nothing is delivered twice, and the cut-off dispatcher trips its breaker
and exits 3 soon after the breaker's time."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import duetime
from duetime.backends.postgres import SyncPostgresQueue
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.topology.servers import postgres_server, separate_hosts, stop

pytestmark = [pytest.mark.topology, pytest.mark.timeout(300)]

MESSAGES = 3_000
#: The dispatch and fetch breakers' time (the default).
BREAKER = 30.0


def test_a_host_cut_off_gives_its_claims_back_and_its_dispatcher_exits(tmp_path: Path) -> None:
    with separate_hosts(2) as hosts, postgres_server(*(h.gateway for h in hosts)) as port:
        schema = f"h_{uuid.uuid4().hex[:8]}"
        local = f"postgresql://postgres@127.0.0.1:{port}/postgres?schema={schema}&claim_timeout=10"
        done = run_cli("setup", "--store", local, "--endpoint", "shop", "--queue", "orders")
        assert done.returncode == 0, done.stderr
        start = datetime.now(UTC) + timedelta(seconds=3)
        with duetime.connect_sync(local, endpoint="shop") as client:
            for i in range(0, MESSAGES, 500):
                client.schedule_many(
                    [
                        duetime.DelayedMessage.create(
                            "orders",
                            b"x",
                            due_at=start + timedelta(seconds=8 * n / MESSAGES),
                            message_id=f"m{n}",
                        )
                        for n in range(i, i + 500)
                    ]
                )
        runs = []
        for n, host in enumerate(hosts):
            url = f"postgresql://postgres@{host.gateway}:{port}/postgres?schema={schema}&claim_timeout=10"
            log = tmp_path / f"host{n}.log"
            runs.append(
                (spawn_run(host.command(*duetime_cmd("run", "--store", url, "--endpoint", "shop")), log), log)
            )
        got: dict[str, int] = {}
        try:
            for _, log in runs:
                wait_until_serving(log)
            with SyncPostgresQueue.from_url(local) as queue:
                while datetime.now(UTC) < start + timedelta(seconds=3):
                    _take(queue, got)
                hosts[0].cut_off()
                cut = time.monotonic()
                deadline = cut + 90
                while len(got) < MESSAGES and time.monotonic() < deadline:
                    _take(queue, got)
                delivered_all = time.monotonic() - cut
                time.sleep(2)
                _take(queue, got)
            cut_off, _ = runs[0]
            cut_off.wait(max(1.0, cut + BREAKER + 30 - time.monotonic()))
            exited = time.monotonic() - cut
        finally:
            for process, _ in runs:
                stop(process)
        logs = [log.read_text(errors="replace") for _, log in runs]
        assert len(got) == MESSAGES, f"{MESSAGES - len(got)} never arrived; {logs[1][-2000:]}"
        assert set(got.values()) == {1}, "a message arrived twice"
        assert runs[0][0].returncode == 3, logs[0][-3000:]
        assert exited < BREAKER + 20, exited
        figures = {
            "delivered_all_after_cut_s": round(delivered_all, 1),
            "cut_off_exited_after_s": round(exited, 1),
        }
        print("separate hosts figures:", json.dumps(figures))
        assert "critical" in logs[0].lower()


def _take(queue: SyncPostgresQueue, got: dict[str, int]) -> None:
    batch = queue.receive("orders", 500, wait=0.3)
    for m in batch:
        got[m.message_id] = got.get(m.message_id, 0) + 1
    queue.acknowledge(batch)
