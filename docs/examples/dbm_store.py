"""A delayed message store of your own, on Python's ``dbm``: a small example of the store kit.

:class:`~duetime.backends.StoreRules` holds every rule of the store contract (ids, the in-flight
rule, errors, paging, shared commits); a store supplies only where rows live. Here each message is
one key of a ``dbm`` file, its row a JSON text. The whole file is read for every question, so it
suits thousands of messages, not millions; a lock makes it safe for one process's threads (a
``dbm`` file is not for several processes at once). ``tests/contract/test_custom_store.py`` runs
duetime's store contract on it: the same suite every built-in store passes.

    store = DbmStore(DbmSyncStore("delayed.dbm"))   # the async store, for clients and dispatchers
"""

from __future__ import annotations

import base64
import dbm.dumb
import json
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime

from duetime.backends import SCHEMA_VERSION, AsyncStoreBridge, Duplicate, StoreRules, by_due, matches
from duetime.clock import from_micros, to_micros
from duetime.interfaces import ListQuery, StoreCounts
from duetime.message import DelayedMessage
from duetime.recurring.schedule import ScheduleRow

_META = "\x00"  # keys that are not message ids start with a NUL (an id never does)


def _micros(value: datetime | None) -> int | None:
    return to_micros(value) if value is not None else None


