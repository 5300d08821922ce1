"""A delayed message store in a dict: the reference behaviour, not durable."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from duetime.backends._on_a_thread import AsyncStoreBridge
from duetime.backends._schedules import Planned
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    by_due,
    matches,
)
from duetime.backends.memory.transport import MemoryTransport
from duetime.interfaces import Clock, ListQuery, Moved, MoveOutcome, NextDue, StoreCounts
from duetime.message import DelayedMessage
from duetime.recurring.schedule import ScheduleRow


@dataclass(slots=True)
class _Row:
    message: DelayedMessage
    claimed_until: datetime | None = None
    #: Held back by a flow-control limit until ``claimed_until``: claimed by nobody.
    held: bool = False

    def claimable(self, at: datetime) -> bool:
        return self.claimed_until is None or self.claimed_until <= at

    def changeable(self, at: datetime) -> bool:
        """No claim holds it (a hold is none): a cancel or reschedule may change it."""
        return self.held or self.claimable(at)

    def free(self) -> None:
        self.claimed_until, self.held = None, False


class SyncMemoryStore(StoreRules):
    """Thread-safe, in-process, gone when the process ends."""

    def __init__(self, claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT, clock: Clock | None = None) -> None:
        super().__init__(claim_timeout=claim_timeout, clock=clock)
        self._rows: dict[str, _Row] = {}
        self._lock = threading.RLock()
        self._ready_endpoints: dict[str, int] = {}
        #: (endpoint, dispatcher id) -> (last seen, record JSON)
        self._presence: dict[tuple[str, str], tuple[datetime, str]] = {}
        #: (endpoint, key name) -> the key's record JSON
        self._keys: dict[tuple[str, str], str] = {}
        self._named: dict[tuple[str, str, str], str] = {}
        #: (endpoint, schedule id) -> its row
        self._schedules: dict[tuple[str, str], ScheduleRow] = {}

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SyncMemoryStore:
        """``memory://``: a new, empty store (nothing is shared between two of them)."""
        return cls(claim_timeout or DEFAULT_CLAIM_TIMEOUT)

    def _location(self, endpoint: str) -> str:
        return "in this process's memory"

    def _create(self, endpoint: str) -> None:
        self._ready_endpoints[endpoint] = SCHEMA_VERSION

    def _schema_version(self, endpoint: str) -> int | None:
        return self._ready_endpoints.get(endpoint)

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        with self._lock:
            for message in messages:
                if message.message_id in self._rows:
                    raise Duplicate(message.message_id)
            for message in messages:
                self._rows[message.message_id] = _Row(message)

    # --- recurring schedules ------------------------------------------------------------------
    def _schedule_insert(self, row: ScheduleRow) -> bool:
        key = (self._ready(), row.schedule_id)
        with self._lock:
            if key in self._schedules:
                return False
            self._schedules[key] = row._replace(version=0)
            return True

    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        endpoint = self._ready()
        written = []
        with self._lock:
            for row, ticks in changes:
                stored = self._schedules.get((endpoint, row.schedule_id))
                if stored is None or stored.version != row.version:
                    written.append(False)
                    continue
                self._schedules[(endpoint, row.schedule_id)] = row._replace(version=row.version + 1)
                for tick in ticks:
                    self._rows.setdefault(tick.message_id, _Row(tick))
                written.append(True)
        return written

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        with self._lock:
            return self._schedules.get((self._ready(), schedule_id))

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        endpoint = self._ready()
        with self._lock:
            rows = [r for (e, i), r in self._schedules.items() if e == endpoint and i > after]
        return sorted(rows, key=lambda r: r.schedule_id)[:limit]

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        endpoint = self._ready()
        with self._lock:
            rows = [
                r
                for (e, _), r in self._schedules.items()
                if e == endpoint and r.planned_until is not None and r.planned_until <= until
            ]
        return sorted(rows, key=lambda r: (r.planned_until, r.schedule_id))[:limit]

    def _schedule_delete(self, schedule_id: str) -> bool:
        with self._lock:
            return self._schedules.pop((self._ready(), schedule_id), None) is not None

    def _due(self, at: datetime, limit: int) -> list[_Row]:
        due = [r for r in self._rows.values() if r.message.due_at <= at and r.claimable(at)]
        due.sort(key=lambda r: (r.message.due_at, r.message.message_id))
        return due[:limit]

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        with self._lock:
            rows = self._due(at, limit)
            for row in rows:
                row.claimed_until, row.held = until, False
            return [r.message for r in rows]

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        with self._lock:  # one step: nothing stored or claimed in between
            return self._claim(at, until, limit), NextDue(self._next_due())

    def _next_due(self) -> datetime | None:
        with self._lock:
            times = [
                max(r.message.due_at, r.claimed_until) if r.claimed_until else r.message.due_at
                for r in self._rows.values()
            ]
            return min(times, default=None)

    def _delete(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            return sum(self._rows.pop(i, None) is not None for i in message_ids)

    def _fail(self, message_id: str) -> bool:
        with self._lock:
            row = self._rows.get(message_id)
            if row is None:
                return False
            row.message = row.message.with_changes(failure_count=row.message.failure_count + 1)
            row.free()
            return True

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        with self._lock:
            row = self._rows.get(message_id)
            if row is None:
                return False
            changes = {"failure_count": row.message.failure_count + 1, "due_at": due_at}
            row.message = row.message.with_changes(**changes)
            row.free()
            return True

    def _release(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            released = 0
            for message_id in message_ids:
                row = self._rows.get(message_id)
                if row is not None:
                    row.free()
                    released += 1
            return released

    def _hold(self, until: Mapping[str, datetime]) -> int:
        with self._lock:
            held = 0
            for message_id, at in until.items():
                row = self._rows.get(message_id)
                if row is not None:
                    row.claimed_until, row.held = at, True
                    held += 1
            return held

    def _release_held(self) -> int:
        with self._lock:
            held = [r for r in self._rows.values() if r.held]
            for row in held:
                row.free()
            return len(held)

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        changed = 0
        with self._lock:
            for old, new in pairs:
                row = self._rows.get(old.message_id)
                if row is None or (row.claimed_until is not None and not row.held):
                    continue
                if (row.message.body, dict(row.message.headers)) == (old.body, dict(old.headers)):
                    row.message = replace(row.message, body=new.body, headers=new.headers)
                    changed += 1
        return changed

    def _get(self, message_id: str) -> DelayedMessage | None:
        with self._lock:
            row = self._rows.get(message_id)
            return None if row is None else row.message

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        with self._lock:
            row = self._rows.get(message_id)
            if row is None or not row.changeable(now):
                return False
            del self._rows[message_id]
            return True

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        with self._lock:
            gone = [i for i, r in self._rows.items() if r.message.group == group and r.changeable(now)]
            for message_id in gone[:limit]:
                del self._rows[message_id]
            return len(gone[:limit])

    def _count_group(self, group: str) -> int:
        with self._lock:
            return sum(1 for r in self._rows.values() if r.message.group == group)

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        with self._lock:
            row = self._rows.get(message_id)
            if row is None or not row.changeable(now):
                return False
            row.message = row.message.with_changes(due_at=due_at)
            row.free()
            return True

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        with self._lock:
            row = self._rows.get(message.message_id)
            if row is None or (
                row.claimed_until is not None and not row.held
            ):  # a lapsed claim's sender may still settle it
                return False
            row.message = message
            return True

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        with self._lock:
            self._presence[(endpoint, dispatcher_id)] = (seen_at, info)

    def _presences(self, endpoint: str) -> list[str]:
        with self._lock:
            return [info for (e, _), (_, info) in self._presence.items() if e == endpoint]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        with self._lock:
            for key, (seen, _) in list(self._presence.items()):
                if key[0] == endpoint and seen < seen_before:
                    del self._presence[key]

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        with self._lock:
            if (endpoint, name) in self._keys:
                return False
            self._keys[(endpoint, name)] = info
            return True

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        with self._lock:
            if (endpoint, name) not in self._keys:
                return False
            self._keys[(endpoint, name)] = info
            return True

    def _key_records(self, endpoint: str) -> list[str]:
        with self._lock:
            return [info for (e, name), info in sorted(self._keys.items()) if e == endpoint]

    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        with self._lock:
            if (endpoint, kind, name) in self._named:
                return False
            self._named[(endpoint, kind, name)] = info
            return True

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        with self._lock:
            if (endpoint, kind, name) not in self._named:
                return False
            self._named[(endpoint, kind, name)] = info
            return True

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        with self._lock:
            return self._named.pop((endpoint, kind, name), None) is not None

    def _records(self, endpoint: str, kind: str) -> list[str]:
        with self._lock:
            return [info for (e, k, _), info in sorted(self._named.items()) if (e, k) == (endpoint, kind)]

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        with self._lock:
            current = self._named.get((endpoint, kind, name))
            if current != old:
                return False, current
            self._named[(endpoint, kind, name)] = new
            return True, None

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        with self._lock:
            messages = by_due([r.message for r in self._rows.values()])
        return [m for m in messages if matches(query, m)][:limit]

    def _count(self, at: datetime) -> StoreCounts:
        with self._lock:
            rows = list(self._rows.values())
        return StoreCounts(
            total=len(rows),
            due=sum(r.message.due_at <= at for r in rows),
            claimed=sum(not r.claimable(at) and not r.held for r in rows),
            failing=sum(r.message.failure_count > 0 for r in rows),
            next_due=None,
            by_destination=dict(Counter(r.message.destination for r in rows)),
            held=sum(r.held and not r.claimable(at) for r in rows),
        )

    def move_due(
        self,
        at: datetime,
        limit: int,
        transport: MemoryTransport,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome:
        """Claim, deliver and delete in one critical section: exactly-once within the process.
        Only what is due at ``at``: the memory queues have no time a message becomes visible, so
        ``until`` (a move made ahead) is not taken up."""
        with self._lock, transport.lock:
            moved: list[Moved] = []
            dead: list[tuple[DelayedMessage, str]] = []
            for row in self._due(at, limit):
                message = row.message
                if transport.declared_locked(message.destination):
                    transport.enqueue_locked(message.destination, message, None)
                    moved.append(
                        Moved(
                            message.message_id,
                            message.destination,
                            message.due_at,
                            message.headers.get("traceparent"),
                        )
                    )
                else:
                    reason = f"Destination {message.destination!r} does not exist."
                    transport.enqueue_locked(error_queue, message, error_headers(message, reason))
                    dead.append((message, reason))
                del self._rows[message.message_id]
            return MoveOutcome(moved, dead, self._next_due_after_move())


class MemoryStore(AsyncStoreBridge):
    """The async memory store; ``.sync`` is its blocking twin over the same data."""

    sync: SyncMemoryStore

    def __init__(self, claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT, clock: Clock | None = None) -> None:
        super().__init__(SyncMemoryStore(claim_timeout, clock), threads=0, name="memory-store")

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> MemoryStore:
        """``memory://``: a new, empty store (nothing is shared between two of them)."""
        return cls(claim_timeout or DEFAULT_CLAIM_TIMEOUT)

    def shares_transaction_with(self, transport: object) -> bool:
        return isinstance(transport, MemoryTransport)

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome:
        assert isinstance(transport, MemoryTransport)
        return self.sync.move_due(at, limit, transport, error_queue, error_headers)
