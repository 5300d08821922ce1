"""The embedded default store: one SQLite file, WAL, safe for several processes on one host.

Claims are leases (``claim_token``, ``claimed_until``) taken in one ``UPDATE … RETURNING`` under
SQLite's write lock, so two dispatchers never receive the same message; a crashed dispatcher's
claims come back when the lease runs out.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from duetime._bridge import AsyncStoreBridge
from duetime.backends.sqlite.connection import (
    QUERIES,
    connect,
    dump_headers,
    load_headers,
    parse_sqlite_url,
    write_transaction,
)
from duetime.backends.sqlite.queue import (
    SqliteQueueTransport,
    create_queue_schema,
    enqueue,
    queue_exists,
)
from duetime.clock import SystemClock, from_micros, to_micros
from duetime.errors import ConfigurationError, DuplicateMessageId, MessageInFlight, StoreNotReady
from duetime.interfaces import ListQuery, Moved, MoveOutcome, Page, StoreCounts
from duetime.message import DelayedMessage, check_due_time, outgoing_headers_json
from duetime.names import check_name, quote_identifier
from duetime.settings import TransactionMode
from duetime.urls import number_option

SCHEMA_VERSION = 1
_COLUMNS = "message_id, destination, due_at, headers, body, failure_count"


def _message(row: Sequence[Any]) -> DelayedMessage:
    return DelayedMessage.from_store(
        row[0], row[1], from_micros(row[2]), bytes(row[4]), load_headers(row[3]), row[5]
    )


def _micros(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1_000_000)


class SyncSqliteStore:
    """The blocking SQLite store; thread-safe (one connection behind a lock)."""

    def __init__(
        self,
        path: str | Path,
        *,
        table: str | None = None,
        synchronous: str = "full",
        claim_timeout: timedelta = timedelta(seconds=30),
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.claim_timeout = claim_timeout
        self._table_override = None if table is None else check_name("table", table)
        self._conn = connect(self.path, synchronous, busy_timeout)
        self._lock = threading.RLock()
        self._q: dict[str, str] | None = None
        self.endpoint: str | None = None

    @classmethod
    def from_url(cls, url: str) -> SyncSqliteStore:
        path, options = parse_sqlite_url(url)
        unknown = set(options) - {"table", "synchronous", "claim_timeout", "busy_timeout"}
        if unknown:
            raise ConfigurationError(
                f"Unknown SQLite URL option(s) {sorted(unknown)}; known: table, synchronous, "
                "claim_timeout, busy_timeout."
            )
        return cls(
            path,
            table=options.get("table"),
            synchronous=options.get("synchronous", "full"),
            claim_timeout=timedelta(seconds=number_option(options, "claim_timeout", 30.0)),
            busy_timeout=number_option(options, "busy_timeout", 30.0),
        )

    def table_for(self, endpoint: str) -> str:
        """``<endpoint>.delayed`` unless a table name was given (NServiceBus's default naming)."""
        return self._table_override or f"{check_name('endpoint', endpoint)}.delayed"

    def _queries(self, table: str) -> dict[str, str]:
        names = {
            "table": quote_identifier(table),
            "index_due": quote_identifier(f"{table}_due"),
            "index_claim": quote_identifier(f"{table}_claim"),
            "index_destination": quote_identifier(f"{table}_destination"),
        }
        return {"table": names["table"]} | {name: sql.format(**names) for name, sql in QUERIES.items()}

    def setup_infrastructure(self, endpoint: str) -> None:
        table = self.table_for(endpoint)
        q = self._queries(table)
        with self._lock, write_transaction(self._conn):
            self._conn.execute(q["create_schema_table"])
            for name in (
                "create_store_table",
                "create_store_due_index",
                "create_store_claim_index",
                "create_store_destination_index",
            ):
                self._conn.execute(q[name])
            create_queue_schema(self._conn)
            self._conn.execute(q["record_version"], (f"store:{table}", SCHEMA_VERSION))

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        table = self.table_for(endpoint)
        with self._lock:
            try:
                row = self._conn.execute(QUERIES["read_version"], (f"store:{table}",)).fetchone()
            except sqlite3.OperationalError:
                row = None
            if row is None:
                raise StoreNotReady(
                    f"No duetime table {table!r} in {self.path}: run `duetime setup` "
                    "or call setup_infrastructure() first."
                )
            if row[0] > SCHEMA_VERSION:
                raise ConfigurationError(
                    f"Table {table!r} has schema version {row[0]}, newer than this duetime "
                    f"understands ({SCHEMA_VERSION}); upgrade duetime."
                )
            self._q = self._queries(table)
            self.endpoint = endpoint

    @property
    def q(self) -> dict[str, str]:
        if self._q is None:
            raise StoreNotReady("The store is not initialized: call initialize(endpoint, mode) first.")
        return self._q

    def store(self, message: DelayedMessage) -> None:
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        rows = [
            (
                m.message_id,
                m.destination,
                to_micros(m.due_at),
                dump_headers(m.headers),
                m.body,
                m.failure_count,
            )
            for m in messages
        ]
        q = self.q
        with self._lock:
            try:
                with write_transaction(self._conn):
                    self._conn.executemany(q["insert"], rows)
            except sqlite3.IntegrityError:
                duplicate = self._first_duplicate(messages)
                raise DuplicateMessageId(
                    f"A delayed message with id {duplicate!r} is already stored; nothing from "
                    "this call was stored. Choose a new id, or cancel the stored one first."
                ) from None
        return len(rows)

    def _first_duplicate(self, messages: Sequence[DelayedMessage]) -> str:
        seen: set[str] = set()
        for m in messages:
            if m.message_id in seen or self._conn.execute(self.q["get"], (m.message_id,)).fetchone():
                return m.message_id
            seen.add(m.message_id)
        return "?"

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        now = to_micros(check_due_time(at, "at"))
        params = {
            "token": uuid.uuid4().hex,
            "until": now + _micros(self.claim_timeout),
            "at": now,
            "limit": limit,
        }
        q = self.q
        with self._lock, write_transaction(self._conn):
            rows = self._conn.execute(q["claim_due"], params).fetchall()
        rows.sort(key=lambda r: (r[2], r[0]))
        return [_message(r) for r in rows]

    def next_due(self) -> datetime | None:
        q = self.q
        with self._lock:
            unclaimed = self._conn.execute(q["next_unclaimed"]).fetchone()
            expiry = self._conn.execute(q["next_claim_expiry"]).fetchone()
        times = [r[0] for r in (unclaimed, expiry) if r is not None and r[0] is not None]
        return from_micros(min(times)) if times else None

    def _write_each(self, sql: str, ids: Sequence[str]) -> int:
        with self._lock, write_transaction(self._conn):
            return self._conn.executemany(sql, [(i,) for i in ids]).rowcount

    def remove(self, message_id: str) -> bool:
        return self._write_each(self.q["delete"], [message_id]) == 1

    def remove_many(self, message_ids: Sequence[str]) -> int:
        return self._write_each(self.q["delete"], message_ids)

    def increment_failure_count(self, message_id: str) -> bool:
        return self._write_each(self.q["increment_failure"], [message_id]) == 1

    def release(self, message_ids: Sequence[str]) -> int:
        return self._write_each(self.q["release"], message_ids)

    def get(self, message_id: str) -> DelayedMessage | None:
        with self._lock:
            row = self._conn.execute(self.q["get"], (message_id,)).fetchone()
        return None if row is None else _message(row)

    def _change_unclaimed(self, message_id: str, sql: str, params: tuple[Any, ...]) -> bool:
        now = to_micros(SystemClock().now())
        with self._lock, write_transaction(self._conn):
            if self._conn.execute(sql, (*params, now)).rowcount == 1:
                return True
            exists = self._conn.execute(self.q["get"], (message_id,)).fetchone() is not None
        if exists:
            raise MessageInFlight(
                f"Message {message_id!r} is being forwarded right now; it cannot be changed."
            )
        return False

    def cancel(self, message_id: str) -> bool:
        return self._change_unclaimed(message_id, self.q["delete_unclaimed"], (message_id,))

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due = to_micros(check_due_time(due_at))
        return self._change_unclaimed(message_id, self.q["reschedule_unclaimed"], (due, message_id))

    def list(self, query: ListQuery) -> Page:
        where = ["failure_count >= :min_failures"]
        params: dict[str, Any] = {"min_failures": query.min_failures, "limit": query.limit + 1}
        if query.destination is not None:
            where.append("destination = :destination")
            params["destination"] = query.destination
        if query.due_before is not None:
            where.append("due_at < :due_before")
            params["due_before"] = to_micros(check_due_time(query.due_before, "due_before"))
        if query.due_after is not None:
            where.append("due_at >= :due_after")
            params["due_after"] = to_micros(check_due_time(query.due_after, "due_after"))
        if query.after is not None:
            where.append("(due_at, message_id) > (:after_due, :after_id)")
            params["after_due"] = to_micros(query.after[0])
            params["after_id"] = query.after[1]
        table = self.q["table"]
        sql = (
            f"SELECT {_COLUMNS} FROM {table} WHERE {' AND '.join(where)} "
            "ORDER BY due_at, message_id LIMIT :limit"
        )
        with self._lock:
            rows = self._conn.execute(sql, params).fetchall()
        messages = [_message(r) for r in rows[: query.limit]]
        more = len(rows) > query.limit
        cursor = (messages[-1].due_at, messages[-1].message_id) if more and messages else None
        return Page(messages, cursor)

    def counts(self, at: datetime) -> StoreCounts:
        now = to_micros(check_due_time(at, "at"))
        q = self.q
        with self._lock:
            total, due, claimed, failing = self._conn.execute(q["count_all"], {"at": now}).fetchone()
            by_destination = dict(self._conn.execute(q["count_by_destination"]).fetchall())
        return StoreCounts(total, due, claimed, failing, self.next_due(), by_destination)

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file (cross-process wake-ups)."""
        with self._lock:
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def move_due(
        self,
        at: datetime,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome:
        """Exactly-once: select due rows, enqueue them (or dead-letter them), delete them, commit."""
        now = to_micros(check_due_time(at, "at"))
        q = self.q
        moved: list[Moved] = []
        dead: list[tuple[DelayedMessage, str]] = []
        with self._lock, write_transaction(self._conn):
            rows = self._conn.execute(q["select_due_unclaimed"], {"at": now, "limit": limit}).fetchall()
            known: dict[str, bool] = {}
            queued: list[tuple[Any, ...]] = []
            for row in rows:
                message_id, destination, due_micros, headers_json, body = row[:5]
                if destination not in known:
                    known[destination] = queue_exists(self._conn, destination)
                if known[destination]:
                    due_at = from_micros(due_micros)
                    headers = outgoing_headers_json(headers_json, due_at)
                    queued.append((destination, message_id, headers, body, now, now))
                    moved.append(Moved(message_id, destination, due_at))
                else:
                    message = _message(row)
                    reason = f"Destination {destination!r} does not exist."
                    enqueue(self._conn, error_queue, message, error_headers(message, reason), now)
                    dead.append((message, reason))
            self._conn.executemany(QUERIES["enqueue"], queued)
            self._conn.executemany(q["delete"], [(r[0],) for r in rows])
            if dead:
                self._conn.execute(QUERIES["declare_queue"], (error_queue, now))
        return MoveOutcome(moved, dead)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class SqliteStore(AsyncStoreBridge):
    """The async SQLite store: the sync store on its own thread, plus cross-process wake-ups.

    While someone is subscribed, it watches ``PRAGMA data_version`` every ``watch_interval``
    seconds, so a message stored by another process wakes a sleeping dispatcher here.
    """

    sync: SyncSqliteStore
    #: SQLite has one writer at a time: a claim made while a batch is sent would only wait for it.
    parallel_claims = False

    def __init__(self, sync: SyncSqliteStore, *, watch_interval: float = 0.02) -> None:
        super().__init__(sync, threaded=True, name="sqlite-store")
        self.watch_interval = watch_interval
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        _, options = parse_sqlite_url(url)
        watch = number_option(options, "watch_interval", 0.02)
        trimmed = url.split("?")[0]
        rest = "&".join(f"{k}={v}" for k, v in options.items() if k != "watch_interval")
        return cls(SyncSqliteStore.from_url(trimmed + ("?" + rest if rest else "")), watch_interval=watch)

    @property
    def path(self) -> Path:
        return self.sync.path

    def subscribe(self, callback: Callable[[datetime | None], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(callback)
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return unsubscribe

    async def _watch(self) -> None:
        version = await self._call(self.sync.data_version)
        while True:
            await asyncio.sleep(self.watch_interval)
            try:
                current = await self._call(self.sync.data_version)
            except Exception:
                continue
            if current != version:
                version = current
                self.subscribers.notify(None)

    def shares_transaction_with(self, transport: object) -> bool:
        return isinstance(transport, SqliteQueueTransport) and _same_file(transport.path, self.path)

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome:
        if not self.shares_transaction_with(transport):
            raise ConfigurationError("move_due needs a SQLite queue transport on the same file.")
        return await self._call(self.sync.move_due, at, limit, error_queue, error_headers)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        await super().close()


def _same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()
