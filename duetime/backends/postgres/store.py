"""The PostgreSQL store (psycopg 3 and its pools): async for the dispatcher, sync for producers.

Claims take due rows with ``FOR UPDATE SKIP LOCKED`` in batches and mark them with a lease, so many
dispatchers share one table and none receives another's message; storing sends ``NOTIFY`` in the
same transaction, so a sleeping dispatcher anywhere wakes when an earlier message arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from duetime._bridge import Subscribers
from duetime.backends.postgres.common import (
    SCHEMA_VERSION,
    PgNames,
    PgOptions,
    copy_row,
    decode,
    dump_headers,
    reach,
    reach_async,
    table_for,
)
from duetime.backends.postgres.queue import PostgresQueueTransport, queue_schema_statements
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError, DuplicateMessageId, MessageInFlight, StoreNotReady
from duetime.interfaces import ListQuery, Moved, MoveOutcome, Page, StoreCounts, WakeupCallback
from duetime.message import DelayedMessage, check_due_time, outgoing_headers_json
from duetime.settings import TransactionMode

log = logging.getLogger("duetime.postgres")
#: Above this many rows (by the planner's estimate) counts are estimates, not full scans.
EXACT_COUNT_LIMIT = 1_000_000


def _duplicate(error: Exception, messages: Sequence[DelayedMessage]) -> DuplicateMessageId:
    detail = getattr(getattr(error, "diag", None), "message_detail", None) or ""
    hint = next((m.message_id for m in messages if f"({m.message_id})" in detail), None)
    return DuplicateMessageId(
        f"A delayed message with id {hint or '(one of this batch)'!r} is already stored; nothing from "
        "this call was stored. Choose a new id, or cancel the stored one first."
    )


def _not_ready(names: PgNames, display: str) -> StoreNotReady:
    return StoreNotReady(
        f"No duetime table {names.table!r} in schema {names.schema!r} at {display}: run `duetime setup` "
        "or call setup_infrastructure() first."
    )


def _setup_statements(names: PgNames) -> list[tuple[str, dict[str, Any]]]:
    """Everything under one advisory lock, taken first: ``CREATE … IF NOT EXISTS`` alone is not
    safe when several processes run it at the same moment."""
    q = names.q
    return [
        (q["advisory_lock"], {"key": names.setup_lock}),
        (f"CREATE SCHEMA IF NOT EXISTS {names.quoted_schema}", {}),
        (q["create_schema_version"], {}),
        (q["create_store_table"], {}),
        (q["create_store_due_index"], {}),
        (q["create_store_claim_index"], {}),
        (q["create_store_destination_index"], {}),
        (q["create_store_failing_index"], {}),
        *[(sql, {}) for sql in queue_schema_statements(q)],
        (q["record_version"], {"component": names.component(), "version": SCHEMA_VERSION}),
    ]


def _list_sql(names: PgNames, query: ListQuery) -> tuple[str, dict[str, Any]]:
    where = ["failure_count >= %(min_failures)s"]
    params: dict[str, Any] = {"min_failures": query.min_failures, "limit": query.limit + 1}
    if query.destination is not None:
        where.append("destination = %(destination)s")
        params["destination"] = query.destination
    if query.due_before is not None:
        where.append("due_at < %(due_before)s")
        params["due_before"] = check_due_time(query.due_before, "due_before")
    if query.due_after is not None:
        where.append("due_at >= %(due_after)s")
        params["due_after"] = check_due_time(query.due_after, "due_after")
    if query.after is not None:
        where.append("(due_at, message_id) > (%(after_due)s, %(after_id)s)")
        params["after_due"], params["after_id"] = query.after
    sql = (
        f"SELECT message_id, destination, due_at, headers::text, body, failure_count FROM {names.qualified} "
        f"WHERE {' AND '.join(where)} ORDER BY due_at, message_id LIMIT %(limit)s"
    )
    return sql, params


def _page(rows: list[Any], limit: int) -> Page:
    messages = [decode(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(messages, (messages[-1].due_at, messages[-1].message_id) if more and messages else None)


def _next(unclaimed: Any, expiry: Any) -> datetime | None:
    times = [r[0] for r in (unclaimed, expiry) if r is not None and r[0] is not None]
    return min(times).astimezone(UTC) if times else None


class _Base:
    def __init__(self, options: PgOptions) -> None:
        self.options = options
        self._names: PgNames | None = None
        self.endpoint: str | None = None

    def names_for(self, endpoint: str) -> PgNames:
        return PgNames(self.options.schema, table_for(self.options, endpoint))

    @property
    def names(self) -> PgNames:
        if self._names is None:
            raise StoreNotReady("The store is not initialized: call initialize(endpoint, mode) first.")
        return self._names

    def _claim_params(self, at: datetime, limit: int) -> dict[str, Any]:
        at = check_due_time(at, "at")
        return {"token": uuid.uuid4(), "until": at + self.options.claim_timeout, "at": at, "limit": limit}

    def _in_flight(self, message_id: str) -> MessageInFlight:
        return MessageInFlight(f"Message {message_id!r} is being forwarded right now; it cannot be changed.")


class SyncPostgresStore(_Base):
    """Blocking PostgreSQL store over a psycopg ``ConnectionPool``; thread-safe."""

    def __init__(self, options: PgOptions) -> None:
        super().__init__(options)
        reach(options)
        self.pool = ConnectionPool(
            options.conninfo,
            min_size=1,
            max_size=options.pool_size,
            open=True,
            kwargs={"autocommit": True},
            name="duetime-sync",
            timeout=options.pool_timeout,
        )

    @classmethod
    def from_url(cls, url: str) -> SyncPostgresStore:
        return cls(PgOptions.from_url(url))

    def setup_infrastructure(self, endpoint: str) -> None:
        names = self.names_for(endpoint)
        with self.pool.connection() as conn, conn.transaction():
            for sql, params in _setup_statements(names):
                conn.execute(sql, params)

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        names = self.names_for(endpoint)
        with self.pool.connection() as conn:
            try:
                row = conn.execute(names.q["read_version"], {"component": names.component()}).fetchone()
            except pg_errors.UndefinedTable:
                row = None
        if row is None:
            raise _not_ready(names, self.options.display)
        if row[0] > SCHEMA_VERSION:
            raise ConfigurationError(f"Table {names.table!r} has schema version {row[0]}; upgrade duetime.")
        self._names, self.endpoint = names, endpoint

    def store(self, message: DelayedMessage) -> None:
        """One statement, one round trip: the insert and its NOTIFY commit together."""
        try:
            with self.pool.connection() as conn:
                conn.execute(self.names.q["insert_notify"], _single(message, self.names))
        except pg_errors.UniqueViolation as error:
            raise _duplicate(error, [message]) from None

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        if not messages:
            return 0
        q = self.names.q
        try:
            with self.pool.connection() as conn, conn.transaction():
                if len(messages) < 8:
                    with conn.cursor() as cur:
                        cur.executemany(
                            q["insert"], [dict(zip(_FIELDS, copy_row(m), strict=True)) for m in messages]
                        )
                else:
                    with conn.cursor() as cur, cur.copy(q["copy_in"]) as copy:
                        for m in messages:
                            copy.write_row(copy_row(m))
                earliest = min(m.due_at for m in messages)
                conn.execute(
                    q["notify"], {"channel": self.names.channel, "payload": str(to_micros(earliest))}
                )
        except pg_errors.UniqueViolation as error:
            raise _duplicate(error, messages) from None
        return len(messages)

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        with self.pool.connection() as conn:
            rows = conn.execute(self.names.q["claim_due"], self._claim_params(at, limit)).fetchall()
        return sorted((decode(r) for r in rows), key=lambda m: (m.due_at, m.message_id))

    def next_due(self) -> datetime | None:
        q = self.names.q
        with self.pool.connection() as conn:
            return _next(
                conn.execute(q["next_unclaimed"]).fetchone(), conn.execute(q["next_claim_expiry"]).fetchone()
            )

    def remove(self, message_id: str) -> bool:
        return self.remove_many([message_id]) == 1

    def remove_many(self, message_ids: Sequence[str]) -> int:
        with self.pool.connection() as conn:
            return conn.execute(self.names.q["delete_many"], {"ids": list(message_ids)}).rowcount

    def increment_failure_count(self, message_id: str) -> bool:
        with self.pool.connection() as conn:
            return conn.execute(self.names.q["increment_failure"], {"id": message_id}).rowcount == 1

    def release(self, message_ids: Sequence[str]) -> int:
        with self.pool.connection() as conn:
            return conn.execute(self.names.q["release_many"], {"ids": list(message_ids)}).rowcount

    def get(self, message_id: str) -> DelayedMessage | None:
        with self.pool.connection() as conn:
            row = conn.execute(self.names.q["get"], {"id": message_id}).fetchone()
        return None if row is None else decode(row)

    def _change(self, message_id: str, sql: str, params: dict[str, Any]) -> bool:
        with self.pool.connection() as conn:
            if conn.execute(sql, params).rowcount == 1:
                return True
            exists = conn.execute(self.names.q["get"], {"id": message_id}).fetchone() is not None
        if exists:
            raise self._in_flight(message_id)
        return False

    def cancel(self, message_id: str) -> bool:
        return self._change(message_id, self.names.q["delete_unclaimed"], {"id": message_id})

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due = check_due_time(due_at)
        if self._change(message_id, self.names.q["reschedule_unclaimed"], {"id": message_id, "due_at": due}):
            with self.pool.connection() as conn:
                conn.execute(
                    self.names.q["notify"], {"channel": self.names.channel, "payload": str(to_micros(due))}
                )
            return True
        return False

    def list(self, query: ListQuery) -> Page:
        sql, params = _list_sql(self.names, query)
        with self.pool.connection() as conn:
            return _page(conn.execute(sql, params).fetchall(), query.limit)

    def counts(self, at: datetime) -> StoreCounts:
        at = check_due_time(at, "at")
        q = self.names.q
        with self.pool.connection() as conn:

            def one(key: str, params: dict[str, Any]) -> Any:
                return conn.execute(q[key], params).fetchall()

            return _counts(one, self.names, at, self.next_due())

    def close(self) -> None:
        self.pool.close()


_FIELDS = ("message_id", "destination", "due_at", "headers", "body", "failure_count")


def _single(message: DelayedMessage, names: PgNames) -> dict[str, Any]:
    params = dict(zip(_FIELDS, copy_row(message), strict=True))
    return params | {"channel": names.channel, "payload": str(to_micros(message.due_at))}


def _counts(
    run: Callable[[str, dict[str, Any]], list[Any]], names: PgNames, at: datetime, nxt: datetime | None
) -> StoreCounts:
    """Exact while the table is small; past EXACT_COUNT_LIMIT rows (the planner's estimate) the
    total is that estimate and per-destination counts are left out: `stats` never scans millions."""
    estimate = run("estimate_rows", {"regclass": names.qualified})[0][0]
    large = estimate > EXACT_COUNT_LIMIT
    return StoreCounts(
        total=estimate if large else run("count_total", {})[0][0],
        due=run("count_due", {"at": at})[0][0],
        claimed=run("count_claimed", {"at": at})[0][0],
        failing=run("count_failing", {})[0][0],
        next_due=nxt,
        by_destination={} if large else dict(run("count_by_destination", {})),
    )


class PostgresStore(_Base):
    """The async PostgreSQL store, with LISTEN/NOTIFY wake-ups across processes."""

    def __init__(self, options: PgOptions, *, listen_check: float = 5.0) -> None:
        super().__init__(options)
        self.pool = AsyncConnectionPool(
            options.conninfo,
            min_size=1,
            max_size=options.pool_size,
            open=False,
            kwargs={"autocommit": True},
            name="duetime-async",
            timeout=options.pool_timeout,
        )
        self._opened = False
        self.subscribers = Subscribers()
        self._listener: asyncio.Task[None] | None = None
        self.listen_check = listen_check

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        return cls(PgOptions.from_url(url))

    async def _pool(self) -> AsyncConnectionPool:
        if not self._opened:
            await reach_async(self.options)
            await self.pool.open(wait=False)
            self._opened = True
        return self.pool

    async def setup_infrastructure(self, endpoint: str) -> None:
        names = self.names_for(endpoint)
        pool = await self._pool()
        async with pool.connection() as conn, conn.transaction():
            for sql, params in _setup_statements(names):
                await conn.execute(sql, params)

    async def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        names = self.names_for(endpoint)
        pool = await self._pool()
        async with pool.connection() as conn:
            try:
                row = await (
                    await conn.execute(names.q["read_version"], {"component": names.component()})
                ).fetchone()
            except pg_errors.UndefinedTable:
                row = None
        if row is None:
            raise _not_ready(names, self.options.display)
        if row[0] > SCHEMA_VERSION:
            raise ConfigurationError(f"Table {names.table!r} has schema version {row[0]}; upgrade duetime.")
        self._names, self.endpoint = names, endpoint

    async def store(self, message: DelayedMessage) -> None:
        """One statement, one round trip: the insert and its NOTIFY commit together."""
        pool = await self._pool()
        try:
            async with pool.connection() as conn:
                await conn.execute(self.names.q["insert_notify"], _single(message, self.names))
        except pg_errors.UniqueViolation as error:
            raise _duplicate(error, [message]) from None
        self.subscribers.notify(message.due_at)

    async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        if not messages:
            return 0
        q = self.names.q
        pool = await self._pool()
        try:
            async with pool.connection() as conn, conn.transaction():
                async with conn.cursor() as cur:
                    if len(messages) < 8:
                        await cur.executemany(
                            q["insert"], [dict(zip(_FIELDS, copy_row(m), strict=True)) for m in messages]
                        )
                    else:
                        async with cur.copy(q["copy_in"]) as copy:
                            for m in messages:
                                await copy.write_row(copy_row(m))
                earliest = min(m.due_at for m in messages)
                await conn.execute(
                    q["notify"], {"channel": self.names.channel, "payload": str(to_micros(earliest))}
                )
        except pg_errors.UniqueViolation as error:
            raise _duplicate(error, messages) from None
        self.subscribers.notify(earliest)
        return len(messages)

    async def _fetchall(self, sql: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        pool = await self._pool()
        async with pool.connection() as conn:
            return await (await conn.execute(sql, params)).fetchall()

    async def _rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        pool = await self._pool()
        async with pool.connection() as conn:
            return (await conn.execute(sql, params)).rowcount

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        rows = await self._fetchall(self.names.q["claim_due"], self._claim_params(at, limit))
        return sorted((decode(r) for r in rows), key=lambda m: (m.due_at, m.message_id))

    async def next_due(self) -> datetime | None:
        q = self.names.q
        pool = await self._pool()
        async with pool.connection() as conn:
            unclaimed = await (await conn.execute(q["next_unclaimed"])).fetchone()
            expiry = await (await conn.execute(q["next_claim_expiry"])).fetchone()
        return _next(unclaimed, expiry)

    async def remove(self, message_id: str) -> bool:
        return await self.remove_many([message_id]) == 1

    async def remove_many(self, message_ids: Sequence[str]) -> int:
        return await self._rowcount(self.names.q["delete_many"], {"ids": list(message_ids)})

    async def increment_failure_count(self, message_id: str) -> bool:
        return await self._rowcount(self.names.q["increment_failure"], {"id": message_id}) == 1

    async def release(self, message_ids: Sequence[str]) -> int:
        return await self._rowcount(self.names.q["release_many"], {"ids": list(message_ids)})

    async def get(self, message_id: str) -> DelayedMessage | None:
        rows = await self._fetchall(self.names.q["get"], {"id": message_id})
        return decode(rows[0]) if rows else None

    async def _change(self, message_id: str, sql: str, params: dict[str, Any]) -> bool:
        if await self._rowcount(sql, params) == 1:
            return True
        if await self.get(message_id) is not None:
            raise self._in_flight(message_id)
        return False

    async def cancel(self, message_id: str) -> bool:
        return await self._change(message_id, self.names.q["delete_unclaimed"], {"id": message_id})

    async def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due = check_due_time(due_at)
        if not await self._change(
            message_id, self.names.q["reschedule_unclaimed"], {"id": message_id, "due_at": due}
        ):
            return False
        await self._rowcount(
            self.names.q["notify"], {"channel": self.names.channel, "payload": str(to_micros(due))}
        )
        self.subscribers.notify(due)
        return True

    async def list(self, query: ListQuery) -> Page:
        sql, params = _list_sql(self.names, query)
        return _page(await self._fetchall(sql, params), query.limit)

    async def counts(self, at: datetime) -> StoreCounts:
        at = check_due_time(at, "at")
        q = self.names.q
        results: dict[str, list[Any]] = {}
        for key in ("estimate_rows", "count_due", "count_claimed", "count_failing"):
            params = {"regclass": self.names.qualified} if key == "estimate_rows" else {"at": at}
            results[key] = await self._fetchall(q[key], params)
        if results["estimate_rows"][0][0] <= EXACT_COUNT_LIMIT:
            results["count_total"] = await self._fetchall(q["count_total"])
            results["count_by_destination"] = await self._fetchall(q["count_by_destination"])
        nxt = await self.next_due()
        return _counts(lambda key, _params: results[key], self.names, at, nxt)

    # --- wake-ups -------------------------------------------------------------------------
    def subscribe(self, callback: WakeupCallback) -> Callable[[], None]:
        unsubscribe = self.subscribers.add(callback)
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        return unsubscribe

    async def _listen(self) -> None:
        """LISTEN on the table's channel; re-establish a dropped connection, and after every
        (re)connect tell subscribers to look again, since a NOTIFY may have been missed."""
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.options.conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {self.names.channel}")
                    backoff = 0.1
                    self.subscribers.notify(None)
                    while True:
                        async for note in conn.notifies(timeout=self.listen_check):
                            self.subscribers.notify(_due_from(note.payload))
                        await asyncio.wait_for(conn.execute("SELECT 1"), self.listen_check)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("LISTEN connection lost (%s); reconnecting", type(error).__name__)
                self.subscribers.notify(None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    # --- exactly-once ---------------------------------------------------------------------
    def shares_transaction_with(self, transport: object) -> bool:
        return (
            isinstance(transport, PostgresQueueTransport)
            and transport.options.conninfo == self.options.conninfo
            and transport.options.schema == self.options.schema
        )

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome:
        """Take due rows (SKIP LOCKED), enqueue them, delete them: one transaction, exactly-once."""
        if not self.shares_transaction_with(transport):
            raise ConfigurationError(
                "move_due needs a PostgreSQL queue transport on the same database and schema."
            )
        q = self.names.q
        pool = await self._pool()
        moved: list[Moved] = []
        dead: list[tuple[DelayedMessage, str]] = []
        async with pool.connection() as conn, conn.transaction():
            params = {"at": check_due_time(at, "at"), "limit": limit}
            rows = await (await conn.execute(q["take_due"], params)).fetchall()
            if not rows:
                return MoveOutcome(moved, dead)
            wanted = list({r[1] for r in rows})
            known = {
                r[0] for r in await (await conn.execute(q["existing_queues"], {"names": wanted})).fetchall()
            }
            queued: list[tuple[Any, ...]] = []
            for row in rows:
                message_id, destination, due_at, headers_json, body = row[:5]
                due_at = due_at.astimezone(UTC)
                if destination in known:
                    queued.append(
                        (destination, message_id, outgoing_headers_json(headers_json, due_at), body)
                    )
                    moved.append(Moved(message_id, destination, due_at))
                else:
                    message = decode(row)
                    reason = f"Destination {destination!r} does not exist."
                    queued.append(
                        (error_queue, message_id, dump_headers(error_headers(message, reason)), body)
                    )
                    dead.append((message, reason))
            async with conn.cursor() as cur:
                await cur.executemany(q["enqueue"], queued)
            if dead:
                await conn.execute(q["declare_queue"], {"name": error_queue})
        return MoveOutcome(moved, dead)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
        await self.pool.close()


def _due_from(payload: str) -> datetime | None:
    try:
        return from_micros(int(payload))
    except ValueError:
        return None
