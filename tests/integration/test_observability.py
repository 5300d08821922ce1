"""What an operator sees of real dispatchers: metrics scraped from `duetime run --metrics-port`
(PostgreSQL store -> RabbitMQ) checked against what the consumer saw, `/readyz` while a proxy cuts
the database, live and gone dispatchers, `duetime check`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duetime import DelayedMessage, TransactionMode
from duetime.backends.postgres import SyncPostgresStore
from duetime.backends.rabbitmq import RabbitMqTransport
from duetime.live_dispatchers import EXPIRY, HEARTBEAT_INTERVAL
from tests.conftest import duetime_cmd, run_cli
from tests.integration.proxy import proxy_for
from tests.integration.test_rabbitmq_crash import RabbitConsumer
from tests.services import RABBITMQ, free_port, require, shown, until

pytestmark = pytest.mark.slow
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:  # it holds the connection: closed here, not left to the garbage collector
            return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def scrape(port: int) -> Samples:
    status, text = get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def scrape_until(port: int, check: Callable[[Samples], bool], seconds: float, what: str) -> Samples:
    found: list[Samples] = []

    def look() -> bool:
        found[:] = [scrape(port)]
        return check(found[0])

    until(look, seconds, what)
    return found[0]


def setup_store(url: str, endpoint: str) -> SyncPostgresStore:
    store = SyncPostgresStore.from_url(url)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    return store


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        duetime_cmd("run", *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


def rabbit(*names: str, delete: bool = False) -> None:
    async def go() -> None:
        t = RabbitMqTransport.from_url(RABBITMQ)
        for name in names:
            await (t.delete(name) if delete else t.declare(name))
        await t.close()

    asyncio.run(go())


def test_metrics_of_a_real_run_match_what_the_consumer_saw(pg: str) -> None:
    require(RABBITMQ)
    tag = uuid.uuid4().hex[:8]
    queue, error_queue, nowhere = f"obs.orders.{tag}", f"obs.error.{tag}", f"obs.nowhere.{tag}"
    rabbit(queue, error_queue)
    store = setup_store(pg, "obs")
    # due once the run has started and counted them: a loaded machine took over 4 s to start it
    first = datetime.now(UTC) + timedelta(seconds=8)
    traced = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
    store.store_many(
        [
            DelayedMessage(
                f"m{i:04d}", queue, first + timedelta(milliseconds=5 * i), headers=traced if i == 7 else {}
            )
            for i in range(400)
        ]
    )
    store.store_many([DelayedMessage(f"x{i}", nowhere, first) for i in range(3)])
    consumer = RabbitConsumer(queue)
    consumer.start()
    port = free_port()
    run = start(
        "--store", pg, "--transport", RABBITMQ, "--endpoint", "obs", "--error-queue", error_queue,
        "--no-front-door", "--metrics-port", str(port),
    )  # fmt: skip
    try:
        until(lambda: get(port, "/readyz") == (200, "ready\n"), 20, "ready")
        assert get(port, "/healthz") == (200, "ok\n")
        during = scrape_until(
            port, lambda s: metric(s, "duetime_backlog_stored", endpoint="obs") is not None, 10, "backlog"
        )
        assert metric(during, "duetime_backlog_stored", endpoint="obs") == 403
        assert metric(during, "duetime_backlog_by_destination", endpoint="obs", destination=queue) == 400
        until(lambda: len(consumer.arrivals) >= 400, 30, "all 400 delivered")

        # A batch is counted once the broker has confirmed it and the store has let it go, which
        # on a busy machine is some time after the consumer had it (a scrape between the two read
        # forwarded 391 of 400): wait for the counts to reach what the consumer saw, never past it.
        def counted(s: Samples) -> bool:
            return (
                metric(s, "duetime_dead_lettered_total", endpoint="obs", destination=nowhere) == 3
                and metric(s, "duetime_forwarded_total", endpoint="obs", destination=queue) == 400
                and metric(s, "duetime_lateness_seconds_count", endpoint="obs") == 400
            )

        after = scrape_until(port, counted, 20, "the 400 forwarded and the three dead-lettered counted")
        assert metric(after, "duetime_forwarded_total", endpoint="obs", destination=queue) == 400
        assert metric(after, "duetime_claimed_total", endpoint="obs") == 403
        assert metric(after, "duetime_lateness_seconds_count", endpoint="obs") == 400
        # The dispatcher times a batch when the broker has confirmed all of it, which can be some
        # ms after the consumer had its first messages (tens of ms on a machine busy with the rest
        # of the suite): per bucket, it counts at least as many as the consumer saw 100 ms less
        # late, and its sum is at most the consumer's plus 100 ms each.
        seen = [(arrived - due).total_seconds() for _, due, arrived in consumer.arrivals]
        assert min(seen) >= 0, "delivered early"
        slack = 0.100
        for bound in ("0.025", "0.05", "0.1", "0.5", "1.0", "+Inf"):
            counted = metric(after, "duetime_lateness_seconds_bucket", endpoint="obs", le=bound)
            assert counted is not None and counted >= sum(1 for x in seen if x + slack <= float(bound)), bound
        total = metric(after, "duetime_lateness_seconds_sum", endpoint="obs")
        assert total is not None and 0 <= total <= sum(seen) + slack * len(seen)
        assert (metric(after, "duetime_batch_size_count", endpoint="obs") or 0) >= 5
        assert metric(after, "duetime_breaker_state", endpoint="obs", breaker="dispatch") == 0
        assert (
            metric(after, "duetime_last_batch_timestamp_seconds", endpoint="obs") or 0
        ) > first.timestamp()
        empty = scrape_until(
            port,
            lambda s: metric(s, "duetime_backlog_stored", endpoint="obs") == 0,
            15,
            "the backlog gauge back to 0",
        )
        assert metric(empty, "duetime_dispatchers", endpoint="obs", status="live") == 1
        assert (metric(empty, "process_resident_memory_bytes") or 0) > 0
    finally:
        code = stop(run)
        consumer.halt.set()
        consumer.join()
        rabbit(queue, error_queue, delete=True)
        store.close()
    assert code == 0, run.stderr.read() if run.stderr else ""
    assert sorted(i for i, _, _ in consumer.arrivals) == [f"m{i:04d}" for i in range(400)]
    # a W3C trace context reaches the destination as the producer set it
    assert {k: consumer.headers["m0007"][k] for k in traced} == traced


def test_readyz_turns_not_ready_while_the_database_is_cut_and_ready_after(pg: str) -> None:
    setup_store(pg, "probe").close()
    port = free_port()
    with proxy_for(pg) as proxy:
        run = start("--store", proxy.url(pg), "--endpoint", "probe", "--metrics-port", str(port))
        try:
            until(lambda: get(port, "/readyz")[0] == 200, 20, "ready")
            proxy.cut()
            until(lambda: get(port, "/readyz")[0] == 503, 10, "not ready")
            text = get(port, "/readyz")[1]
            assert text.startswith("not ready: store unreachable: "), text
            assert get(port, "/healthz") == (200, "ok\n")  # alive: an outage is no reason to restart
            proxy.restore()
            until(lambda: get(port, "/readyz") == (200, "ready\n"), 20, "ready again")
        finally:
            code = stop(run)
    assert code == 0, run.stderr.read() if run.stderr else ""


def test_two_dispatchers_show_as_live_and_one_killed_shows_as_gone(pg: str) -> None:
    setup_store(pg, "pair").close()

    def dispatchers() -> dict[int, dict[str, Any]]:
        done = run_cli("stats", "--store", pg, "--endpoint", "pair", "--json")
        assert done.returncode == 0, done.stderr
        return {d["pid"]: d for d in json.loads(done.stdout)["dispatchers"]}

    one, two = start("--store", pg, "--endpoint", "pair"), start("--store", pg, "--endpoint", "pair")
    try:
        until(
            lambda: [dispatchers().get(p.pid, {}).get("status") for p in (one, two)] == ["live", "live"],
            20, "two live dispatchers",
        )  # fmt: skip
        found = dispatchers()
        assert found[one.pid]["mode"] == "exactly-once" and found[one.pid]["host"] == socket.gethostname()
        os.kill(one.pid, signal.SIGKILL)
        one.wait()
        killed = time.monotonic()
        until(lambda: dispatchers()[one.pid]["status"] == "gone", 40, "the killed one gone")
        assert time.monotonic() - killed <= (EXPIRY + HEARTBEAT_INTERVAL).total_seconds() + 3
        assert dispatchers()[two.pid]["status"] == "live"
        shown = run_cli("stats", "--store", pg, "--endpoint", "pair")
        assert f"pid {one.pid}" in shown.stdout and "gone" in shown.stdout
    finally:
        code = stop(two)
    assert code == 0
    assert dispatchers()[two.pid]["status"] == "stopped"


def test_check_exits_0_or_1_with_one_line(pg: str) -> None:
    require(RABBITMQ)
    missing = run_cli("check", "--store", pg, "--endpoint", "nothing-here")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "duetime setup" in missing.stderr, missing.stderr
    setup_store(pg, "checked").close()
    ok = run_cli("check", "--store", pg, "--endpoint", "checked", "--transport", RABBITMQ)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: store ") and "0 stored" in ok.stdout and shown(RABBITMQ) in ok.stdout
    dead = run_cli(
        "check",
        "--store",
        pg,
        "--endpoint",
        "checked",
        "--transport",
        "amqp://guest:guest@127.0.0.1:1/",
        "--timeout",
        "3",
    )
    assert dead.returncode == 1 and dead.stderr.startswith(
        "not ok: transport: cannot connect to amqp://***:***@127.0.0.1:1/"  # guest:guest: both hidden
    ), dead.stderr
    assert dead.stderr.count("\n") == 1


def test_a_metrics_port_in_use_is_a_one_line_error(tmp_path: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("run", "--store", f"sqlite:///{tmp_path}/x.db", "--metrics-port", str(port))
    assert done.returncode != 0
    # one line: nothing after it (a RuntimeWarning for the heartbeat's never-started coroutine was)
    assert (
        done.stderr.strip()
        == f"error: The metrics port 127.0.0.1:{port} is in use; pick another with --metrics-port."
    )


def test_a_listening_address_this_machine_lacks_names_the_host_option(tmp_path: Any) -> None:
    """Said "pick another with --port" for a host that does not resolve: the wrong fix."""
    for command, option in (
        (("dashboard", "--host", "256.1.1.1", "--port", "8099"), "--host"),
        (("run", "--metrics-host", "256.1.1.1", "--metrics-port", "9999"), "--metrics-host"),
    ):
        done = run_cli(*command, "--store", f"sqlite:///{tmp_path}/x.db")
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "256.1.1.1" in line and f"give {option} an address of this machine" in line, line
