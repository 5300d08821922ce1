"""The files in deploy/ as an operator uses them: the systemd unit verified by systemd and its
commands run as systemd would run them; the Kubernetes manifest checked against the API schema and
its containers' commands run against the real PostgreSQL and RabbitMQ; both stopped with SIGTERM.

What the Dockerfile copies and installs is checked against the project here; the image itself is
built and run by tests/image (CI's second step, scripts/test-image.sh)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tomllib
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.conftest import run_cli
from tests.services import RABBITMQ, free_port, postgres_schema, require, require_program

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DUETIME = str(Path(sys.executable).parent / "duetime")


def _serve_and_stop(args: list[str], env: dict[str, str], cwd: Path, grace: float, check: Any) -> None:
    """Start the service command, let ``check`` prove it delivers, then SIGTERM: exit 0 in time."""
    proc = subprocess.Popen(
        args, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        check()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"still running {grace} s after SIGTERM") from None
    log = proc.stdout.read() if proc.stdout else ""
    assert code == 0, log
    assert "Traceback" not in log, log


def _delivered(queue: str, env: dict[str, str], cwd: Path) -> None:
    got = run_cli("queues", "receive", queue, "--count", "1", "--wait", "15", cwd=cwd, env=env)
    assert got.returncode == 0 and '"body": "hello"' in got.stdout, got.stdout + got.stderr


def _unit() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (DEPLOY / "duetime.service").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def test_the_systemd_unit_verifies_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    analyze = require_program("systemd-analyze", "systemd")
    text = (DEPLOY / "duetime.service").read_text()
    local = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.M)
    local = local.replace("/opt/duetime/.venv/bin/duetime", DUETIME).replace(
        "/var/lib/duetime", str(tmp_path)
    )
    (tmp_path / "duetime.service").write_text(local)
    verified = subprocess.run(
        [analyze, "verify", str(tmp_path / "duetime.service")], capture_output=True, text=True
    )
    assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr

    unit = _unit()
    assert unit["Restart"] == ["on-failure"] and unit["KillSignal"] == ["SIGTERM"]  # exit 3 restarts
    env = dict(v.split("=", 1) for v in unit["Environment"])
    env["DUETIME_STORE"] = env["DUETIME_STORE"].replace("/var/lib/duetime", str(tmp_path))
    setup = run_cli(*unit["ExecStartPre"][0].split()[1:], cwd=tmp_path, env=env)
    assert setup.returncode == 0, setup.stderr
    assert run_cli("queues", "declare", "orders", cwd=tmp_path, env=env).returncode == 0
    assert run_cli("schedule", "orders", "hello", "--in", "1s", cwd=tmp_path, env=env).returncode == 0
    start = unit["ExecStart"][0].replace("/opt/duetime/.venv/bin/duetime", DUETIME).split()
    grace = float(unit["TimeoutStopSec"][0])
    _serve_and_stop(start, env, tmp_path, grace, lambda: _delivered("orders", env, tmp_path))


def test_the_kubernetes_manifest_is_valid_and_its_containers_work(tmp_path: Path) -> None:
    import kubernetes_validate

    require(RABBITMQ)
    deployment = yaml.safe_load((DEPLOY / "kubernetes.yaml").read_text())
    kubernetes_validate.validate(deployment, "1.30.0", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [main] = pod["containers"]
    env_names = {e["name"]: e for e in main["env"]}
    assert env_names["DUETIME_METRICS_HOST"]["value"] == "0.0.0.0"
    [port] = [p for p in main["ports"] if p["name"] == "metrics"]
    assert env_names["DUETIME_METRICS_PORT"]["value"] == str(port["containerPort"])
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    queue = f"k8s-{uuid.uuid4().hex[:8]}"
    with postgres_schema() as store:
        secret = {"store": store, "transport": RABBITMQ}
        env = {
            e["name"]: e.get("value") or secret[e["valueFrom"]["secretKeyRef"]["key"]] for e in main["env"]
        }
        env["DUETIME_METRICS_PORT"] = str(free_port())  # the pod's port may be taken on this machine
        assert run_cli(*init["args"], cwd=tmp_path, env=env).returncode == 0
        assert run_cli("queues", "declare", queue, cwd=tmp_path, env=env).returncode == 0
        try:
            assert run_cli("schedule", queue, "hello", "--in", "1s", cwd=tmp_path, env=env).returncode == 0

            def works() -> None:
                _delivered(queue, env, tmp_path)  # running by now, its port open
                for probe in ("livenessProbe", "readinessProbe"):
                    get = main[probe]["httpGet"]
                    address = f"http://127.0.0.1:{env['DUETIME_METRICS_PORT']}{get['path']}"
                    with urllib.request.urlopen(address, timeout=main[probe]["timeoutSeconds"]) as answer:
                        assert answer.status == 200, probe

            _serve_and_stop(
                [DUETIME, *main["args"]], env, tmp_path, pod["terminationGracePeriodSeconds"], works
            )
        finally:
            _delete_queue(queue)
        nowhere = (
            urlsplit(store)._replace(netloc=f"postgres@127.0.0.1:{free_port()}").geturl()
        )  # nobody there
        unready = run_cli("check", cwd=tmp_path, env={**env, "DUETIME_STORE": nowhere})
        assert unready.returncode == 1 and "cannot connect" in unready.stderr


def _delete_queue(queue: str) -> None:
    import asyncio

    from duetime.backends.rabbitmq import RabbitMqTransport

    async def go() -> None:
        async with RabbitMqTransport.from_url(RABBITMQ) as t:
            await t.delete(queue)

    asyncio.run(go())


def test_the_dockerfile_copies_what_exists_and_runs_the_tested_command() -> None:
    lines = [line.strip() for line in (DEPLOY / "Dockerfile").read_text().splitlines()]
    copied = [part for line in lines if line.startswith("COPY ") for part in line.split()[1:-1]]
    assert copied and all((ROOT / part).exists() for part in copied), copied
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    [install] = [line for line in lines if "pip install" in line]
    wanted = re.search(r'"\.\[([^\]]+)\]"', install)
    assert wanted and set(wanted.group(1).split(",")) <= extras
    assert 'ENTRYPOINT ["duetime"]' in lines and 'CMD ["run"]' in lines  # exec form: PID 1 gets SIGTERM
