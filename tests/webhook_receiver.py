"""A webhook receiver of a test's own: an ASGI app under uvicorn on a thread, checking each
request's signature with the ``standardwebhooks`` library (as a receiver in any language would)
and answering as the test says, per path:

- ``/ok/...``: 200;
- ``/fail-until/...``: 500 until :attr:`Receiver.recover_at` (a time.monotonic()), then 200;
- ``/busy/...``: 429 with ``Retry-After: 3`` on an id's first request, then 200;
- ``/missing/...``: 404 with a body;
- ``/redirect?to=URL``: 302 to ``URL``;
- ``/slow/...``: 200 after :attr:`Receiver.slow_seconds`, counting the requests in flight at
  once (:attr:`Receiver.most_at_once`).

Every request is kept (:attr:`Receiver.requests`); :meth:`Receiver.delivered` is the ids it took
(a 2xx answer), each once per take, so a test counts repeats.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.services import free_port


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int
    verified: bool


class Receiver:
    def __init__(self, secret: str, host: str = "127.0.0.1") -> None:
        self.secret = secret
        self.host = host
        self.port = free_port()
        self.requests: list[Request] = []
        self.recover_at = 0.0
        self.lock = threading.Lock()
        self._busy_seen: set[str] = set()
        self.slow_seconds = 0.2
        self.at_once = 0
        self.most_at_once = 0

    def url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    def delivered(self) -> list[str]:
        with self.lock:
            return [r.headers.get("webhook-id", "") for r in self.requests if 200 <= r.status < 300]

    def to(self, prefix: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path.startswith(prefix)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"]
        verified = self.verify(body, headers)
        if path.startswith("/slow"):
            with self.lock:
                self.at_once += 1
                self.most_at_once = max(self.most_at_once, self.at_once)
            try:
                await asyncio.sleep(self.slow_seconds)
            finally:
                with self.lock:
                    self.at_once -= 1
        status, extra, answer = self._answer(path, headers, scope.get("query_string", b"").decode())
        if not verified:
            status, answer = 401, b"bad signature"
        with self.lock:
            self.requests.append(Request(path, headers, body, time.monotonic(), status, verified))
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": answer})

    def verify(self, body: bytes, headers: dict[str, str]) -> bool:
        """The library's check; a body that is not UTF-8 (which the Python library cannot take,
        though the specification signs bytes) by the specification's own steps."""
        try:
            Webhook(self.secret).verify(body, headers, json_parse=False)
            return True
        except WebhookVerificationError:
            return False
        except UnicodeDecodeError:
            key = base64.b64decode(self.secret.removeprefix("whsec_"))
            signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
            expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
            return any(hmac.compare_digest(expected, g) for g in given)

    def _answer(self, path: str, headers: dict[str, str], query: str) -> tuple[int, list[Any], bytes]:
        if path.startswith("/fail-until"):
            return (200, [], b"ok") if time.monotonic() >= self.recover_at else (500, [], b"down for now")
        if path.startswith("/busy"):
            key = headers.get("webhook-id", "")
            with self.lock:
                first = key not in self._busy_seen
                self._busy_seen.add(key)
            return (429, [(b"retry-after", b"3")], b"slow down") if first else (200, [], b"ok")
        if path.startswith("/missing"):
            return 404, [], b"no hook here: " + b"x" * 3000
        if path.startswith("/redirect"):
            to = parse_qs(query).get("to", ["/"])[0]
            return 302, [(b"location", to.encode())], b""
        return 200, [], b"ok"


@contextmanager
def receiving(secret: str, host: str = "127.0.0.1") -> Iterator[Receiver]:
    """A receiver listening on ``host`` (0.0.0.0 for every loopback address) until the block ends."""
    receiver = Receiver(secret, "127.0.0.1" if host == "0.0.0.0" else host)
    config = uvicorn.Config(receiver, host=host, port=receiver.port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise AssertionError("the webhook receiver did not start")
        time.sleep(0.02)
    try:
        yield receiver
    finally:
        server.should_exit = True
        thread.join(10)
