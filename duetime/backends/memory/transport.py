"""An in-memory queue transport with the consumer API: for unit tests and examples."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from duetime.errors import DestinationNotFound
from duetime.inputs.identifiers import check_name
from duetime.interfaces import AsyncClosing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers


class MemoryTransport(AsyncClosing):
    """Queues must be declared (as on a broker); sending to an undeclared one fails the message."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._queues: dict[str, OrderedDict[str, ReceivedMessage]] = {}
        self._in_flight: dict[str, ReceivedMessage] = {}
        self._arrived = asyncio.Event()

    @classmethod
    def from_url(cls, url: str) -> MemoryTransport:
        """``memory://``: new, empty queues in this process."""
        return cls()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def declare(self, queue: str) -> None:
        with self.lock:
            self._queues.setdefault(check_name("queue", queue), OrderedDict())

    def declared_locked(self, queue: str) -> bool:
        """Whether ``queue`` is declared; the caller holds ``lock``."""
        return queue in self._queues

    def enqueue_locked(self, queue: str, message: DelayedMessage, headers: Mapping[str, str] | None) -> None:
        """Append to a queue; the caller holds ``lock``. The error queue is declared on demand."""
        target = self._queues.setdefault(queue, OrderedDict())
        key = uuid.uuid4().hex
        sent = dict(headers) if headers is not None else outgoing_headers(message)
        target[key] = ReceivedMessage(queue, message.message_id, sent, message.body, key, 0)
        self._arrived.set()

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        results: list[Exception | None] = []
        with self.lock:
            for message in messages:
                if message.destination not in self._queues:
                    results.append(DestinationNotFound(f"Queue {message.destination!r} does not exist."))
                    continue
                self.enqueue_locked(message.destination, message, None)
                results.append(None)
        return results

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        if done:
            await self.acknowledge(done)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            with self.lock:
                items = self._queues.get(queue)
                taken: list[ReceivedMessage] = []
                while items and len(taken) < max_messages:
                    key, item = items.popitem(last=False)
                    taken.append(self._hand_out(key, item))
                if taken or loop.time() >= deadline:
                    return taken
                self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - loop.time()))

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        with self.lock:
            return sum(self._in_flight.pop(m.receipt, None) is not None for m in messages)

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        with self.lock:
            return list(self._queues.get(queue, OrderedDict()).values())[:limit]

    def _hand_out(self, key: str, item: ReceivedMessage) -> ReceivedMessage:
        """Move a message from its queue to in flight; the caller holds ``lock``."""
        out = ReceivedMessage(
            item.queue, item.message_id, item.headers, item.body, key, item.delivery_count + 1
        )
        self._in_flight[key] = out
        return out

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        wanted = set(message_ids)
        with self.lock:
            items = self._queues.get(queue, OrderedDict())
            keys = [k for k, item in items.items() if item.message_id in wanted]
            return [self._hand_out(k, items.pop(k)) for k in keys]

    async def queues(self) -> dict[str, int]:
        with self.lock:
            return {name: len(items) for name, items in sorted(self._queues.items())}

    async def has_queue(self, queue: str) -> bool:
        with self.lock:
            return queue in self._queues

    async def depth(self, queue: str) -> int:
        with self.lock:
            return len(self._queues.get(queue, ()))

    def messages(self, queue: str) -> list[ReceivedMessage]:
        """Everything waiting in ``queue`` (tests)."""
        with self.lock:
            return list(self._queues.get(queue, OrderedDict()).values())
