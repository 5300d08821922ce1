"""A delayed message store in a dict: the reference behaviour, not durable."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from duetime._bridge import AsyncStoreBridge
from duetime.backends.memory.transport import MemoryTransport
from duetime.errors import DuplicateMessageId, MessageInFlight, StoreNotReady
from duetime.interfaces import ListQuery, Moved, MoveOutcome, Page, StoreCounts
from duetime.message import DelayedMessage, check_due_time
from duetime.names import check_name
from duetime.settings import TransactionMode


@dataclass(slots=True)
class _Row:
    message: DelayedMessage
    claimed_until: datetime | None = None

    def claimable(self, at: datetime) -> bool:
        return self.claimed_until is None or self.claimed_until <= at


class SyncMemoryStore:
    """Thread-safe, in-process, gone when the process ends."""

    def __init__(self, claim_timeout: timedelta = timedelta(seconds=30)) -> None:
        self._rows: dict[str, _Row] = {}
        self._lock = threading.RLock()
        self._ready: set[str] = set()
        self.endpoint: str | None = None
        self.claim_timeout = claim_timeout

    def setup_infrastructure(self, endpoint: str) -> None:
        self._ready.add(check_name("endpoint", endpoint))

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        if check_name("endpoint", endpoint) not in self._ready:
            raise StoreNotReady()
        self.endpoint = endpoint

    def store(self, message: DelayedMessage) -> None:
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        with self._lock:
            seen: set[str] = set()
            for message in messages:
                if message.message_id in self._rows or message.message_id in seen:
                    raise DuplicateMessageId(
                        f"A delayed message with id {message.message_id!r} is already stored; "
                        "nothing from this call was stored. Choose a new id or cancel the old one."
                    )
                seen.add(message.message_id)
            for message in messages:
                self._rows[message.message_id] = _Row(message)
            return len(messages)

    def _due(self, at: datetime, limit: int) -> list[_Row]:
        due = [r for r in self._rows.values() if r.message.due_at <= at and r.claimable(at)]
        due.sort(key=lambda r: (r.message.due_at, r.message.message_id))
        return due[:limit]

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        at = check_due_time(at, "at")
        with self._lock:
            rows = self._due(at, limit)
            for row in rows:
                row.claimed_until = at + self.claim_timeout
            return [r.message for r in rows]

    def next_due(self) -> datetime | None:
        with self._lock:
            times = [
                max(r.message.due_at, r.claimed_until) if r.claimed_until else r.message.due_at
                for r in self._rows.values()
            ]
            return min(times, default=None)

    def remove(self, message_id: str) -> bool:
        with self._lock:
            return self._rows.pop(message_id, None) is not None

    def remove_many(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            return sum(self._rows.pop(i, None) is not None for i in message_ids)

    def increment_failure_count(self, message_id: str) -> bool:
        with self._lock:
            row = self._rows.get(message_id)
            if row is None:
                return False
            row.message = row.message.with_changes(failure_count=row.message.failure_count + 1)
            row.claimed_until = None
            return True

    def release(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            released = 0
            for message_id in message_ids:
                row = self._rows.get(message_id)
                if row is not None:
                    row.claimed_until = None
                    released += 1
            return released

    def get(self, message_id: str) -> DelayedMessage | None:
        with self._lock:
            row = self._rows.get(message_id)
            return None if row is None else row.message

    def _unclaimed(self, message_id: str, at: datetime) -> _Row | None:
        row = self._rows.get(message_id)
        if row is not None and not row.claimable(at):
            raise MessageInFlight(
                f"Message {message_id!r} is being forwarded right now; it cannot be changed."
            )
        return row

    def cancel(self, message_id: str) -> bool:
        with self._lock:
            row = self._unclaimed(message_id, _now())
            return row is not None and self._rows.pop(message_id, None) is not None

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due_at = check_due_time(due_at)
        with self._lock:
            row = self._unclaimed(message_id, _now())
            if row is None:
                return False
            row.message = row.message.with_changes(due_at=due_at)
            row.claimed_until = None
            return True

    def list(self, query: ListQuery) -> Page:
        with self._lock:
            rows = sorted(self._rows.values(), key=lambda r: (r.message.due_at, r.message.message_id))
            picked: list[DelayedMessage] = []
            for row in rows:
                m = row.message
                if query.after is not None and (m.due_at, m.message_id) <= query.after:
                    continue
                if query.destination is not None and m.destination != query.destination:
                    continue
                if query.due_before is not None and m.due_at >= query.due_before:
                    continue
                if query.due_after is not None and m.due_at < query.due_after:
                    continue
                if m.failure_count < query.min_failures:
                    continue
                picked.append(m)
                if len(picked) > query.limit:
                    break
            more = len(picked) > query.limit
            picked = picked[: query.limit]
            cursor = (picked[-1].due_at, picked[-1].message_id) if more and picked else None
            return Page(picked, cursor)

    def counts(self, at: datetime) -> StoreCounts:
        with self._lock:
            rows = list(self._rows.values())
            return StoreCounts(
                total=len(rows),
                due=sum(r.message.due_at <= at for r in rows),
                claimed=sum(not r.claimable(at) for r in rows),
                failing=sum(r.message.failure_count > 0 for r in rows),
                next_due=self.next_due(),
                by_destination=dict(Counter(r.message.destination for r in rows)),
            )

    def move_due(
        self,
        at: datetime,
        limit: int,
        transport: MemoryTransport,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome:
        """Claim, deliver and delete in one critical section: exactly-once within the process."""
        with self._lock, transport.lock:
            moved: list[Moved] = []
            dead: list[tuple[DelayedMessage, str]] = []
            for row in self._due(at, limit):
                message = row.message
                if transport.has_queue(message.destination):
                    transport.enqueue_locked(message.destination, message, None)
                    moved.append(Moved(message.message_id, message.destination, message.due_at))
                else:
                    reason = f"Destination {message.destination!r} does not exist."
                    transport.enqueue_locked(error_queue, message, error_headers(message, reason))
                    dead.append((message, reason))
                del self._rows[message.message_id]
            return MoveOutcome(moved, dead)

    def close(self) -> None:
        pass


def _now() -> datetime:
    from duetime.clock import SystemClock

    return SystemClock().now()


class MemoryStore(AsyncStoreBridge):
    """The async memory store; ``.sync`` is its blocking twin over the same data."""

    sync: SyncMemoryStore

    def __init__(self, claim_timeout: timedelta = timedelta(seconds=30)) -> None:
        super().__init__(SyncMemoryStore(claim_timeout), threaded=False, name="memory-store")

    def shares_transaction_with(self, transport: object) -> bool:
        return isinstance(transport, MemoryTransport)

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome:
        assert isinstance(transport, MemoryTransport)
        return self.sync.move_due(at, limit, transport, error_queue, error_headers)
