"""A ``duetime dashboard`` process for a test: started on a store, asked over HTTP as a browser
would (with or without its login), and stopped."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import urllib.error
import urllib.request

from tests.conftest import duetime_cmd
from tests.services import until

PASSWORD = "correct horse"


def request(
    port: int,
    path: str,
    *,
    data: bytes | None = None,
    auth: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
) -> tuple[int, str]:
    """The status and text of a request to the dashboard (0 and why when nothing listens); a body
    is sent as a form unless ``headers`` say otherwise."""
    sent = {"Authorization": auth} if auth else {}
    if data is not None:
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    sent |= headers or {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:  # it holds the connection: closed here, not left to the garbage collector
            return error.code, error.read().decode()
    except OSError as error:  # not listening (yet)
        return 0, str(error)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def dashboard(
    url: str,
    port: int,
    *extra: str,
    endpoint: str = "shop",
    password: str | None = PASSWORD,
    settings: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The dashboard on ``url`` for ``endpoint``, serving on ``port`` once this returns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_DASHBOARD")} | (settings or {})
    if password:
        env["DUETIME_DASHBOARD_PASSWORD"] = password
    process = subprocess.Popen(
        duetime_cmd(
            "dashboard",
            "--store",
            url,
            "--endpoint",
            endpoint,
            "--port",
            str(port),
            "--sample-every",
            "1s",
            *extra,
        ),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    until(lambda: process.poll() is not None or request(port, "/healthz")[0] == 200, 30, "the dashboard")
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    return process


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, then what the dashboard wrote to its log (stderr), its pipe read and closed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=30)[1] or ""