class DbmSyncStore(StoreRules):
    """The blocking store: rows in a ``dbm`` file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        # dbm.dumb, the kind every Python has and whose file any thread may use: dbm.open would
        # pick dbm.sqlite3 on Python 3.13, whose connection serves only the thread that opened it
        # (this store is opened on one thread and called on the bridge's worker thread).
        self._db = dbm.dumb.open(path, "c")  # noqa: SIM115 - open for the store's life; _close closes it
        self._lock = threading.RLock()

    # --- rows ----------------------------------------------------------------------------
    def _keys(self) -> list[str]:
        # not every kind of dbm iterates; keys() does, in bytes
        return [key.decode() if isinstance(key, bytes) else key for key in self._db.keys()]  # noqa: SIM118

    def _rows(self) -> Iterator[tuple[DelayedMessage, datetime | None]]:
        for key in self._keys():
            if not key.startswith(_META):
                yield self._row(key)

    def _row(self, message_id: str) -> tuple[DelayedMessage, datetime | None]:
        row = json.loads(self._db[message_id])
        message = DelayedMessage.from_store(
            message_id,
            row["destination"],
            from_micros(row["due"]),
            base64.b64decode(row["body"]),
            row["headers"],
            row["failures"],
            row["group"],
        )
        return message, from_micros(row["claimed_until"]) if row["claimed_until"] else None

    def _put(self, message: DelayedMessage, claimed_until: datetime | None = None) -> None:
        self._db[message.message_id] = json.dumps(
            {
                "destination": message.destination,
                "due": to_micros(message.due_at),
                "body": base64.b64encode(message.body).decode(),
                "headers": dict(message.headers),
                "failures": message.failure_count,
                "group": message.group,
                "claimed_until": to_micros(claimed_until) if claimed_until else None,
            }
        )

    def _free(self, message_id: str, at: datetime) -> DelayedMessage | None:
        """The message, if it is there and no dispatcher holds it at ``at``."""
        if message_id not in self._db:
            return None
        message, claimed_until = self._row(message_id)
        return message if claimed_until is None or claimed_until <= at else None

    # --- the primitives StoreRules asks for ----------------------------------------------
    def _location(self, endpoint: str) -> str:
        return "a dbm file"

    def _create(self, endpoint: str) -> None:
        with self._lock:
            self._db[f"{_META}schema:{endpoint}"] = str(SCHEMA_VERSION)

    def _schema_version(self, endpoint: str) -> int | None:
        with self._lock:
            found = self._db.get(f"{_META}schema:{endpoint}")
            return int(found) if found else None

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        with self._lock:
            for message in messages:
                if message.message_id in self._db:
                    raise Duplicate(message.message_id)
            for message in messages:
                self._put(message)

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        with self._lock:
            free = [m for m, held in self._rows() if m.due_at <= at and (held is None or held <= at)]
            claimed = by_due(free)[:limit]
            for message in claimed:
                self._put(message, until)
            return claimed

    def _next_due(self) -> datetime | None:
        with self._lock:
            return min((max(m.due_at, held) if held else m.due_at for m, held in self._rows()), default=None)

    def _delete(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            gone = [i for i in message_ids if i in self._db]
            for message_id in gone:
                del self._db[message_id]
            return len(gone)

    def _fail(self, message_id: str) -> bool:
        with self._lock:
            if message_id not in self._db:
                return False
            message, _ = self._row(message_id)
            self._put(message.with_changes(failure_count=message.failure_count + 1))
            return True

    def _release(self, message_ids: Sequence[str]) -> int:
        with self._lock:
            there = [i for i in message_ids if i in self._db]
            for message_id in there:
                self._put(self._row(message_id)[0])
            return len(there)

    def _get(self, message_id: str) -> DelayedMessage | None:
        with self._lock:
            return self._row(message_id)[0] if message_id in self._db else None

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        with self._lock:
            if self._free(message_id, now) is None:
                return False
            del self._db[message_id]
            return True

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        with self._lock:
            gone = [
                m.message_id for m, held in self._rows() if m.group == group and (held is None or held <= now)
            ][:limit]
            for message_id in gone:
                del self._db[message_id]
            return len(gone)

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        with self._lock:
            message = self._free(message_id, now)
            if message is None:
                return False
            self._put(message.with_changes(due_at=due_at))
            return True

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        with self._lock:  # never under a claim, even a lapsed one: its sender would settle it
            if message.message_id not in self._db or self._row(message.message_id)[1] is not None:
                return False
            self._put(message)
            return True

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        changed = 0
        with self._lock:  # a key rotation: only what is still as read, and under no claim
            for old, new in pairs:
                if old.message_id not in self._db:
                    continue
                stored, held = self._row(old.message_id)
                if held is None and (stored.body, dict(stored.headers)) == (old.body, dict(old.headers)):
                    self._put(stored.with_changes(body=new.body, headers=new.headers))
                    changed += 1
        return changed

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        with self._lock:
            return [m for m in by_due([m for m, _ in self._rows()]) if matches(query, m)][:limit]

    def _count(self, at: datetime) -> StoreCounts:
        with self._lock:
            rows = list(self._rows())
        return StoreCounts(
            total=len(rows),
            due=sum(m.due_at <= at for m, _ in rows),
            claimed=sum(held is not None and held > at for _, held in rows),
            failing=sum(m.failure_count > 0 for m, _ in rows),
            next_due=None,
            by_destination=dict(Counter(m.destination for m, _ in rows)),
        )

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        with self._lock:
            self._db[f"{_META}beat:{endpoint}:{dispatcher_id}"] = json.dumps([to_micros(seen_at), info])

    def _beats(self, endpoint: str) -> list[tuple[str, int, str]]:
        prefix = f"{_META}beat:{endpoint}:"
        found = [(key, json.loads(self._db[key])) for key in self._keys() if key.startswith(prefix)]
        return [(key, seen, info) for key, (seen, info) in found]

    def _presences(self, endpoint: str) -> list[str]:
        with self._lock:
            return [info for _, _, info in self._beats(endpoint)]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        with self._lock:
            for key, seen, _ in self._beats(endpoint):
                if seen < to_micros(seen_before):
                    del self._db[key]

    # --- recurring schedules: one key each, [definition, planned until (µs), version] ---------
    def _schedule_key(self, schedule_id: str) -> str:
        return f"{_META}schedule:{self._ready()}:{schedule_id}"

    def _schedule_insert(self, row: ScheduleRow) -> bool:
        with self._lock:
            key = self._schedule_key(row.schedule_id)
            if key in self._db:
                return False
            self._db[key] = json.dumps([row.text, _micros(row.planned_until), 0])
            return True

    def _schedule_update(self, changes: Sequence[tuple[ScheduleRow, Sequence[DelayedMessage]]]) -> list[bool]:
        written = []
        with self._lock:  # one process's threads: the lock makes each check and its writes one step
            for row, ticks in changes:
                stored = self._schedule_get(row.schedule_id)
                if stored is None or stored.version != row.version:
                    written.append(False)
                    continue
                self._db[self._schedule_key(row.schedule_id)] = json.dumps(
                    [row.text, _micros(row.planned_until), row.version + 1]
                )
                for tick in ticks:
                    if tick.message_id not in self._db:
                        self._put(tick)
                written.append(True)
        return written

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        with self._lock:
            found = self._db.get(self._schedule_key(schedule_id))
        if found is None:
            return None
        text, until, version = json.loads(found)
        return ScheduleRow(schedule_id, text, from_micros(until) if until is not None else None, version)

    def _all_schedules(self) -> list[ScheduleRow]:
        prefix = f"{_META}schedule:{self._ready()}:"
        with self._lock:
            ids = [key[len(prefix) :] for key in self._keys() if key.startswith(prefix)]
            return [row for i in sorted(ids) if (row := self._schedule_get(i)) is not None]

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        return [r for r in self._all_schedules() if r.schedule_id > after][:limit]

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        due = [r for r in self._all_schedules() if r.planned_until is not None and r.planned_until <= until]
        return sorted(due, key=lambda r: r.planned_until or until)[:limit]

    def _schedule_delete(self, schedule_id: str) -> bool:
        with self._lock:
            key = self._schedule_key(schedule_id)
            if key not in self._db:
                return False
            del self._db[key]
            return True

    def _close(self) -> None:
        with self._lock:
            self._db.close()


class DbmStore(AsyncStoreBridge):
    """The async store over the blocking one (its calls run on a worker thread)."""

    sync: DbmSyncStore

    def __init__(self, sync: DbmSyncStore) -> None:
        super().__init__(sync, name="dbm-store")
