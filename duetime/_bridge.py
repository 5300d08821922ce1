"""Async stores built on a blocking twin, so each backend's logic is written once.

The sync class is the real implementation (producers, web apps and Spark executors use it
directly); :class:`AsyncStoreBridge` runs its calls where they may block without stalling the
event loop, and tells wake-up subscribers about newly stored due times.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from duetime.interfaces import ListQuery, Page, StoreCounts, SyncDelayedMessageStore, WakeupCallback
from duetime.message import DelayedMessage
from duetime.settings import TransactionMode

T = TypeVar("T")
log = logging.getLogger("duetime.store")


class Subscribers:
    """Wake-up callbacks; a failing callback is never allowed to fail a store call."""

    def __init__(self) -> None:
        self._callbacks: list[WakeupCallback] = []

    def add(self, callback: WakeupCallback) -> Callable[[], None]:
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def notify(self, due: datetime | None) -> None:
        for callback in list(self._callbacks):
            try:
                callback(due)
            except Exception:  # a subscriber's bug must not fail a store that already committed
                log.exception("a wake-up subscriber failed")


class AsyncStoreBridge:
    """The async store contract over a sync store. ``threaded=False`` runs calls inline."""

    def __init__(self, sync: SyncDelayedMessageStore, *, threaded: bool, name: str) -> None:
        self.sync = sync
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name) if threaded else None
        self.subscribers = Subscribers()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def setup_infrastructure(self, endpoint: str) -> None:
        await self._call(self.sync.setup_infrastructure, endpoint)

    async def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        await self._call(self.sync.initialize, endpoint, mode)

    async def store(self, message: DelayedMessage) -> None:
        await self._call(self.sync.store, message)
        self.subscribers.notify(message.due_at)

    async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        count = await self._call(self.sync.store_many, list(messages))
        if messages:
            self.subscribers.notify(min(m.due_at for m in messages))
        return count

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        return await self._call(self.sync.fetch_due, at, limit)

    async def next_due(self) -> datetime | None:
        return await self._call(self.sync.next_due)

    async def remove(self, message_id: str) -> bool:
        return await self._call(self.sync.remove, message_id)

    async def remove_many(self, message_ids: Sequence[str]) -> int:
        return await self._call(self.sync.remove_many, list(message_ids))

    async def increment_failure_count(self, message_id: str) -> bool:
        return await self._call(self.sync.increment_failure_count, message_id)

    async def release(self, message_ids: Sequence[str]) -> int:
        return await self._call(self.sync.release, list(message_ids))

    async def get(self, message_id: str) -> DelayedMessage | None:
        return await self._call(self.sync.get, message_id)

    async def cancel(self, message_id: str) -> bool:
        return await self._call(self.sync.cancel, message_id)

    async def reschedule(self, message_id: str, due_at: datetime) -> bool:
        done = await self._call(self.sync.reschedule, message_id, due_at)
        if done:
            self.subscribers.notify(due_at)
        return done

    async def list(self, query: ListQuery) -> Page:
        return await self._call(self.sync.list, query)

    async def counts(self, at: datetime) -> StoreCounts:
        return await self._call(self.sync.counts, at)

    def subscribe(self, callback: WakeupCallback) -> Callable[[], None]:
        return self.subscribers.add(callback)

    async def close(self) -> None:
        await self._call(self.sync.close)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
