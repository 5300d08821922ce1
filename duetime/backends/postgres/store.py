"""The PostgreSQL store (psycopg 3 and its pool): one blocking store, and the bridge for async.

Claims take due rows with ``FOR UPDATE SKIP LOCKED`` in batches, so many dispatchers share one
table and none receives another's message. By default a claim keeps its rows locked in an open
transaction while the batch is sent, and the delete commits in it: one write per message
(``held.py``); ``?claims=lease`` marks them with a lease instead. Storing sends ``NOTIFY`` in the
same transaction, so a sleeping dispatcher anywhere wakes when an earlier message arrives (the
async store LISTENs while a dispatcher is subscribed).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from duetime.backends._on_a_thread import Subscribers, TransactionalBridge, poll_next_due
from duetime.backends._schedules import Planned, schedules_need_setup
from duetime.backends._shared_commit import ROUND_LIMIT
from duetime.backends._store import (
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    change_in_use,
    check_store_columns,
    load_headers,
    sql_filters,
)
from duetime.backends.postgres.connection import (
    PgNames,
    PgOptions,
    QueueEntry,
    all_there,
    announce,
    announced_due,
    build_index_online,
    copy_row,
    decode,
    due_payload,
    dump_headers,
    enqueue_declared,
    pooled,
    reach,
    refresh_planner_stats,
    table_for,
)
from duetime.backends.postgres.locked_claims import HeldBatches
from duetime.backends.postgres.queue import PostgresQueueTransport, queue_schema_statements
from duetime.interfaces import ListQuery, Moved, MoveOutcome, NextDue, StoreCounts
from duetime.message import DelayedMessage, check_due_time, outgoing_headers_json, traceparent_of
from duetime.recurring.schedule import ScheduleRow

log = logging.getLogger("duetime.postgres")
#: Above this many rows (by the planner's estimate) counts are estimates, not full scans.
EXACT_COUNT_LIMIT = 1_000_000
#: How soon a sleeping dispatcher looks again at due messages another dispatcher holds locked.
HELD_RECHECK = timedelta(milliseconds=500)
_FIELDS = ("message_id", "destination", "due_at", "headers", "body", "failure_count", "group_key")
#: The same columns as ``insert_many_notify``'s array parameters.
_ARRAYS = ("ids", "destinations", "due", "headers", "bodies", "failures", "groups")


#: How long a set-up of a table in use waits for a lock (to add a column, say) before it lets the
#: writers queued behind it through and tries again: they wait at most this long for it.
SETUP_LOCK_WAIT = "200ms"


def _setup_statements(names: PgNames) -> list[tuple[str, dict[str, Any]]]:
    """The tables, under one advisory lock, taken first: ``CREATE … IF NOT EXISTS`` alone is not
    safe when several processes run it at the same moment. The indexes are in ``names.indexes``."""
    q = names.q
    return [
        (q["advisory_lock"], {"key": names.setup_lock}),
        (f"CREATE SCHEMA IF NOT EXISTS {names.quoted_schema}", {}),
        (q["create_schema_version"], {}),
        (q["create_store_table"], {}),
        (q["destination_statistics_target"], {}),
        *[(sql, {}) for sql in queue_schema_statements(q) if not sql.startswith("CREATE INDEX")],
        (q["create_presence_table"], {}),
        (q["create_api_key_table"], {}),
        (q["create_record_table"], {}),
        (q["create_schedule_table"], {}),
    ]


def estimated_counts(counts: StoreCounts, sampled: tuple[Any, Any, Any] | None) -> StoreCounts:
    """``counts`` of a store too large to count, per destination from the planner's sample
    (``destination_statistics``): each common destination's share of the estimated total, and
    the rest said as "more destinations" holding the remainder, so nothing is cut without a word."""
    values, shares, distinct = sampled or (None, None, 0)
    total = counts.total
    pairs = sorted(zip(values or [], shares or [], strict=True), key=lambda vf: (-vf[1], vf[0]))
    by = {v: round(f * total) for v, f in pairs}
    many = int(distinct if distinct >= 0 else -distinct * total)
    rest = max(total - sum(by.values()), 0)
    return replace(
        counts,
        by_destination=by,
        more_destinations=max(many - len(by), 1 if rest else 0),
        more_messages=rest,
        estimated=True,
    )


def _duplicate(error: Exception, messages: Sequence[DelayedMessage]) -> Duplicate:
    detail = getattr(getattr(error, "diag", None), "message_detail", None) or ""
    return Duplicate(next((m.message_id for m in messages if f"({m.message_id})" in detail), None))


class SyncPostgresStore(StoreRules):
    """Blocking PostgreSQL store over a psycopg ``ConnectionPool``; thread-safe.

    The pool opens on first use, after one direct connection has checked that the server, role and
    database are there (a wrong one is then a one-line error, not a pool timeout).
    """

    def __init__(self, options: PgOptions) -> None:
        super().__init__(claim_timeout=options.claim_timeout)
        self.options = options
        self._names: PgNames | None = None
        self._pool: ConnectionPool | None = None
        self._opening = threading.Lock()
        self._held = HeldBatches(lambda: self.pool, lambda: self.clock.monotonic(), options)

    @property
    def holds_locks(self) -> bool:
        """Claims as row locks: asked for, and the pool has room for two held batches and a call
        (a smaller pool would make a claim-ahead wait for the very connection it holds)."""
        return self.options.claims == "lock" and self.options.pool_size >= 3

    @property
    def _stale_after(self) -> float:
        """A batch left open this long is committed as it stands, before the server's
        idle-in-transaction limit (the claim time) could end the session and lose its deletes."""
        return self.claim_timeout.total_seconds() / 2

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SyncPostgresStore:
        return cls(PgOptions.from_url(url, claim_timeout=claim_timeout))

    @property
    def pool(self) -> ConnectionPool:
        with self._opening:
            if self._pool is None:
                reach(self.options)
                self._pool = ConnectionPool(
                    self.options.conninfo,
                    min_size=1,
                    max_size=self.options.pool_size,
                    open=True,
                    kwargs={"autocommit": True, **self.options.connect_kwargs},
                    name="duetime-store",
                    timeout=self.options.pool_timeout,
                )
            return self._pool

    def names_for(self, endpoint: str) -> PgNames:
        return PgNames(self.options.schema, table_for(self.options, endpoint))

    @property
    def names(self) -> PgNames:
        self._ready()
        assert self._names is not None
        return self._names

    def _rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        with pooled(self.pool, self.options) as conn:
            return conn.execute(sql, params).fetchall()

    def _rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        with pooled(self.pool, self.options) as conn:
            return conn.execute(sql, params).rowcount

    # --- primitives -----------------------------------------------------------------------
    def _location(self, endpoint: str) -> str:
        names = self.names_for(endpoint)
        return f"table {names.table!r} in schema {names.schema!r} at {self.options.display}"

    def _create(self, endpoint: str) -> None:
        names = self.names_for(endpoint)
        if self._schema_version(endpoint) == SCHEMA_VERSION:
            with pooled(self.pool, self.options) as conn:
                if all_there(conn, names.store_relations):
                    return  # set up already: no DDL, no lock on a table in use
        with pooled(self.pool, self.options) as conn:
            in_use = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [names.qualified]).fetchone()
            if in_use and in_use[0]:
                self._upgrade(conn, names)
            else:
                with conn.transaction():
                    self._create_tables(conn, names)
                    for key in names.indexes:
                        conn.execute(names.q[key])
            conn.execute(
                names.q["record_version"], {"component": names.component(), "version": SCHEMA_VERSION}
            )

    def _create_tables(self, conn: psycopg.Connection[Any], names: PgNames) -> None:
        statements = _setup_statements(names)
        for sql, params in statements[:4]:  # the lock, the schema, the version table, the table
            conn.execute(sql, params)
        columns = conn.execute(names.q["table_columns"], {"regclass": names.qualified}).fetchall()
        check_store_columns(names.table, self.options.display, (r[0] for r in columns))
        found = conn.execute(names.q["has_group_column"], {"regclass": names.qualified}).fetchone()
        if found is None:  # a table of schema version 1: the column is added in place (no rewrite)
            conn.execute(names.q["add_group_column"])
        for sql, params in statements[4:]:
            conn.execute(sql, params)

    def _upgrade(self, conn: psycopg.Connection[Any], names: PgNames) -> None:
        """Set up a table that may be in use without stopping its writers. What needs a lock
        that blocks them (a column added) asks for it for at most :data:`SETUP_LOCK_WAIT` at a
        time: a set-up queued behind a long transaction holds up every writer that comes after it,
        so it steps aside and tries again. Indexes are built without blocking writes at all."""

        def tables() -> None:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{SETUP_LOCK_WAIT}'")
                self._create_tables(conn, names)

        change_in_use(
            tables,
            lambda error: isinstance(error, pg_errors.LockNotAvailable),
            names.table,
            self.options.display,
            SETUP_LOCK_WAIT,
        )
        for key, index in names.indexes.items():
            build_index_online(conn, index, names.q[key])

    def _schema_version(self, endpoint: str) -> int | None:
        names = self.names_for(endpoint)
        try:
            rows = self._rows(names.q["read_version"], {"component": names.component()})
        except pg_errors.UndefinedTable:
            return None
        return int(rows[0][0]) if rows else None

    def _bind(self, endpoint: str) -> None:
        self._names = self.names_for(endpoint)

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        """Up to a shared commit's round: one statement, whose NOTIFY commits with it (one round
        trip, which is also one wait for the interpreter when many threads schedule at once). A
        bulk load: COPY, then NOTIFY the earliest, in one transaction."""
        names = self.names
        q = names.q
        earliest = min(m.due_at for m in messages)
        notify = {"channel": names.channel, "payload": due_payload(earliest)}
        try:
            with pooled(self.pool, self.options) as conn:
                if len(messages) == 1:
                    conn.execute(
                        q["insert_notify"], dict(zip(_FIELDS, copy_row(messages[0]), strict=True)) | notify
                    )
                    return
                if len(messages) <= ROUND_LIMIT:
                    columns = zip(*(copy_row(m) for m in messages), strict=True)
                    arrays = dict(zip(_ARRAYS, (list(c) for c in columns), strict=True))
                    conn.execute(q["insert_many_notify"], arrays | notify)
                    return
                with conn.transaction():
                    with conn.cursor() as cur, cur.copy(q["copy_in"]) as copy:
                        for m in messages:
                            copy.write_row(copy_row(m))
                    announce(conn, names, earliest)
                refresh_planner_stats(conn, names.qualified, len(messages))
        except pg_errors.UniqueViolation as error:
            raise _duplicate(error, messages) from None

    def _announce(self, due_at: datetime) -> None:
        names = self.names
        self._rowcount(names.q["notify"], {"channel": names.channel, "payload": due_payload(due_at)})

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        return self._claim_and_next(at, until, limit)[0]

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        """One statement claims and, for a short batch, reads what :meth:`_next_due` would answer
        after it. That answer is left to the caller when the earliest row left was due at the
        claim's own time ``at`` and still not taken: another claim holds it, and who and until
        when is another question, asked apart. A row that came due after ``at`` (at a thousand a
        second, most rounds' next one, by the time the statement returns) is the answer as it
        is: due now, so the next round starts at once, with no question between."""
        if self.holds_locks:
            self._held.settle_stale(self._stale_after)
        ours = self._held.held()[0]
        if self.holds_locks and self._held.open_batches() < self.options.pool_size - 1:
            params: dict[str, Any] = {"at": at, "limit": limit, "ours": ours}
            rows = self._held.claim(self.names.q["lock_due"], params)
            leases = None
        else:
            params = {"token": uuid.uuid4(), "until": until, "at": at, "limit": limit, "ours": ours}
            rows = self._rows(self.names.q["claim_due"], params)
            leases = until
        messages = [decode(r) for r in rows if r[0] is not None]
        if len(messages) >= limit or not rows:
            return messages, None
        first, expiry = rows[0][7], rows[0][8]
        if first is not None and first <= at:
            return messages, None
        if messages and leases is not None:
            expiry = leases if expiry is None else min(expiry, leases)
        # first was not due at `at`, so no claim holds it: nothing left to ask of a connection
        return messages, NextDue(self._earliest(None, first, expiry, self._held.held()[1], at))

    def _next_due(self) -> datetime | None:
        """The earliest unclaimed due time no one holds locked, or a lease's end. A due row some
        dispatcher holds locked is looked at again after HELD_RECHECK (a dispatcher that died frees
        its rows at once), rather than at once and again (a spin while another one sends). Rows
        this store holds itself (a batch being sent while the dispatcher asks) count from the
        time they would be freed if never settled.

        Whether the earliest row is held is asked only when it is due: claims take due rows only,
        and the asking (a row lock) costs a WAL flush — measured 344 µs against 139 µs for the
        plain question, on every turn of a dispatcher delivering messages a few ms apart.
        """
        self._held.settle_stale(self._stale_after)
        ours, oldest = self._held.held()
        with pooled(self.pool, self.options) as conn:
            row = conn.execute(self.names.q["next_times"], {"ours": ours}).fetchone()
            first, expiry = row if row is not None else (None, None)
            return self._earliest(conn, first, expiry, oldest)

    def _earliest(
        self,
        conn: Any,
        first: datetime | None,
        expiry: datetime | None,
        oldest: float | None,
        now: datetime | None = None,
    ) -> datetime | None:
        """The next due time from the earliest unclaimed row (``first``), the earliest lease end
        and the oldest batch held here; asks ``conn`` who holds ``first`` only when it is due at
        ``now`` (the clock's, unless given)."""
        now = self.clock.now() if now is None else now
        unlocked = None
        if first is not None and first <= now:
            free = conn.execute(self.names.q["next_unlocked"]).fetchone()
            unlocked = None if free is None else free[0]
        times = [] if expiry is None else [expiry]
        if oldest is not None:
            left = oldest + self._stale_after - self.clock.monotonic()
            times.append(now + timedelta(seconds=max(left, 0.0)))
        if first is not None and first > now:
            times.append(first)  # not due yet, so no one holds it
        elif first is not None:
            if unlocked is not None:
                times.append(unlocked)
            if not times or first < min(times):  # held by a live transaction
                times.append(max(first, now + HELD_RECHECK))
        return min(times).astimezone(UTC) if times else None

    def _delete(self, message_ids: Sequence[str]) -> int:
        q = self.names.q
        held, rest = self._held.split(message_ids)
        count = sum(self._held.run(b, ids, q["delete_many"], {"ids": ids}) for b, ids in held.values())
        return count + (self._rowcount(q["delete_many"], {"ids": rest}) if rest else 0)

    def _fail(self, message_id: str) -> bool:
        return self._change_held(message_id, "increment_failure", {"id": message_id})

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        return self._change_held(message_id, "increment_failure_until", {"id": message_id, "due_at": due_at})

    def _change_held(self, message_id: str, query: str, params: dict[str, Any]) -> bool:
        """A change of a claimed row: in the transaction holding it (which ends with it), else alone."""
        sql = self.names.q[query]
        held, _ = self._held.split([message_id])
        for batch, ids in held.values():
            return self._held.run(batch, ids, sql, params) == 1
        return self._rowcount(sql, params) == 1

    def _release(self, message_ids: Sequence[str]) -> int:
        """A held row is released by its transaction ending; a leased one by clearing the lease."""
        held, rest = self._held.split(message_ids)
        count = sum(self._held.run(b, ids, None, {}) for b, ids in held.values())
        return count + (self._rowcount(self.names.q["release_many"], {"ids": rest}) if rest else 0)

    def _get(self, message_id: str) -> DelayedMessage | None:
        rows = self._rows(self.names.q["get"], {"id": message_id})
        return decode(rows[0]) if rows else None

    def _moved_ahead(self, message_id: str, now: datetime) -> bool:
        """(By the server's clock, as the receivers see it, not ``now``.)"""
        return bool(self._rows(self.names.q["moved_ahead"], {"message_id": message_id})[0][0])

    def _stored_ids(self, message_ids: Sequence[str]) -> set[str]:
        return {r[0] for r in self._rows(self.names.q["stored_ids"], {"ids": list(message_ids)})}

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        return self._rowcount(self.names.q["delete_unclaimed"], {"id": message_id, "now": now}) == 1

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        params = {"group": group, "now": now, "limit": limit}  # LIMIT NULL: all
        return self._rowcount(self.names.q["delete_group_unclaimed"], params)

    def _count_group(self, group: str) -> int:
        return int(self._rows(self.names.q["count_group"], {"group": group})[0][0])

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        params = {"id": message_id, "due_at": due_at, "now": now}
        return self._rowcount(self.names.q["reschedule_unclaimed"], params) == 1

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        """Under a lock of the id's own (``replace_lock``), so that two producers replacing one
        id at once wait for each other: the change skips a locked row as a dispatcher's, and
        without it each would take the other's row lock for a dispatcher's."""
        names = self.names
        params = dict(zip(_FIELDS, copy_row(message), strict=True))
        with pooled(self.pool, self.options) as conn, conn.transaction():
            conn.execute(names.q["replace_lock"], {"key": f"{names.qualified}:{message.message_id}"})
            return conn.execute(names.q["replace_unclaimed"], params).rowcount == 1

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        params = {"endpoint": endpoint, "id": dispatcher_id, "seen": seen_at, "info": info}
        self._rowcount(self.names.q["beat"], params)

    def _presences(self, endpoint: str) -> list[str]:
        return [r[0] for r in self._rows(self.names.q["presences"], {"endpoint": endpoint})]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        self._rowcount(self.names.q["forget"], {"endpoint": endpoint, "before": seen_before})

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        params = {"endpoint": endpoint, "name": name, "info": info}
        return self._rowcount(self.names.q["key_insert"], params) == 1

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        params = {"endpoint": endpoint, "name": name, "info": info}
        return self._rowcount(self.names.q["key_update"], params) == 1

    def _key_records(self, endpoint: str) -> list[str]:
        return [r[0] for r in self._rows(self.names.q["key_records"], {"endpoint": endpoint})]

    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        params = {"endpoint": endpoint, "kind": kind, "name": name, "info": info}
        return self._rowcount(self.names.q["record_insert"], params) == 1

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        params = {"endpoint": endpoint, "kind": kind, "name": name, "info": info}
        return self._rowcount(self.names.q["record_update"], params) == 1

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        params = {"endpoint": endpoint, "kind": kind, "name": name}
        return self._rowcount(self.names.q["record_delete"], params) == 1

    def _records(self, endpoint: str, kind: str) -> list[str]:
        params = {"endpoint": endpoint, "kind": kind}
        return [r[0] for r in self._rows(self.names.q["records"], params)]

    def _audit_range(
        self, endpoint: str, above: str, below: str, limit: int, oldest_first: bool
    ) -> list[str]:
        sql = self.names.q["audit_oldest" if oldest_first else "audit_newest"]
        params = {"endpoint": endpoint, "above": above, "below": below, "limit": limit}
        return [r[0] for r in self._rows(sql, params)]

    def _audit_prune(self, endpoint: str, below: str) -> int:
        return self._rowcount(self.names.q["audit_prune"], {"endpoint": endpoint, "below": below})

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        q, key = self.names.q, {"endpoint": endpoint, "kind": kind, "name": name}
        if old is None:
            done = self._rowcount(q["record_insert"], key | {"info": new}) == 1
        else:
            done = self._rowcount(q["record_swap"], key | {"old": old, "new": new}) == 1
        if done:
            return True, None
        rows = self._rows(q["record_get"], key)
        return False, rows[0][0] if rows else None

    def _hold(self, until: Mapping[str, datetime]) -> int:
        """A row this process holds locked is held in the transaction holding it (which ends
        with it); a leased one alone."""
        sql = self.names.q["hold"]

        def params(ids: Sequence[str]) -> dict[str, Any]:
            return {"ids": list(ids), "untils": [until[i] for i in ids]}

        locked, rest = self._held.split(list(until))
        count = sum(self._held.run(b, ids, sql, params(ids)) for b, ids in locked.values())
        return count + (self._rowcount(sql, params(rest)) if rest else 0)

    def _release_held(self) -> int:
        return self._rowcount(self.names.q["release_held"], {})

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        q = self.names.q
        wanted = {old.message_id: (old, new) for old, new in pairs}
        with pooled(self.pool, self.options) as conn, conn.transaction():
            rows = conn.execute(q["reseal_look"], {"ids": list(wanted)}).fetchall()
            changes = [
                new
                for i, headers, body in rows
                for old, new in (wanted[i],)
                if (load_headers(headers), bytes(body)) == (dict(old.headers), old.body)
            ]
            if changes:  # one statement for the batch
                conn.execute(
                    q["reseal"],
                    {
                        "ids": [m.message_id for m in changes],
                        "headers": [dump_headers(m.headers) for m in changes],
                        "bodies": [m.body for m in changes],
                    },
                )
        return len(changes)

    # --- recurring schedules ------------------------------------------------------------------
    def _schedule_insert(self, row: ScheduleRow) -> bool:
        return self._schedule_write("schedule_insert", self._schedule_params(row)) == 1

    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        q = self.names.q
        rows = [row for row, _ in changes]
        params = {
            "endpoint": self._ready(),
            "ids": [r.schedule_id for r in rows],
            "versions": [r.version for r in rows],
            "definitions": [r.text for r in rows],
            "untils": [r.planned_until for r in rows],
        }
        try:
            with pooled(self.pool, self.options) as conn, conn.transaction():
                done = {r[0] for r in conn.execute(q["schedule_update"], params).fetchall()}
                ticks = [t for row, each in changes if row.schedule_id in done for t in each]
                if ticks:
                    columns = zip(*(copy_row(t) for t in ticks), strict=True)
                    conn.execute(q["insert_new"], dict(zip(_ARRAYS, (list(c) for c in columns), strict=True)))
        except pg_errors.UndefinedTable:
            raise schedules_need_setup() from None
        return [row.schedule_id in done for row in rows]

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        rows = self._schedule_rows("schedule_get", {"id": schedule_id})
        return rows[0] if rows else None

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedule_page", {"after": after, "limit": limit})

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedules_to_plan", {"until": until, "limit": limit})

    def _schedule_delete(self, schedule_id: str) -> bool:
        return self._schedule_write("schedule_delete", {"endpoint": self._ready(), "id": schedule_id}) == 1

    def _schedule_params(self, row: ScheduleRow) -> dict[str, Any]:
        return {
            "endpoint": self._ready(),
            "id": row.schedule_id,
            "definition": row.text,
            "planned_until": row.planned_until,
            "version": row.version,
        }

    def _schedule_write(self, name: str, params: Mapping[str, Any]) -> int:
        try:
            return self._rowcount(self.names.q[name], params)
        except pg_errors.UndefinedTable:
            raise schedules_need_setup() from None

    def _schedule_rows(self, name: str, params: Mapping[str, Any]) -> list[ScheduleRow]:
        try:
            rows = self._rows(self.names.q[name], {"endpoint": self._ready(), **params})
        except pg_errors.UndefinedTable:
            raise schedules_need_setup() from None
        return [ScheduleRow(r[0], r[1], r[2], int(r[3])) for r in rows]

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        where, params = sql_filters(query, "%({})s", row_values=True)
        sql = (
            f"SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key "
            f"FROM {self.names.qualified} WHERE {where} ORDER BY due_at, message_id LIMIT %(limit)s"
        )
        return [decode(r) for r in self._rows(sql, params | {"limit": limit})]

    def _server_time(self) -> datetime | None:
        return self._rows(self.names.q["server_time"])[0][0]  # type: ignore[no-any-return]

    def _count_due(self, at: datetime) -> int:
        return int(self._rows(self.names.q["count_due"], {"at": at})[0][0])

    def _count_destinations(self) -> int:
        return int(self._rows(self.names.q["count_destinations"])[0][0])

    def _count(self, at: datetime) -> StoreCounts:
        """Exact while the table is small; past EXACT_COUNT_LIMIT rows (the planner's estimate) the
        total is that estimate and per-destination counts are left out: `stats` never scans millions."""
        names = self.names
        q = names.q
        with pooled(self.pool, self.options) as conn:

            def one(key: str, params: Mapping[str, Any] | None = None) -> Any:
                return conn.execute(q[key], params).fetchall()

            estimate = one("estimate_rows", {"regclass": names.qualified})[0][0]
            large = estimate > EXACT_COUNT_LIMIT
            destinations = [] if large else one("count_by_destination")
            exact = StoreCounts(
                total=estimate if large else int(destinations[0][2]) if destinations else 0,
                due=one("count_due", {"at": at})[0][0],
                # Leases anywhere, locks of this process (another process's locks do not show).
                claimed=one("count_claimed", {"at": at})[0][0] + self._held.held_count(),
                failing=one("count_failing")[0][0],
                next_due=None,
                by_destination={d: int(n) for d, n, _ in destinations},
                held=one("count_held", {"at": at})[0][0],
            )
            if not large:
                return exact
            sampled = one("destination_statistics", {"schema": names.schema, "table": names.table})
            return estimated_counts(exact, sampled[0] if sampled else None)

    def move_due(
        self,
        at: datetime,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome:
        """Take due rows (SKIP LOCKED), enqueue them, delete them: one transaction, exactly-once.

        Most batches move in one statement (:meth:`_move_at_once`), which ``until`` (later than
        ``at``) makes ahead: it also takes what comes due by then, each visible in its queue at
        its due time (rounded up to a whole ``budget``, when one is given). A batch with a row only Python can forward moves row by row (:meth:`_move`),
        only what is due at ``at``: into the queues in one statement that keeps what has a
        declared queue and wakes its receivers (as the queue's own send), the rest to the error
        queue."""
        if not self._held.held_count():  # (rows claimed here would be left out of the next due time)
            at = check_due_time(at, "at")
            ahead = at if until is None else max(at, check_due_time(until, "until"))
            at_once = self._move_at_once(at, ahead, budget, limit)
            if at_once is not None:
                return at_once
        with pooled(self.pool, self.options) as conn, conn.transaction():
            moved, dead = self._move(conn, at, limit, error_queue, error_headers)
        return MoveOutcome(moved, dead, self._next_due_after_move())

    def _move_at_once(
        self, at: datetime, until: datetime, budget: timedelta, limit: int
    ) -> MoveOutcome | None:
        """The move as one statement (``move_due_at_once``): one round trip where the move row by
        row and the next-due question took five, most of a round's cost at a few hundred messages
        a second. None when a due row needs the move row by row (nothing was moved then)."""
        step = budget // timedelta(microseconds=1)
        params = {"at": at, "until": until, "step": step, "limit": limit, "channel": self.names.queue_channel}
        with pooled(self.pool, self.options) as conn:
            rows = conn.execute(self.names.q["move_due_at_once"], params).fetchall()
            *_, strays, first, expiry = rows[0]
            if strays:
                return None
            moved = [
                Moved(r[0], r[1], r[2].astimezone(UTC), None if r[3] is None else traceparent_of(r[3]))
                for r in rows
                if r[0] is not None
            ]
            try:  # the move has committed and stands; without a next due time the dispatcher asks
                next_due: NextDue | None = NextDue(self._earliest(conn, first, expiry, None))
            except Exception:
                next_due = None
        return MoveOutcome(moved, [], next_due)

    def _move(
        self,
        conn: Any,
        at: datetime,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> tuple[list[Moved], list[tuple[DelayedMessage, str]]]:
        q = self.names.q
        moved: list[Moved] = []
        dead: list[tuple[DelayedMessage, str]] = []
        rows = conn.execute(q["take_due"], {"at": check_due_time(at, "at"), "limit": limit}).fetchall()
        if not rows:
            return moved, dead
        due = [r[2].astimezone(UTC) for r in rows]
        sent = enqueue_declared(
            conn,
            self.names,
            [
                (r[1], r[0], outgoing_headers_json(r[3], when, r[0]), r[4])
                for r, when in zip(rows, due, strict=True)
            ],
        )
        undeliverable: list[QueueEntry] = []
        for row, due_at in zip(rows, due, strict=True):
            message_id, destination, _, headers_json, body = row[:5]
            if message_id in sent:
                moved.append(Moved(message_id, destination, due_at, traceparent_of(headers_json)))
                continue
            message = decode(row)
            reason = f"Destination {destination!r} does not exist."
            undeliverable.append(
                (error_queue, message_id, dump_headers(error_headers(message, reason)), body)
            )
            dead.append((message, reason))
        if undeliverable:
            conn.execute(q["declare_queue"], {"name": error_queue})
            enqueue_declared(conn, self.names, undeliverable)
        return moved, dead

    def _close(self) -> None:
        if self._pool is not None:
            self._held.close()
        with self._opening:
            if self._pool is not None:
                self._pool.close()


class PostgresStore(TransactionalBridge):
    """The async PostgreSQL store: the blocking store on a worker thread, with LISTEN wake-ups."""

    sync: SyncPostgresStore
    needs = "a PostgreSQL queue transport on the same database and schema"

    def __init__(self, sync: SyncPostgresStore, *, listen_check: float = 5.0) -> None:
        # One thread for the dispatcher's calls, as for every store: two measured no faster
        # (bench/RESULTS.md); an operator's reads on another, each with a connection of the pool.
        super().__init__(sync, name="pg-store", watch=self._watch, reads_apart=True)
        self.listen_check = listen_check

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> PostgresStore:
        return cls(SyncPostgresStore.from_url(url, claim_timeout=claim_timeout))

    @property
    def options(self) -> PgOptions:
        return self.sync.options

    async def _watch(self, subscribers: Subscribers) -> None:
        """Wake-ups from LISTEN where it can connect, else from asking the next due time every
        ``poll`` seconds (a pooler in transaction mode without ``listen=HOST:PORT``)."""
        listen = self.options.listen_conninfo
        if listen is not None:
            await self._listen(listen, subscribers)
        elif self.sync.endpoint is not None:
            await poll_next_due(self.sync.next_due, self.options.poll, subscribers)

    async def _listen(self, conninfo: str, subscribers: Subscribers) -> None:
        """LISTEN on the table's channel; re-establish a dropped connection, and after every
        (re)connect tell subscribers to look again, since a NOTIFY may have been missed."""
        channel = self.sync.names.channel
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {channel}")
                    backoff = 0.1
                    subscribers.notify(None)
                    while True:
                        async for note in conn.notifies(timeout=self.listen_check):
                            subscribers.notify(announced_due(note.payload))
                        await asyncio.wait_for(conn.execute("SELECT 1"), self.listen_check)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("LISTEN connection lost (%s); reconnecting", type(error).__name__)
                subscribers.notify(None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # --- exactly-once ---------------------------------------------------------------------
    def shares_transaction_with(self, transport: object) -> bool:
        return (
            isinstance(transport, PostgresQueueTransport)
            and transport.options.conninfo == self.options.conninfo
            and transport.options.schema == self.options.schema
        )
