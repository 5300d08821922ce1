"""Webhooks as a user runs them: `duetime webhooks add`, `duetime schedule`, and one `duetime run`
delivering by route (webhooks for ``hook.*``, the store's own queue for the rest and the error
queue) to a real receiver under uvicorn that checks every signature with ``standardwebhooks``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.integration.proxy import TcpProxy
from tests.services import MQTT, RABBITMQ, delete_rabbitmq_queues, free_port, require, store_url, until
from tests.webhook_receiver import Receiver, receiving

ROUTE = "hook.*=webhooks://"


def ok(*args: str) -> str:
    done = run_cli(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def add(url: str, name: str, target: str, secret: str, *options: str) -> None:
    ok("webhooks", "add", name, target, "--secret", secret, "--store", url, *options)


def schedule(url: str, destination: str, body: str, *options: str) -> str:
    return ok("schedule", destination, body, "--in", "0s", "--store", url, *options).strip().splitlines()[-1]


def errors(url: str) -> dict[str, dict[str, str]]:
    lines = ok("errors", "list", "--json", "--store", url).splitlines()
    return {m["id"]: m for m in map(json.loads, lines)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_one_run_delivers_signed_webhooks_by_route_and_sorts_every_answer(kind: str, tmp_path: Path) -> None:
    """Signed requests that verify; a receiver failing 500 for 20 s gets its messages once it
    recovers, while another endpoint keeps receiving; a 429 with Retry-After: 3 is waited for; a
    404 lands in the error queue with its status; loopback reached without an allow, a numeric
    spelling of 127.0.0.1 and a redirect to it are refused; the rest of the store goes on to its
    own queue."""
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    with store_url(kind, tmp_path) as url, receiving(secret, host="127.0.0.2") as receiver:
        ok("setup", "--store", url, "--queue", "orders")
        allowed = ("--allow", "127.0.0.2", "--retry-schedule", ",".join(["1s"] * 40))
        add(url, "hook.ok", receiver.url("/ok"), secret, *allowed, "--header", "customer-id")
        add(url, "hook.flaky", receiver.url("/fail-until"), secret, *allowed)
        add(url, "hook.busy", receiver.url("/busy"), secret, *allowed)
        add(url, "hook.missing", receiver.url("/missing"), secret, *allowed)
        add(url, "hook.closed", receiver.url("/ok"), secret)  # loopback, not allowed
        add(url, "hook.number", f"http://2130706433:{receiver.port}/ok", secret, *allowed)
        to_loopback = receiver.url(f"/redirect?to=http://127.0.0.1:{receiver.port}/ok")
        add(url, "hook.redirect", to_loopback, secret, *allowed, "--follow-redirects")
        lines = [
            {"id": f"ok-{i}", "destination": "hook.ok", "body": f'{{"n": {i}, "text": "žluťoučký"}}', "delay": "0s",
             "headers": {"customer-id": "c7", "password": "hunter2", "content-type": "application/json"}}
            for i in range(20)
        ]  # fmt: skip
        lines += [
            {"id": f"flaky-{i}", "destination": "hook.flaky", "body": "f", "delay": "0s"} for i in range(3)
        ]
        names = ("busy", "missing", "closed", "number", "redirect")
        lines += [{"id": name, "destination": f"hook.{name}", "body": name, "delay": "0s"} for name in names]
        lines.append(
            {"id": "local", "destination": "orders", "body": "to the store's own queue", "delay": "0s"}
        )
        (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        ok("load", str(tmp_path / "m.jsonl"), "--store", url)
        sent, flaky, busy, local = (
            {f"ok-{i}" for i in range(20)},
            {f"flaky-{i}" for i in range(3)},
            "busy",
            "local",
        )
        refused = {name: name for name in names[1:]}
        receiver.recover_at = time.monotonic() + 1000  # failing until the run is there
        log = tmp_path / "run.log"
        metrics_port = free_port()
        run = spawn_run(
            duetime_cmd("run", "--store", url, "--route", ROUTE, "--metrics-port", str(metrics_port)), log
        )
        try:
            wait_until_serving(log)
            receiver.recover_at = time.monotonic() + 20
            until(lambda: set(receiver.delivered()) >= sent | {busy}, 30, "hook.ok and hook.busy delivered")
            assert time.monotonic() < receiver.recover_at, "hook.ok waited for the failing endpoint"
            until(lambda: set(receiver.delivered()) >= flaky, 40, "hook.flaky delivered once it recovered")
            until(lambda: set(refused.values()) <= set(errors(url)), 30, "the refused in the error queue")
            requests, timed = webhook_metrics(metrics_port)
        finally:
            run.send_signal(signal.SIGTERM)
            run.wait(30)
        assert all(r.verified for r in receiver.requests), "a signature the receiver could not verify"
        first = [r for r in receiver.to("/ok") if r.headers["webhook-id"] in sent]
        assert Counter(r.headers["webhook-id"] for r in first) == Counter(dict.fromkeys(sent, 1))
        one = first[0]
        assert json.loads(one.body)["text"] == "žluťoučký"
        assert one.headers["content-type"] == "application/json" and one.headers["customer-id"] == "c7"
        assert "password" not in one.headers, "a header the endpoint does not pass on was sent"
        assert all(r.status == 500 for r in receiver.to("/fail-until") if r.at < receiver.recover_at)
        tries = [r.at for r in receiver.to("/busy")]
        assert len(tries) == 2 and tries[1] - tries[0] >= 2.9, tries  # Retry-After: 3, not the 1 s schedule
        dead = errors(url)
        missing = dead[refused["missing"]]["headers"]
        assert (
            "404" in missing["duetime-error-message"] and "no hook here" in missing["duetime-error-message"]
        )
        for name in ("closed", "number", "redirect"):
            assert "may not reach" in dead[refused[name]]["error"], name
        assert not any(
            r.path.startswith("/ok") and r.headers["webhook-id"] in refused.values()
            for r in receiver.requests
        )
        received = json.loads(ok("queues", "receive", "orders", "--store", url).splitlines()[0])
        assert received["id"] == local
        # each endpoint's requests, by what they came to, as the metrics tell an operator
        assert requests[("hook.ok", "2xx")] == 20 and timed["hook.ok"] == 20
        assert requests[("hook.flaky", "2xx")] == 3 and requests[("hook.flaky", "5xx")] >= 3
        assert requests[("hook.busy", "4xx")] == 1 and requests[("hook.busy", "2xx")] == 1  # the 429
        assert requests[("hook.missing", "4xx")] == 1
        assert requests[("hook.closed", "address-refused")] == 1
        assert requests[("hook.number", "address-refused")] == 1


def webhook_metrics(port: int) -> tuple[Counter[tuple[str, str]], Counter[str]]:
    """From the run's metrics: each endpoint's requests by outcome, and how many were timed."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    requests: Counter[tuple[str, str]] = Counter()
    timed: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "duetime_webhook_requests_total":
                requests[(sample.labels["webhook"], sample.labels["outcome"])] += int(sample.value)
            elif sample.name == "duetime_webhook_request_seconds_count":
                timed[sample.labels["webhook"]] += int(sample.value)
    return requests, timed


