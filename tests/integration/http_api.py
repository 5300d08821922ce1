"""A `duetime serve` of a test's own, and a small HTTP client to call it (the standard library's,
so what is tested is the server, not a client library's manners)."""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import duetime_cmd, run_cli
from tests.services import free_port


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def problem_type(self) -> str:
        return str(self.body.get("type", "")) if isinstance(self.body, dict) else ""


class Api:
    """Calls over one keep-alive connection."""

    def __init__(self, port: int, key: str | None = None) -> None:
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: Any = None, key: str | None = None) -> Answer:
        headers = {"Accept": "application/json"}
        if (key or self.key) is not None:
            headers["Authorization"] = f"Bearer {key or self.key}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        answer = self.conn.getresponse()
        raw = answer.read()
        kind = answer.getheader("content-type") or ""
        parsed: Any = json.loads(raw) if raw and "json" in kind else raw
        return Answer(answer.status, {k.lower(): v for k, v in answer.getheaders()}, parsed)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def once(port: int, method: str, path: str, key: str | None = None, body: Any = None) -> Answer:
    """One call on a connection of its own."""
    with Api(port, key) as api:
        return api.call(method, path, body)


def make_key(store: str, name: str, scope: str = "schedule,read,manage", rate: str = "100") -> str:
    done = run_cli("api-keys", "create", name, "--scope", scope, "--rate", rate, "--store", store)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def serving(store: str, folder: Path, *extra: str, port: int | None = None) -> Iterator[int]:
    """`duetime serve` on ``port`` (default: a free one) of this machine, until the block ends;
    its port."""
    port = port or free_port()
    log = folder / f"serve-{port}-{uuid.uuid4().hex[:6]}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            duetime_cmd("serve", "--store", store, "--port", str(port), *extra),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while "HTTP API of" not in log.read_text(errors="replace"):
            assert process.poll() is None, f"duetime serve ended: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"duetime serve did not start: {log.read_text()[-2000:]}"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]
