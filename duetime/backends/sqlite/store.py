"""The embedded default store: one SQLite file, WAL, safe for several processes on one host.

Claims are leases (``claim_token``, ``claimed_until``) taken in one ``UPDATE … RETURNING`` under
SQLite's write lock, so two dispatchers never receive the same message; a crashed dispatcher's
claims come back when the lease runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from duetime.backends._on_a_thread import Subscribers, TransactionalBridge
from duetime.backends._schedules import Planned, schedules_need_setup
from duetime.backends._shared_commit import ROUND_LIMIT
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    HOLD_TOKEN_SQL,
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    check_store_columns,
    claim_timeout_option,
    micros_row,
    sql_filters,
    table_name,
)
from duetime.backends.sqlite.connection import (
    QUERIES,
    connect,
    load_headers,
    many_rows,
    parse_sqlite_url,
    write_statement,
    write_transaction,
)
from duetime.backends.sqlite.filewatch import Looks
from duetime.backends.sqlite.filewatch import watch as watch_file
from duetime.backends.sqlite.queue import (
    SqliteQueueTransport,
    create_queue_schema,
    enqueue,
    queue_exists,
)
from duetime.clock import from_micros, to_micros
from duetime.inputs.identifiers import check_name, quote_identifier
from duetime.inputs.urls import number_option, url_options
from duetime.interfaces import ListQuery, Moved, MoveOutcome, NextDue, StoreCounts
from duetime.message import (
    DelayedMessage,
    check_due_time,
    dump_headers,
    outgoing_headers_json,
    traceparent_of,
)
from duetime.recurring.schedule import ScheduleRow
from duetime.store_row import STORE_COLUMNS

OPTIONS = {"table", "synchronous", "claim_timeout", "busy_timeout"}
_COLUMNS = ", ".join(STORE_COLUMNS)


T = TypeVar("T")


def _micros(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def _message(row: Sequence[Any]) -> DelayedMessage:
    return DelayedMessage.from_store(
        row[0], row[1], from_micros(row[2]), bytes(row[4]), load_headers(row[3]), row[5], row[6]
    )


class SyncSqliteStore(StoreRules):
    """The blocking SQLite store; thread-safe (one connection behind a lock)."""

    parallel_claims = False  # one writer at a time: a claim made while a batch is sent would wait

    def __init__(
        self,
        path: str | Path,
        *,
        table: str | None = None,
        synchronous: str = "full",
        claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT,
        busy_timeout: float = 30.0,
    ) -> None:
        super().__init__(claim_timeout=claim_timeout)
        self.path = Path(path)
        self._table_override = None if table is None else check_name("table", table)
        self._conn = connect(self.path, synchronous, busy_timeout)
        self._lock = threading.RLock()
        # what an operator reads (counts, pages, a group's size) goes through a connection of its
        # own: WAL lets it read while the dispatcher writes, so a count of a million rows never
        # holds the dispatcher's connection (it made deliveries a second late)
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SyncSqliteStore:
        path, _ = parse_sqlite_url(url)
        _, options = url_options(url, OPTIONS, "SQLite")
        return cls(
            path,
            table=options.get("table"),
            synchronous=options.get("synchronous", "full"),
            claim_timeout=claim_timeout_option(options, claim_timeout),
            busy_timeout=number_option(options, "busy_timeout", 30.0),
        )

    def table_for(self, endpoint: str) -> str:
        """``<endpoint>.delayed`` unless a table name was given (NServiceBus's default naming)."""
        return table_name(endpoint, self._table_override)

    def _queries(self, table: str) -> dict[str, str]:
        names = {
            "table": quote_identifier(table),
            "index_due": quote_identifier(f"{table}_due"),
            "index_claim": quote_identifier(f"{table}_claim"),
            "index_destination": quote_identifier(f"{table}_destination"),
            "index_group": quote_identifier(f"{table}_group"),
            "index_failing": quote_identifier(f"{table}_failing"),
            "held": HOLD_TOKEN_SQL,
        }
        return {"table": names["table"]} | {name: sql.format(**names) for name, sql in QUERIES.items()}

    # --- primitives -----------------------------------------------------------------------
    def _location(self, endpoint: str) -> str:
        return f"table {self.table_for(endpoint)!r} in {self.path}"

    def _create(self, endpoint: str) -> None:
        table = self.table_for(endpoint)
        q = self._queries(table)
        with self._lock, write_transaction(self._conn):
            self._conn.execute(q["create_schema_table"])
            self._conn.execute(q["create_store_table"])
            columns = {r[0] for r in self._conn.execute(q["store_columns"], {"table": table})}
            check_store_columns(table, str(self.path), columns)
            for name in (
                "create_store_due_index",
                "create_store_claim_index",
                "create_store_destination_index",
                "create_store_failing_index",
            ):
                self._conn.execute(q[name])
            if "group_key" not in columns:  # a table of schema version 1: upgraded in place
                self._conn.execute(q["add_group_column"])
            self._conn.execute(q["create_store_group_index"])
            create_queue_schema(self._conn)
            self._conn.execute(q["create_presence_table"])
            self._conn.execute(q["create_api_key_table"])
            self._conn.execute(q["create_record_table"])
            self._conn.execute(q["create_schedule_table"])
            self._conn.execute(q["create_schedule_plan_index"])
            self._conn.execute(q["record_version"], (f"store:{table}", SCHEMA_VERSION))

    def _schema_version(self, endpoint: str) -> int | None:
        with self._lock:
            try:
                row = self._conn.execute(
                    QUERIES["read_version"], (f"store:{self.table_for(endpoint)}",)
                ).fetchone()
            except sqlite3.OperationalError:
                return None
        return None if row is None else int(row[0])

    def _bind(self, endpoint: str) -> None:
        self._q = self._queries(self.table_for(endpoint))

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        """Up to a shared commit's round: one statement (its own transaction); a bulk load: one
        transaction of many."""
        rows = [micros_row(m) for m in messages]
        with self._lock:
            try:
                # one statement if its parameters fit (999 at most before SQLite 3.32)
                variables = self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
                if len(rows) <= ROUND_LIMIT and len(rows) * len(rows[0]) <= variables:
                    params = [value for row in rows for value in row]
                    write_statement(self._conn, many_rows(self.q["insert"], len(rows)), params)
                    return
                with write_transaction(self._conn):
                    self._conn.executemany(self.q["insert"], rows)
            except sqlite3.IntegrityError:
                raise Duplicate() from None

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        return self._claimed(at, until, limit, ask_next=False)[0]

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        """A short batch's claim reads the next due time in its own write transaction: in-process,
        a few microseconds, where asking apart waited for the store's one thread again."""
        return self._claimed(at, until, limit, ask_next=True)

    def _claimed(
        self, at: datetime, until: datetime, limit: int, *, ask_next: bool
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        params = {"token": uuid.uuid4().hex, "until": to_micros(until), "at": to_micros(at), "limit": limit}
        with self._lock, write_transaction(self._conn):
            rows = self._conn.execute(self.q["claim_due"], params).fetchall()
            next_due = NextDue(self._earliest()) if ask_next and len(rows) < limit else None
        return [_message(r) for r in rows], next_due

    def _next_due(self) -> datetime | None:
        with self._lock:
            return self._earliest()

    def _earliest(self) -> datetime | None:
        """The earliest unclaimed due time or claim's end (the caller holds the lock)."""
        unclaimed = self._conn.execute(self.q["next_unclaimed"]).fetchone()
        expiry = self._conn.execute(self.q["next_claim_expiry"]).fetchone()
        times = [r[0] for r in (unclaimed, expiry) if r is not None and r[0] is not None]
        return from_micros(min(times)) if times else None

    def _write_each(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> int:
        with self._lock, write_transaction(self._conn):
            return self._conn.executemany(sql, rows).rowcount

    def _delete(self, message_ids: Sequence[str]) -> int:
        return self._write_each(self.q["delete"], [(i,) for i in message_ids])

    def _fail(self, message_id: str) -> bool:
        return self._write_each(self.q["increment_failure"], [(message_id,)]) == 1

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        return self._write_each(self.q["increment_failure_until"], [(to_micros(due_at), message_id)]) == 1

    def _release(self, message_ids: Sequence[str]) -> int:
        return self._write_each(self.q["release"], [(i,) for i in message_ids])

    def _get(self, message_id: str) -> DelayedMessage | None:
        with self._lock:
            row = self._conn.execute(self.q["get"], (message_id,)).fetchone()
        return None if row is None else _message(row)

    def _moved_ahead(self, message_id: str, now: datetime) -> bool:
        params = {"message_id": message_id, "now": to_micros(now)}
        with self._lock:
            return bool(self._conn.execute(QUERIES["moved_ahead"], params).fetchone()[0])

    def _stored_ids(self, message_ids: Sequence[str]) -> set[str]:
        with self._lock:
            rows = self._conn.execute(self.q["stored_ids"], (json.dumps(list(message_ids)),)).fetchall()
        return {r[0] for r in rows}

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        return self._write_each(self.q["delete_unclaimed"], [(message_id, to_micros(now))]) == 1

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        row = (group, to_micros(now), -1 if limit is None else limit)  # LIMIT -1: all
        return self._write_each(self.q["delete_group_unclaimed"], [row])

    def _count_group(self, group: str) -> int:
        with self._reading() as conn:
            return int(conn.execute(self.q["count_group"], (group,)).fetchone()[0])

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        row = (to_micros(due_at), message_id, to_micros(now))
        return self._write_each(self.q["reschedule_unclaimed"], [row]) == 1

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        message_id, *content = micros_row(message)
        return self._write_each(self.q["replace_unclaimed"], [(*content, message_id)]) == 1

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        self._write_each(QUERIES["beat"], [(endpoint, dispatcher_id, to_micros(seen_at), info)])

    def _presences(self, endpoint: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute(QUERIES["presences"], (endpoint,))]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        self._write_each(QUERIES["forget"], [(endpoint, to_micros(seen_before))])

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        return self._write_each(QUERIES["key_insert"], [(endpoint, name, info)]) == 1

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        return self._write_each(QUERIES["key_update"], [(info, endpoint, name)]) == 1

    def _key_records(self, endpoint: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute(QUERIES["key_records"], (endpoint,))]

    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        return self._write_each(QUERIES["record_insert"], [(endpoint, kind, name, info)]) == 1

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        return self._write_each(QUERIES["record_update"], [(info, endpoint, kind, name)]) == 1

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        return self._write_each(QUERIES["record_delete"], [(endpoint, kind, name)]) == 1

    def _records(self, endpoint: str, kind: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute(QUERIES["records"], (endpoint, kind))]

    def _audit_range(
        self, endpoint: str, above: str, below: str, limit: int, oldest_first: bool
    ) -> list[str]:
        sql = QUERIES["audit_oldest" if oldest_first else "audit_newest"]
        with self._lock:
            return [r[0] for r in self._conn.execute(sql, (endpoint, above, below, limit))]

    def _audit_prune(self, endpoint: str, below: str) -> int:
        return self._write_each(QUERIES["audit_prune"], [(endpoint, below)])

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        with self._lock, write_transaction(self._conn):
            if old is None:
                done = self._conn.execute(QUERIES["record_insert"], (endpoint, kind, name, new)).rowcount == 1
            else:
                done = (
                    self._conn.execute(QUERIES["record_swap"], (new, endpoint, kind, name, old)).rowcount == 1
                )
            if done:
                return True, None
            row = self._conn.execute(QUERIES["record_get"], (endpoint, kind, name)).fetchone()
        return False, None if row is None else row[0]

    def _hold(self, until: Mapping[str, datetime]) -> int:
        return self._write_each(self.q["hold"], [(to_micros(t), i) for i, t in until.items()])

    def _release_held(self) -> int:
        return self._write_each(self.q["release_held"], [()])

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        q, changed = self.q, 0
        with self._lock, write_transaction(self._conn):
            for old, new in pairs:
                row = self._conn.execute(q["reseal_look"], (old.message_id,)).fetchone()
                if row is not None and (load_headers(row[0]), bytes(row[1])) == (dict(old.headers), old.body):
                    self._conn.execute(q["reseal"], (dump_headers(new.headers), new.body, old.message_id))
                    changed += 1
        return changed

    # --- recurring schedules ------------------------------------------------------------------
    def _schedule_insert(self, row: ScheduleRow) -> bool:
        params = (self._ready(), row.schedule_id, row.text, _micros(row.planned_until))
        return self._schedules(lambda: self._write_each(QUERIES["schedule_insert"], [params])) == 1

    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        endpoint = self._ready()

        def write() -> list[bool]:
            written = []
            with self._lock, write_transaction(self._conn):
                for row, ticks in changes:
                    params = (row.text, _micros(row.planned_until), endpoint, row.schedule_id, row.version)
                    done = self._conn.execute(QUERIES["schedule_update"], params).rowcount == 1
                    if done and ticks:
                        self._conn.executemany(self.q["insert_new"], [micros_row(t) for t in ticks])
                    written.append(done)
            return written

        return self._schedules(write)

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        rows = self._schedule_rows("schedule_get", (self._ready(), schedule_id))
        return rows[0] if rows else None

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedule_page", (self._ready(), after, limit))

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedules_to_plan", (self._ready(), to_micros(until), limit))

    def _schedule_delete(self, schedule_id: str) -> bool:
        params = (self._ready(), schedule_id)
        return self._schedules(lambda: self._write_each(QUERIES["schedule_delete"], [params])) == 1

    def _schedule_rows(self, name: str, params: tuple[Any, ...]) -> list[ScheduleRow]:
        def read() -> list[ScheduleRow]:
            with self._lock:
                rows = self._conn.execute(QUERIES[name], params).fetchall()
            return [ScheduleRow(r[0], r[1], None if r[2] is None else from_micros(r[2]), r[3]) for r in rows]

        return self._schedules(read)

    def _schedules(self, work: Callable[[], T]) -> T:
        """A store set up before schedules existed has no table for them: `duetime setup` adds it."""
        try:
            return work()
        except sqlite3.OperationalError as error:
            if "duetime_schedules" in str(error):
                raise schedules_need_setup() from None
            raise

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The operator's connection (opened on first use), for reads that may take long."""
        with self._read_lock:
            if self._reader is None:
                self._reader = connect(self.path, "normal", self._conn.write_lock_timeout)
            yield self._reader

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        where, params = sql_filters(query, ":{}", to_micros, row_values=True)
        sql = (
            f"SELECT {_COLUMNS} FROM {self.q['table']} WHERE {where} ORDER BY due_at, message_id LIMIT :limit"
        )
        with self._reading() as conn:
            rows = conn.execute(sql, params | {"limit": limit}).fetchall()
        return [_message(r) for r in rows]

    def _count_due(self, at: datetime) -> int:
        with self._lock:
            return int(self._conn.execute(self.q["count_due"], {"at": to_micros(at)}).fetchone()[0])

    def _count_destinations(self) -> int:
        with self._reading() as conn:
            return int(conn.execute(self.q["count_destinations"]).fetchone()[0])

    def _count(self, at: datetime) -> StoreCounts:
        q, now = self.q, {"at": to_micros(at)}
        with self._reading() as conn:
            conn.execute("BEGIN")  # one snapshot for every figure
            try:
                total, due, claimed, failing, held = (
                    conn.execute(q[name], now if ":at" in q[name] else {}).fetchone()[0]
                    for name in ("count_total", "count_due", "count_claimed", "count_failing", "count_held")
                )
                by_destination = dict(conn.execute(q["count_by_destination"]).fetchall())
            finally:
                conn.execute("COMMIT")
        return StoreCounts(total, due, claimed, failing, None, by_destination, held=held)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file (cross-process wake-ups)."""
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def own_changes(self) -> int:
        """Rows this store's own connection has changed since it opened: what this process did (a
        dispatcher's move), which ``data_version`` leaves out."""
        with self._lock:
            return self._conn.total_changes

    def move_due(
        self,
        at: datetime,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome:
        """Exactly-once: select due rows, enqueue them (or dead-letter them), delete them, commit.

        Most batches are moved by three statements SQLite runs by itself (``move_due_*`` in
        queries.sql): a Python tuple per message, built and bound, cost as much as the SQL. A batch
        with a row only Python can forward (an NServiceBus timeout, a destination that does not
        exist, odd headers) is moved row by row, and only what is due at ``at``.

        ``until`` (later than ``at``): the move is made ahead, taking also what comes due by then;
        each such message is in its queue from now on, visible to receivers at its due time
        (rounded up to a whole ``budget``, when one is given).
        """
        now = to_micros(check_due_time(at, "at"))
        ahead = now if until is None else max(now, to_micros(check_due_time(until, "until")))
        with self._lock:
            with write_transaction(self._conn):
                step = budget // timedelta(microseconds=1)
                moved, dead = self._move(now, ahead, step, limit, error_queue, error_headers)
            return MoveOutcome(moved, dead, self._next_due_after_move())

    def _move(
        self,
        now: int,
        until: int,
        step: int,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> tuple[list[Moved], list[tuple[DelayedMessage, str]]]:
        q = self.q
        window = {"at": now, "until": until, "limit": limit}
        look = self._conn.execute(q["move_due_look"], window).fetchall()
        if not look:
            return [], []
        known = {destination: queue_exists(self._conn, destination) for destination in {r[1] for r in look}}
        if not all(known.values()) or any(r[4] for r in look):
            return self._move_by_hand(now, limit, known, error_queue, error_headers)
        inserted = self._conn.execute(q["move_due_enqueue"], window | {"now": now, "step": step}).rowcount
        deleted = self._conn.execute(q["move_due_delete"], window).rowcount
        if inserted != len(look) or deleted != len(look):  # never expected: roll back, say so
            raise RuntimeError(f"a move saw {len(look)} due rows, copied {inserted} and deleted {deleted}")
        return [
            Moved(r[0], r[1], from_micros(r[2]), traceparent_of(r[3]) if r[3] else None) for r in look
        ], []

    def _move_by_hand(
        self,
        now: int,
        limit: int,
        known: dict[str, bool],
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> tuple[list[Moved], list[tuple[DelayedMessage, str]]]:
        """The move a row at a time, in the caller's transaction, for batches SQL cannot move alone."""
        moved: list[Moved] = []
        dead: list[tuple[DelayedMessage, str]] = []
        rows = self._conn.execute(self.q["select_due_unclaimed"], {"at": now, "limit": limit}).fetchall()
        queued: list[tuple[Any, ...]] = []
        for row in rows:
            message_id, destination, due_micros, headers_json, body = row[:5]
            if known[destination]:
                due_at = from_micros(due_micros)
                headers = outgoing_headers_json(headers_json, due_at, message_id)
                queued.append((destination, message_id, headers, body, now, now))
                moved.append(Moved(message_id, destination, due_at, traceparent_of(headers_json)))
            else:
                message = _message(row)
                reason = f"Destination {destination!r} does not exist."
                enqueue(self._conn, error_queue, message, error_headers(message, reason), now)
                dead.append((message, reason))
        self._conn.executemany(QUERIES["enqueue"], queued)
        self._conn.executemany(self.q["delete"], [(r[0],) for r in rows])
        if dead:
            self._conn.execute(QUERIES["declare_queue"], (error_queue, now))
        return moved, dead


class SqliteStore(TransactionalBridge):
    """The async SQLite store: the sync store on its own thread, plus cross-process wake-ups.

    While someone is subscribed, it watches the file for writes by other processes (inotify;
    else ``PRAGMA data_version`` every ``watch_interval`` seconds), so a message stored by another
    process wakes a sleeping dispatcher here.
    """

    sync: SyncSqliteStore
    needs = "a SQLite queue transport on the same file"

    def __init__(self, sync: SyncSqliteStore, *, watch_interval: float = 0.02) -> None:
        super().__init__(sync, name="sqlite-store", watch=self._watch_file, reads_apart=True)
        self.watch_interval = watch_interval

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SqliteStore:
        _, options = url_options(url, OPTIONS | {"watch_interval"}, "SQLite")
        watch = number_option(options, "watch_interval", 0.02)
        rest = "&".join(f"{k}={v}" for k, v in options.items() if k != "watch_interval")
        trimmed = url.split("?")[0]
        sync = SyncSqliteStore.from_url(trimmed + ("?" + rest if rest else ""), claim_timeout=claim_timeout)
        return cls(sync, watch_interval=watch)

    @property
    def path(self) -> Path:
        return self.sync.path

    async def _watch_file(self, subscribers: Subscribers) -> None:
        """Tell subscribers when another process commits, from a thread of its own (:class:`_Watcher`)
        until cancelled."""
        watcher = _Watcher(self, subscribers, asyncio.get_running_loop())
        watcher.start()
        try:
            await asyncio.Future()  # until cancelled (the store closes)
        finally:
            watcher.stop()

    def shares_transaction_with(self, transport: object) -> bool:
        return isinstance(transport, SqliteQueueTransport) and _same_file(transport.path, self.path)


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


class _Watcher:
    """The SQLite store's wake-up: asleep on the file's write events (:mod:`.filewatch`), reading
    ``data_version`` every ``watch_interval`` where those cannot be had and for a moment after each
    event, and on a change telling the subscribers the earliest due time (on their loop).

    It runs on a thread of its own rather than on the event loop: while a consumer takes messages
    from a queue in the same file, the file changes a few hundred times a second, and each look
    made on the loop (a timer, a hand-off to the store's thread and back) cost the dispatcher more
    CPU than delivering the message (bench/rate_cost_bench.py). Here a look is a few microseconds,
    and the loop hears only of a commit by another process.

    Most commits by others are not new messages: the earliest due time is told, and a sleeping
    dispatcher wakes only if that is before the time it sleeps until. The question failing:
    "unknown" (None), which wakes it. An answer the subscribers heard already (the same earliest
    due time, and nothing changed by this process since) is not told again: a consumer taking
    messages from a queue in the same file commits once a message, and each tell wakes the loop.
    """

    def __init__(self, store: SqliteStore, subscribers: Subscribers, loop: asyncio.AbstractEventLoop) -> None:
        self._store, self._subscribers, self._loop = store, subscribers, loop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duetime-sqlite-watch", daemon=True)
        #: The last answer told: the earliest due time, and this process's own changes when it was read.
        self._told: tuple[datetime, int] | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread at its next look (at most ``RECHECK`` seconds; it holds nothing)."""
        self._stopped.set()

    def _run(self) -> None:
        stopped = self._stopped
        watch = watch_file(self._store.path)
        try:
            version = self._version()
            if not stopped.is_set():  # a commit between the dispatcher's look and this watch: heard now
                self._tell()
            looks = Looks()
            while not stopped.is_set():
                if watch is None:
                    stopped.wait(self._store.watch_interval)
                else:
                    looks.after(bool(watch.try_wait(looks.timeout())))
                current = self._version()
                if current is not None and current != version and not stopped.is_set():
                    version = current
                    self._tell()
        except RuntimeError:  # the loop closed under us: nobody is left to tell
            pass
        finally:
            if watch is not None:
                watch.close()

    def _version(self) -> int | None:
        try:
            return self._store.sync.data_version()
        except Exception:  # closed, or the file busy for a moment: look again later
            return None

    def _tell(self) -> None:
        try:
            # read before the due time: a move of this process in between makes the next answer new
            changes = self._store.sync.own_changes()
            due: datetime | None = self._store.sync.next_due()
        except Exception:
            due, self._told = None, None
        else:
            if due is None:
                return  # nothing stored: no one to wake
            if (due, changes) == self._told:
                return  # heard already, and nothing here changed since
            self._told = (due, changes)
        self._loop.call_soon_threadsafe(self._subscribers.notify, due)