def test_reset_and_black_holed_connections_are_retried_until_they_heal(tmp_path: Path) -> None:
    """A receiver behind the test's own proxy: connections refused (cut), then connections that
    open and never answer (a black hole, past the 2 s timeout); each is retried and delivered once
    the way heals, and nothing is refused for it."""
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with receiving(secret) as receiver:
        proxy = TcpProxy("127.0.0.1", receiver.port)
        try:
            ok("setup", "--store", url)
            add(url, "hook.behind", f"http://127.0.0.1:{proxy.port}/ok", secret, "--allow", "127.0.0.1",
                "--retry-schedule", ",".join(["1s"] * 30), "--timeout", "2", "--connect-timeout", "1")  # fmt: skip
            log = tmp_path / "run.log"
            run = spawn_run(duetime_cmd("run", "--store", url, "--route", ROUTE), log)
            try:
                wait_until_serving(log)
                proxy.cut()
                cut = {schedule(url, "hook.behind", f"cut {i}") for i in range(3)}
                until(lambda: "could not be reached" in log.read_text(), 20, "a refused connection retried")
                proxy.restore()
                until(lambda: set(receiver.delivered()) >= cut, 20, "delivered once the connections open")
                proxy.blackhole()
                held = {schedule(url, "hook.behind", f"held {i}") for i in range(3)}
                until(lambda: "did not answer in time" in log.read_text(), 20, "a black hole timed out")
                proxy.restore()
                until(lambda: set(receiver.delivered()) >= held, 30, "delivered once the black hole heals")
            finally:
                run.send_signal(signal.SIGTERM)
                run.wait(30)
        finally:
            proxy.close()
        assert errors(url) == {}


