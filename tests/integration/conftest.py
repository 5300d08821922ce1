"""Shared by the integration tests: the brokers (a transport of a test's own on RabbitMQ, Redis or
NATS), and Debian's Chromium, driven by Playwright (nothing downloaded), for the dashboard's tests."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import NATS, RABBITMQ, REDIS, require, require_program

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Chromium on a closed network: no background connections, no sandbox (tests run as root here).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for a test module."""
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        require_program("chromium", "chromium")
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


async def open_broker(kind: str) -> Any:
    tag = uuid.uuid4().hex[:8]
    if kind == "rabbitmq":
        from duetime.backends.rabbitmq import RabbitMqTransport

        require(RABBITMQ)
        t: Any = RabbitMqTransport.from_url(RABBITMQ)
    elif kind.startswith("redis"):
        from duetime.backends.redis import RedisTransport

        require(REDIS)
        t = RedisTransport.from_url(f"{REDIS}?mode={kind.split('-')[1]}&prefix=duetime-e2e-{tag}:")
    else:
        from duetime.backends.nats import NatsTransport

        require(NATS)
        t = NatsTransport.from_url(f"{NATS}?subject_prefix=duetime-e2e-{tag}.")
    await t.start()
    return t


async def cleanup(kind: str, t: Any) -> None:
    if kind.startswith("redis"):
        keys = [k async for k in t.redis.scan_iter(match=f"{t.prefix}*")]
        if keys:
            await t.redis.delete(*keys)
    else:
        for queue in list(t.declared):
            await t.delete(queue)
    await t.close()


@pytest.fixture
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Any]]:
    """(kind, transport) on a real broker, of the kind a test names with
    ``@pytest.mark.parametrize("broker", [...], indirect=True)``; its queues removed after."""
    t = await open_broker(request.param)
    yield request.param, t
    await cleanup(request.param, t)
