"""Closing a store or a transport while a call on its thread waits on a server that stopped
answering: the close waited behind that call for good, and Ctrl-C on `duetime queues receive`
during a network partition then hung, printing nothing. It now waits a bounded time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from duetime.backends import _on_a_thread
from duetime.backends._on_a_thread import AsyncQueueBridge, AsyncStoreBridge


class Stuck:
    """A blocking store or queue whose reads wait until released, as on a partitioned server."""

    def __init__(self) -> None:
        self.released, self.closed = threading.Event(), threading.Event()

    def queues(self) -> dict[str, int]:
        self.released.wait(30)
        return {}

    def next_due(self) -> None:
        self.released.wait(30)

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stuck]:
    monkeypatch.setattr(_on_a_thread, "CLOSE_WITHIN", 0.3)
    blocking = Stuck()
    yield blocking
    blocking.released.set()  # the threads end


async def closes_in_time(close: Any, call: asyncio.Future[Any], stuck: Stuck) -> None:
    await asyncio.sleep(0.1)  # the call is on the thread, waiting
    started = time.monotonic()
    await close()
    assert time.monotonic() - started < 2, "the close waited for the call stuck before it"
    assert not stuck.closed.is_set()
    stuck.released.set()  # the server answers after all: the call ends, then the close runs
    await asyncio.wait_for(call, 5)
    assert await asyncio.to_thread(stuck.closed.wait, 5)


async def test_a_transport_closes_while_a_call_waits_on_a_dead_server(stuck: Stuck) -> None:
    bridge = AsyncQueueBridge(lambda: stuck, name="stuck-queue")  # type: ignore[arg-type,return-value]
    await bridge.start()
    await closes_in_time(bridge.close, asyncio.ensure_future(bridge.has_queue("orders")), stuck)


async def test_a_store_closes_while_a_call_waits_on_a_dead_server(stuck: Stuck) -> None:
    bridge = AsyncStoreBridge(stuck, name="stuck-store")  # type: ignore[arg-type]
    await closes_in_time(bridge.close, asyncio.ensure_future(bridge.next_due()), stuck)


async def test_a_close_that_fails_in_time_still_says_so() -> None:
    class Failing(Stuck):
        def close(self) -> None:
            raise RuntimeError("the server said no")

    bridge = AsyncStoreBridge(Failing(), name="failing-store")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="the server said no"):
        await bridge.close()


async def test_a_close_that_itself_waits_on_a_dead_server_is_left_in_time(stuck: Stuck) -> None:
    """The close itself can wait: a PostgreSQL queue's close takes the lock its receiver holds
    while it sends LISTEN, and a LISTEN sent into a partition never returns."""

    class Holding(Stuck):
        def close(self) -> None:
            self.released.wait(30)
            self.closed.set()

    holding = Holding()
    bridge = AsyncQueueBridge(lambda: holding, name="holding-queue")  # type: ignore[arg-type,return-value]
    await bridge.start()
    started = time.monotonic()
    await bridge.close()
    assert time.monotonic() - started < 2 and not holding.closed.is_set()
    holding.released.set()
    assert await asyncio.to_thread(holding.closed.wait, 5)