@pytest.mark.slow
def test_kill_9_while_delivering_to_rabbitmq_a_webhook_and_mqtt_by_route_loses_nothing(
    tmp_path: Path,
) -> None:
    """One `duetime run` delivers 1,000 messages each to a RabbitMQ queue, a webhook and an MQTT
    topic, by route; it is killed with SIGKILL twice on the way and started again: every id
    arrives at its receiver (a repeat is allowed, at-least-once; a receiver drops it by its id)."""
    require(RABBITMQ)
    require(MQTT)
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    queue = f"routes.{uuid.uuid4().hex[:8]}"
    topic = f"routes/{queue}"
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with receiving(secret) as receiver:
        try:
            ok("setup", "--store", url, "--transport", RABBITMQ, "--queue", queue)
            ok("queues", "declare", topic, "--transport", MQTT)
            add(url, "hook.orders", receiver.url("/ok"), secret, "--allow", "127.0.0.1")
            # 500 to MQTT: Mosquitto keeps at most 1,000 messages for a session nobody reads
            # (max_queued_messages), the repeats after a kill included. Due over 20 s: two
            # start-ups and kills take about 4 s, and up to 12 on a loaded machine (over 4 s, the
            # span it had, the kills came after the last webhook once under CI's load)
            lines = [
                json.dumps({"id": f"{d}-{i}", "destination": d, "body": f"m {i}", "delay": f"{i * 20}ms"})
                for i in range(1000)
                for d in (queue, "hook.orders", topic)
                if d != topic or i < 500
            ]
            (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
            ok("load", str(tmp_path / "m.jsonl"), "--store", url)
            routes = ("--route", ROUTE, "--route", f"routes/*={MQTT}")
            command = duetime_cmd("run", "--store", url, "--transport", RABBITMQ, *routes)
            for _ in range(2):
                log = tmp_path / "run.log"
                run = spawn_run(command, log)
                wait_until_serving(log)
                time.sleep(1.0)
                run.send_signal(signal.SIGKILL)
                run.wait(10)
            assert len(set(receiver.delivered())) < 1000, "the kills came after the last webhook"
            run = spawn_run(command, tmp_path / "last.log")
            try:
                wanted = {f"hook.orders-{i}" for i in range(1000)}
                until(lambda: set(receiver.delivered()) >= wanted, 60, "every webhook message")
                got = until(lambda: _drain(queue, 1000, RABBITMQ), 60, "every RabbitMQ message")
                published = until(lambda: _drain(topic, 500, MQTT), 60, "every MQTT message")
            finally:
                run.send_signal(signal.SIGTERM)
                run.wait(30)
            assert got == {f"{queue}-{i}" for i in range(1000)}
            assert published == {f"{topic}-{i}" for i in range(500)}
        finally:
            delete_rabbitmq_queues(queue)
            asyncio.run(_end_session(topic))


_seen: dict[str, set[str]] = {}


async def _end_session(topic: str) -> None:
    from duetime.backends.mqtt.transport import MqttTransport

    t = MqttTransport.from_url(MQTT)
    await t.delete(topic)
    await t.close()


def _drain(queue: str, count: int, transport: str) -> set[str] | None:
    """What arrived in ``queue`` so far (taken off it), once ``count`` ids have."""
    done = subprocess.run(
        duetime_cmd("queues", "receive", queue, "--transport", transport, "--count", "1000", "--wait", "1"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    seen = _seen.setdefault(queue, set())
    seen.update(json.loads(line)["id"] for line in done.stdout.splitlines() if line.strip())
    return seen if len(seen) >= count else None


def test_a_webhook_run_names_its_routes_and_never_a_secret(tmp_path: Path) -> None:
    """`duetime run` says where each route goes, the passwords in their URLs hidden; `webhooks
    list` shows how many secrets sign, never one."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    ok("setup", "--store", url)
    add(url, "hook.a", "https://hooks.example/in?token=s3cr3t-t0ken", secret)
    listed = ok("webhooks", "list", "--json", "--store", url)
    assert secret not in listed and "s3cr3t-t0ken" not in listed and '"secrets": 1' in listed
    done = run_cli("run", "--burst", "--store", url, "--route", "x.*=amqp://guest:pa55w0rd@127.0.0.1:1/")
    assert "pa55w0rd" not in done.stdout + done.stderr
    checked = run_cli(
        "check", "--store", url, "--route", ROUTE, "--route", "x.*=amqp://guest:pa55w0rd@127.0.0.1:1/"
    )
    assert checked.returncode == 1 and "cannot connect to amqp://" in checked.stderr
    assert "pa55w0rd" not in checked.stdout + checked.stderr and "Traceback" not in checked.stderr
    assert run_cli("check", "--store", url, "--route", ROUTE).stdout.startswith("ok:")
    bad = run_cli("run", "--burst", "--store", url, "--route", "no-equals-sign")
    assert bad.returncode != 0 and "a route is PATTERN=TRANSPORT_URL" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_receiver_helper_is_a_real_server() -> None:
    """The receiver answers over a real socket (a guard against a test passing with none)."""
    import http.client

    with receiving("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") as receiver:
        assert isinstance(receiver, Receiver)
        conn = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=5)
        conn.request("POST", "/ok", body=b"x")
        assert conn.getresponse().status == 401  # unsigned
        conn.close()


def test_every_bad_webhook_command_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    """What a careless hand types into `duetime webhooks`: each refused in one line, never a
    traceback, the store as it was; a secret read from standard input, and never printed."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    ok("setup", "--store", url)
    done = subprocess.run(
        duetime_cmd("webhooks", "add", "hook.in", "https://hooks.example/in", "--secret", "-", "--store", url),
        input=secret + "\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and secret not in done.stdout + done.stderr, done.stderr
    bad = {
        "a URL that is not http": ("webhooks", "add", "x", "ftp://hooks.example/"),
        "a URL with a password": ("webhooks", "add", "x", "https://u:p4ss@hooks.example/"),
        "a secret that is not one": ("webhooks", "add", "x", "https://hooks.example/", "--secret", "hunter2"),
        "a network that is not one": (
            "webhooks",
            "add",
            "x",
            "https://hooks.example/",
            "--allow",
            "10.0.0.0/99",
        ),
        "a header the request sets": (
            "webhooks",
            "add",
            "x",
            "https://hooks.example/",
            "--header",
            "Authorization",
        ),
        "a schedule that is not one": (
            "webhooks",
            "add",
            "x",
            "https://hooks.example/",
            "--retry-schedule",
            "soon",
        ),
        "a name that is not one": ("webhooks", "add", "a b", "https://hooks.example/"),
        "a pattern that is any host": ("webhooks", "add", "x", "https://*/hooks/*"),
        "a pattern with a wildcard inside its host": ("webhooks", "add", "x", "https://a.*.example/*"),
        "a pattern with a query": ("webhooks", "add", "x", "https://*.hooks.example/in?k=*"),
        "a name in use": ("webhooks", "add", "hook.in", "https://hooks.example/other"),
        "rotating one that is not there": ("webhooks", "rotate", "nobody"),
        "removing one that is not there": ("webhooks", "remove", "nobody"),
    }
    for why, args in bad.items():
        said = run_cli(*args, "--store", url)
        lines = [line for line in said.stderr.splitlines() if line.strip()]
        assert said.returncode != 0 and len(lines) == 1 and "Traceback" not in said.stderr, (why, said.stderr)
        assert "p4ss" not in said.stdout + said.stderr, why
    listed = [json.loads(line) for line in ok("webhooks", "list", "--json", "--store", url).splitlines()]
    assert [(w["name"], w["url"]) for w in listed] == [("hook.in", "https://hooks.example/in")]
    scheduled = run_cli("schedule", "hook.in", "x", "--in", "1h", "--store", url)
    assert scheduled.returncode == 0 and "warning" not in scheduled.stderr  # a webhook needs no queue
    ok("webhooks", "add", "partners", "https://*.partners.example/hooks/*", "--store", url)
    allowed = run_cli("schedule", "https://acme.partners.example/hooks/x", "x", "--in", "1h", "--store", url)
    assert allowed.returncode == 0 and "warning" not in allowed.stderr  # a pattern allows it: no queue
    stray = run_cli("schedule", "https://partners.example/hooks/x", "x", "--in", "1h", "--store", url)
    assert stray.returncode == 0 and "no webhook endpoint allows the URL" in stray.stderr, stray.stderr
    assert "queues declare" not in stray.stderr  # a URL is never a queue to declare
