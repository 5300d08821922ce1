"""duetime.Service inside an application's own process: a plain asyncio program, and a web app's
lifespan (Starlette's, which is FastAPI's) served by uvicorn. Each delivers what it is given and
stops cleanly when the program or the server ends: the batch in flight finished, no task left."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import duetime
from duetime.interfaces import ReceivedMessage


async def _receive(transport: Any, queue: str, seconds: float) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    for _ in range(int(seconds / 0.2)):
        got += await transport.receive(queue, 10, 0.2)
        if got:
            await transport.acknowledge(got)
            return got
    return got


def _leftover_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


async def test_a_service_in_an_asyncio_program_delivers_and_stops_cleanly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    before = _leftover_tasks()
    async with duetime.open_store(url) as store, duetime.open_transport(url) as transport:
        await transport.declare("orders")
        async with duetime.Service(store, transport, endpoint="shop") as service:
            client = await duetime.DelayedMessageClient(store, endpoint="shop").open()
            sent = await client.schedule("orders", b"ship it", delay=0.3)
            got = await _receive(transport, "orders", 10)
            assert [m.message_id for m in got] == [sent.message_id]
            assert service.dispatcher.started
        assert service.dispatcher.stopping and service.dispatcher.critical_error is None
        listed = await store.dispatchers()  # type: ignore[attr-defined]
        assert [d.endpoint for d in listed] == ["shop"]  # its heartbeat said it was there
    assert _leftover_tasks() <= before  # nothing of the service is left running


async def test_a_stopped_service_started_again_says_so(tmp_path: Path) -> None:
    """A Service that stopped does not start again silently and deliver nothing: it says to make
    a new one."""
    url = f"sqlite:///{tmp_path / 'again.db'}"
    async with duetime.open_store(url) as store, duetime.open_transport(url) as transport:
        service = duetime.Service(store, transport, endpoint="again")
        async with service:
            pass
        with pytest.raises(duetime.ConfigurationError, match="cannot be started again; make a new one"):
            await service.start()


async def test_a_service_in_a_web_apps_lifespan_serves_while_the_app_does(tmp_path: Path) -> None:
    """The lifespan FastAPI documents (``FastAPI(lifespan=...)``) is Starlette's: an endpoint
    schedules, the service delivers, and stopping the server stops the service."""
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    url = f"sqlite:///{tmp_path / 'web.db'}"
    store, transport = duetime.open_store(url), duetime.open_transport(url)
    services: list[duetime.Service] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await transport.declare("emails")
        async with duetime.Service(store, transport, endpoint="web") as service:
            services.append(service)
            app.state.client = await duetime.DelayedMessageClient(store, endpoint="web").open()
            yield
        await store.close()

    async def remind(request: Request) -> PlainTextResponse:
        sent = await request.app.state.client.schedule("emails", await request.body(), delay=0.2)
        return PlainTextResponse(sent.message_id)

    app = Starlette(routes=[Route("/remind", remind, methods=["POST"])], lifespan=lifespan)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    for _ in range(100):
        if server.started:
            break
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    asked = urllib.request.Request(f"http://127.0.0.1:{port}/remind", data=b"hello", method="POST")
    message_id = await asyncio.to_thread(lambda: urllib.request.urlopen(asked, timeout=10).read().decode())
    reader = duetime.open_transport(url)
    got = await _receive(reader, "emails", 10)
    assert [(m.message_id, m.body) for m in got] == [(message_id, b"hello")]
    server.should_exit = True
    await asyncio.wait_for(serving, 30)
    assert services[0].dispatcher.stopping and services[0].dispatcher.critical_error is None
    await reader.close()
    await transport.close()


class _NeverAnswers:
    """A delivery log whose writes never return (a database behind a partition)."""

    def __init__(self) -> None:
        self.calls = 0

    async def record(self, entries: Any) -> None:
        self.calls += 1
        await asyncio.Event().wait()

    async def close(self) -> None:
        return None


async def test_a_delivery_log_that_never_answers_delays_no_delivery_and_no_stop(tmp_path: Path) -> None:
    """Was: 1 of 10 delivered, and ``stop()`` never finished. The log's writes are its own task's:
    every message goes on time, one write is in flight (not one per batch), and the stop waits
    for it a few seconds at most."""
    import time

    url = f"sqlite:///{tmp_path / 'log.db'}"
    hung = _NeverAnswers()
    async with duetime.open_store(url) as store, duetime.open_transport(url) as transport:
        await transport.declare("orders")
        service = duetime.Service(store, transport, endpoint="logged", delivery_log=hung)  # type: ignore[arg-type]
        await service.start()
        client = await duetime.DelayedMessageClient(store, endpoint="logged").open()
        for i in range(10):
            await client.schedule("orders", b"x", delay=0.05 * i, message_id=f"m{i}")
        got: list[ReceivedMessage] = []
        for _ in range(100):
            got += await transport.receive("orders", 10, 0.1)
            if len(got) == 10:
                break
        assert sorted(m.message_id for m in got) == [f"m{i}" for i in range(10)]
        assert hung.calls == 1
        stopping = time.monotonic()
        service.stop()
        await asyncio.wait_for(service.wait(), 20)
        assert time.monotonic() - stopping < 10


#: (store, transport): a store's own queue shares its transaction; any other transport does not.
PAIRS = [
    ("sqlite", "same", "exactly-once"),
    ("sqlite", "other-file", "at-least-once"),
    ("postgresql", "same", "exactly-once"),
    ("postgresql", "redis", "at-least-once"),
    ("mariadb", "redis", "at-least-once"),
    ("redis", "redis", "at-least-once"),
]


@pytest.mark.parametrize(("kind", "to", "mode"), PAIRS, ids=[f"{k}-{t}" for k, t, _ in PAIRS])
async def test_duetime_run_and_a_service_given_one_pair_keep_one_promise(
    kind: str, to: str, mode: str, tmp_path: Path
) -> None:
    """The library decides the mode, not the command line: a Service embedded in a program
    delivers exactly-once wherever `duetime run` on the same store and transport does."""
    import uuid

    from tests.conftest import duetime_cmd, spawn_run, wait_until_serving
    from tests.services import REDIS, delete_redis_keys, require, store_url

    prefix = f"pair-{uuid.uuid4().hex[:8]}:"
    with store_url(kind, tmp_path) as url:
        transport_url = {
            "same": url,
            "other-file": f"sqlite:///{tmp_path / 'queues.db'}",
            "redis": f"{REDIS}?prefix={prefix}",
        }[to]
        if to == "redis":
            require(REDIS)
        try:
            async with duetime.open_store(url) as store, duetime.open_transport(transport_url) as transport:
                service = duetime.Service(store, transport, endpoint="pair")
                assert service.dispatcher.mode.value == mode
            log = tmp_path / "run.log"
            run = spawn_run(
                duetime_cmd("run", "--store", url, "--transport", transport_url, "--endpoint", "pair"), log
            )
            try:
                wait_until_serving(log)
            finally:
                run.terminate()
                run.wait(30)
            assert f", {mode}; Ctrl-C to stop" in log.read_text()
        finally:
            delete_redis_keys(prefix)
