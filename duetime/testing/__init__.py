"""Test helpers that ship with duetime: a fake clock and a transport that fails on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from duetime.interfaces import Transport
from duetime.message import DelayedMessage


class FakeClock:
    """Time that moves only when a test calls :meth:`advance`; waits resolve as time passes."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._mono = 0.0
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        for deadline, future in list(self._waiters):
            if deadline <= self._mono and not future.done():
                future.set_result(None)
        self._waiters = [(d, f) for d, f in self._waiters if not f.done()]

    @property
    def sleepers(self) -> int:
        """How many waits are pending (so a test can tell the dispatcher went to sleep)."""
        return sum(not f.done() for _, f in self._waiters)

    async def wait(self, event: asyncio.Event, timeout: float, *, slack: float = 0.0) -> bool:
        if event.is_set():
            return True
        if timeout <= 0:
            return False
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._mono + timeout, timer))
        fired: asyncio.Future[None] = asyncio.ensure_future(_wait_event(event))
        try:
            await asyncio.wait([timer, fired], return_when=asyncio.FIRST_COMPLETED)
        finally:
            fired.cancel()
            if not timer.done():
                timer.cancel()
        return event.is_set()

    async def sleep(self, seconds: float) -> None:
        await self.wait(asyncio.Event(), seconds)


class FlakyTransport:
    """Wraps a transport; ``fail`` decides per message whether to fail it (and with what)."""

    def __init__(
        self, inner: Transport, fail: Callable[[DelayedMessage], Exception | None] | None = None
    ) -> None:
        self.inner = inner
        self.fail = fail or (lambda _m: None)
        self.down: Exception | None = None
        self.attempts = 0

    async def start(self) -> None:
        await self.inner.start()

    async def declare(self, queue: str) -> None:
        await self.inner.declare(queue)

    async def close(self) -> None:
        await self.inner.close()

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        self.attempts += 1
        if self.down is not None:
            raise self.down
        results: list[Exception | None] = [self.fail(m) for m in messages]
        passing = [m for m, r in zip(messages, results, strict=True) if r is None]
        inner = iter(await self.inner.send_batch(passing) if passing else [])
        return [r if r is not None else next(inner) for r in results]


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()


async def settle(rounds: int = 20) -> None:
    """Let other tasks run until they block (no real sleeping)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
