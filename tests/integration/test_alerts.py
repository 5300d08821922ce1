"""The alerts of ``deploy/prometheus-rules.yaml``: their promtool unit tests, and a real Prometheus
(Debian's) scraping a running ``duetime run`` whose alert fires when its condition is made true."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.services import free_port, require_program, until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus-rules.yaml"


def test_the_rules_are_valid_and_pass_their_unit_tests() -> None:
    require_program("promtool", "prometheus")
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout
    tested = subprocess.run(
        ["promtool", "test", "rules", "prometheus-rules.test.yaml"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def _json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return json.loads(answer.read())


def _firing(port: int, name: str) -> list[dict[str, str]]:
    alerts = _json(port, "/api/v1/alerts")["data"]["alerts"]
    return [a["labels"] for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A Prometheus of the test's own scraping a dispatcher's metrics port every second, with the
    rules as shipped; yields (Prometheus's port, the port it scrapes)."""
    require_program("prometheus", "prometheus")
    port, target = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: duetime\n    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
    )
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        until(lambda: _ready(port), 60, "Prometheus ready")
        yield port, target
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_a_real_prometheus_fires_an_alert_when_a_running_dispatcher_dead_letters(
    prometheus: tuple[int, int], tmp_path: Path
) -> None:
    port, target = prometheus
    store = f"sqlite:///{tmp_path / 'duetime.db'}"
    assert run_cli("setup", "--queue", "orders", "--store", store).returncode == 0
    log = tmp_path / "run.log"
    run = spawn_run(duetime_cmd("run", "--store", store, "--metrics-port", str(target)), log)
    try:
        wait_until_serving(log)

        def scraped() -> bool:
            targets = _json(port, "/api/v1/targets")["data"]["activeTargets"]
            return any(t["health"] == "up" for t in targets)

        until(scraped, 60, "Prometheus scraping the dispatcher")
        assert _firing(port, "DuetimeDeadLettered") == [] and _firing(port, "DuetimeDispatcherDown") == []
        # the condition made true: a message for a queue nobody declared goes to the error queue
        sent = run_cli("schedule", "nowhere", "lost", "--in", "0s", "--store", store)
        assert sent.returncode == 0, sent.stderr
        (fired,) = until(lambda: _firing(port, "DuetimeDeadLettered"), 60, "the alert firing")
        assert fired["destination"] == "nowhere" and fired["endpoint"] == "duetime"
        assert fired["severity"] == "ticket"
        assert _firing(port, "DuetimeDispatcherDown") == []
    finally:
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 0, log.read_text()
