"""A route that is down for longer than the dispatch breaker's time, as a user runs it: one
`duetime run` delivering to the store's own queue and, by route, to RabbitMQ through the test's own
proxy, which cuts every connection for a while. The other route keeps delivering on time, the run
does not end, and every message of the cut route arrives once the way is back."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.integration.proxy import TcpProxy
from tests.services import RABBITMQ, RABBITMQ_AT, delete_rabbitmq_queues, require, until


def ok(*args: str) -> str:
    done = run_cli(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def receive(queue: str, *where: str) -> set[str]:
    done = subprocess.run(
        duetime_cmd("queues", "receive", queue, *where, "--count", "1000", "--wait", "1"),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {json.loads(line)["id"] for line in done.stdout.splitlines() if line.strip()}


def test_a_route_down_past_the_breaker_holds_back_no_other_route_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require(RABBITMQ)
    monkeypatch.setenv("DUETIME_TIME_TO_TRIGGER_DISPATCH_CIRCUIT_BREAKER", "2s")
    monkeypatch.setenv("DUETIME_FAILURE_BACKOFF", "200ms")
    monkeypatch.setenv("DUETIME_MAX_FAILURE_BACKOFF", "1s")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    queue = f"routes.{uuid.uuid4().hex[:8]}"
    host, port = RABBITMQ_AT.rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    try:
        ok("setup", "--store", url, "--queue", "local")
        ok("queues", "declare", queue, "--transport", RABBITMQ)
        log = tmp_path / "run.log"
        run = spawn_run(duetime_cmd("run", "--store", url, "--route", f"routes.*={proxy.url(RABBITMQ)}"), log)
        try:
            wait_until_serving(log)
            proxy.cut()  # the route was reached at the start; from now on it is not
            lines = [
                json.dumps(
                    {"id": f"{d}-{i}", "destination": d, "body": f"m {i}", "delay": f"{2 + i * 0.1:.1f}s"}
                )
                for i in range(80)
                for d in ("local", queue)
            ]
            (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
            ok("load", str(tmp_path / "m.jsonl"), "--store", url)
            local: set[str] = set()
            started = time.monotonic()
            while time.monotonic() - started < 12:  # six times the breaker's time
                local |= receive("local", "--store", url)
                assert run.poll() is None, f"the run ended: {log.read_text()[-3000:]}"
            assert local == {f"local-{i}" for i in range(80)}, "the route that is up was held back"
            assert "cannot be reached" in log.read_text()
            assert receive(queue, "--transport", RABBITMQ) == set(), "sent while the route was cut"
            proxy.restore()
            got: set[str] = set()

            def all_arrived() -> bool:
                got.update(receive(queue, "--transport", RABBITMQ))
                return len(got) >= 80

            until(all_arrived, 30, "the cut route's messages once it is back")
            assert got == {f"{queue}-{i}" for i in range(80)}
            assert "reachable again" in log.read_text()
        finally:
            run.send_signal(signal.SIGTERM)
            assert run.wait(30) == 0, log.read_text()[-3000:]
        assert ok("errors", "list", "--json", "--store", url).strip() == ""
        text = log.read_text()
        assert "guest:guest" not in text and "CRITICAL" not in text
    finally:
        proxy.close()
        delete_rabbitmq_queues(queue)
