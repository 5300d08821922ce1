"""Unit-test plumbing: a memory store that can be told to fail, and a dispatcher rig."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.errors import CriticalError
from duetime.interfaces import Claimed, DelayedMessageStore, Transport
from duetime.testing import FakeClock, FlakyTransport, settle


class FailingStore(MemoryStore):
    """A memory store whose operations fail while the matching flag is set."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_fetch = False
        self.fail_increment = False
        self.fail_store = False
        self.fail_remove = False

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        if self.fail_fetch:
            raise ConnectionError("database is down")
        return await super().fetch_due(at, limit)

    async def fetch_due_and_next(self, at: datetime, limit: int) -> Claimed:
        if self.fail_fetch:
            raise ConnectionError("database is down")
        return await super().fetch_due_and_next(at, limit)

    async def next_due(self) -> datetime | None:
        if self.fail_fetch:
            raise ConnectionError("database is down")
        return await super().next_due()

    async def increment_failure_count(self, message_id: str) -> bool:
        if self.fail_increment:
            raise ConnectionError("cannot count failures")
        return await super().increment_failure_count(message_id)

    async def release(self, message_ids: Sequence[str]) -> int:
        if self.fail_increment:
            raise ConnectionError("cannot release")
        return await super().release(message_ids)

    async def remove_many(self, message_ids: Sequence[str]) -> int:
        if self.fail_remove:
            raise ConnectionError("database is read-only")
        return await super().remove_many(message_ids)

    async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        if self.fail_store:
            raise ConnectionError("cannot store")
        return await super().store_many(messages)

    async def store(self, message: DelayedMessage) -> None:
        await self.store_many([message])


class Rig:
    """A dispatcher over a failing memory store and a flaky memory transport, on a fake clock."""

    def __init__(self, **settings: object) -> None:
        self.clock = FakeClock()
        self.store = FailingStore()
        self.queues = MemoryTransport()
        self.transport = FlakyTransport(self.queues)
        self.criticals: list[CriticalError] = []
        # On the fake clock a wake is exact: the tests say when, so no lateness budget unless asked.
        settings.setdefault("lateness_budget", timedelta(0))
        self.settings = DelayedDeliverySettings(**settings)  # type: ignore[arg-type]
        self.dispatcher = self.build(self.store, self.transport)
        self.task: asyncio.Task[None] | None = None

    def build(self, store: DelayedMessageStore, transport: Transport) -> Dispatcher:
        """A dispatcher over ``store`` and ``transport`` with the rig's clock and settings (it
        becomes the rig's dispatcher, for a test that needs a store or transport of its own)."""
        self.dispatcher = Dispatcher(
            store,
            transport,
            self.settings,
            endpoint="unit",
            clock=self.clock,
            on_critical_error=self.criticals.append,
        )
        return self.dispatcher

    async def setup(self, *queues: str) -> Rig:
        await self.store.setup_infrastructure("unit")
        await self.store.initialize("unit", TransactionMode.AT_LEAST_ONCE)
        for q in queues:
            await self.queues.declare(q)
        return self

    def message(self, i: int, in_seconds: float, destination: str = "orders") -> DelayedMessage:
        return DelayedMessage(f"m{i}", destination, self.clock.now() + timedelta(seconds=in_seconds), b"b")

    async def start(self) -> None:
        self.task = asyncio.create_task(self.dispatcher.run())
        await settle()

    async def tick(self, seconds: float, steps: int = 1) -> None:
        for _ in range(steps):
            self.clock.advance(seconds)
            await settle()

    def delivered(self, queue: str = "orders") -> list[str]:
        return [m.message_id for m in self.queues.messages(queue)]
