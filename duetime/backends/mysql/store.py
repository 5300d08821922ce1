"""The MariaDB / MySQL store (PyMySQL), for teams whose database is MariaDB 10.6+ or MySQL 8.

The same contract as PostgreSQL, with these differences, each with the best substitute:

- No ``UPDATE … RETURNING``: a claim is ``SELECT … FOR UPDATE SKIP LOCKED`` then ``UPDATE`` in one
  READ COMMITTED transaction (two statements, one round trip each, still a batch).
- No LISTEN/NOTIFY: a dispatcher here wakes at once for messages stored through the same store
  object; for other processes it looks at the next due time every ``poll_interval`` (0.25 s).
- No ``COPY``: ``store_many`` sends multi-row INSERTs (PyMySQL batches ``executemany``).
- No queue transport yet: at-least-once into any transport; exactly-once needs PostgreSQL or SQLite.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
from pymysql.err import IntegrityError, InterfaceError, OperationalError, ProgrammingError

from duetime._bridge import AsyncStoreBridge
from duetime.clock import from_micros, to_micros
from duetime.errors import (
    ConfigurationError,
    DuplicateMessageId,
    MessageInFlight,
    StoreNotReady,
    connection_failed,
)
from duetime.interfaces import ListQuery, Page, StoreCounts
from duetime.message import DelayedMessage, check_due_time
from duetime.names import check_name
from duetime.settings import TransactionMode
from duetime.sqlfile import load_queries
from duetime.urls import number_option, redact

QUERIES = load_queries("duetime.backends.mysql")
SCHEMA_VERSION = 1
EXACT_COUNT_LIMIT = 1_000_000
_COLUMNS = "message_id, destination, due_at, headers, body, failure_count"
_OPTIONS = {"table", "claim_timeout", "poll_interval", "connect_timeout"}


@dataclass(frozen=True, slots=True)
class MysqlOptions:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    table: str | None = None
    claim_timeout: timedelta = timedelta(seconds=30)
    poll_interval: float = 0.25
    connect_timeout: float = 5.0
    display: str = ""

    @classmethod
    def from_url(cls, url: str) -> MysqlOptions:
        parts = urlsplit(url)
        if parts.scheme not in ("mysql", "mariadb"):
            raise ConfigurationError(
                f"Not a MariaDB/MySQL URL: {redact(url)}; write mysql://user@host:3306/db."
            )
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ConfigurationError(
                f"{redact(url)} names no database; e.g. mysql://root@127.0.0.1:3306/test."
            )
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigurationError(
                f"Unknown MySQL URL option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}."
            )
        claim = number_option(options, "claim_timeout", 30.0)
        poll = number_option(options, "poll_interval", 0.25)
        connect = number_option(options, "connect_timeout", 5.0)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=database,
            table=None if "table" not in options else check_name("table", options["table"]),
            claim_timeout=timedelta(seconds=claim),
            poll_interval=poll,
            connect_timeout=connect,
            display=redact(url),
        )


def _ident(name: str) -> str:
    if len(name) > 64:
        name = name[:53] + "_" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return "`" + name.replace("`", "``") + "`"


def _message(row: Sequence[Any]) -> DelayedMessage:
    return DelayedMessage.from_store(
        row[0], row[1], from_micros(row[2]), bytes(row[4]), json.loads(row[3]), row[5]
    )


def mysql_connect(o: MysqlOptions, *, autocommit: bool) -> pymysql.connections.Connection[Any]:
    """A connection as duetime uses them: utf8mb4, READ COMMITTED (so SKIP LOCKED claims see
    each other's commits at once)."""
    return pymysql.connect(
        host=o.host,
        port=o.port,
        user=o.user,
        password=o.password,
        database=o.database,
        charset="utf8mb4",
        autocommit=autocommit,
        connect_timeout=int(o.connect_timeout),
        init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )


class SyncMysqlStore:
    """Blocking MariaDB/MySQL store; one connection behind a lock, re-opened after it breaks."""

    def __init__(self, options: MysqlOptions) -> None:
        self.options = options
        self._lock = threading.RLock()
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._q: dict[str, str] | None = None
        self._table: str | None = None
        self.endpoint: str | None = None

    @classmethod
    def from_url(cls, url: str) -> SyncMysqlStore:
        return cls(MysqlOptions.from_url(url))

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None:
            o = self.options
            try:
                self._conn = mysql_connect(o, autocommit=True)
            except pymysql.err.OperationalError as error:
                raise connection_failed(o.display, error.args[-1] if error.args else error) from None
        return self._conn

    def _run(self, work: Callable[[Any], Any], transaction: bool = False) -> Any:
        """Run ``work(cursor)``; a broken connection is dropped (the next call reconnects) and
        the error goes up to the dispatcher's breakers."""
        with self._lock:
            conn = self._connection()
            try:
                with conn.cursor() as cur:
                    if transaction:
                        conn.begin()
                    try:
                        result = work(cur)
                    except BaseException:
                        if transaction:
                            conn.rollback()
                        raise
                    if transaction:
                        conn.commit()
                    return result
            except (OperationalError, InterfaceError):
                self._drop()
                raise

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # it is broken already
                self._conn.close()
            self._conn = None

    def _queries(self, table: str, collation: str) -> dict[str, str]:
        return {name: sql.format(table=_ident(table), collation=collation) for name, sql in QUERIES.items()}

    def table_for(self, endpoint: str) -> str:
        return self.options.table or f"{check_name('endpoint', endpoint)}.delayed"

    def setup_infrastructure(self, endpoint: str) -> None:
        table = self.table_for(endpoint)

        def work(cur: Any) -> None:
            cur.execute("SELECT VERSION()")
            collation = "utf8mb4_nopad_bin" if "mariadb" in cur.fetchone()[0].lower() else "utf8mb4_0900_bin"
            q = self._queries(table, collation)
            cur.execute(q["setup_lock"])
            try:
                cur.execute(q["create_schema_table"])
                cur.execute(q["create_store_table"])
                cur.execute(q["record_version"], (f"store:{table}", SCHEMA_VERSION))
            finally:
                cur.execute(q["setup_unlock"])

        self._run(work)

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        table = self.table_for(endpoint)
        q = self._queries(table, "")

        def work(cur: Any) -> Any:
            try:
                cur.execute(q["read_version"], (f"store:{table}",))
            except ProgrammingError:
                return None
            return cur.fetchone()

        row = self._run(work)
        if row is None:
            raise StoreNotReady(
                f"No duetime table {table!r} in {self.options.display}: run `duetime setup` or call "
                "setup_infrastructure() first."
            )
        if row[0] > SCHEMA_VERSION:
            raise ConfigurationError(f"Table {table!r} has schema version {row[0]}; upgrade duetime.")
        self._q, self._table, self.endpoint = q, table, endpoint

    @property
    def q(self) -> dict[str, str]:
        if self._q is None:
            raise StoreNotReady("The store is not initialized: call initialize(endpoint, mode) first.")
        return self._q

    @property
    def table_sql(self) -> str:
        """The quoted table for statements built per call (IN lists); StoreNotReady before initialize."""
        self.q  # noqa: B018
        return _ident(self._table or "")

    def store(self, message: DelayedMessage) -> None:
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        rows = [
            (
                m.message_id,
                m.destination,
                to_micros(m.due_at),
                json.dumps(dict(m.headers), separators=(",", ":"), ensure_ascii=False),
                m.body,
                m.failure_count,
            )
            for m in messages
        ]
        if not rows:
            return 0
        q = self.q
        try:
            self._run(lambda cur: cur.executemany(q["insert"], rows), transaction=True)
        except IntegrityError as error:
            detail = str(error)
            hint = next(
                (m.message_id for m in messages if f"'{m.message_id}'" in detail), "(one of this batch)"
            )
            raise DuplicateMessageId(
                f"A delayed message with id {hint!r} is already stored; nothing from this call was stored. "
                "Choose a new id, or cancel the stored one first."
            ) from None
        return len(rows)

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        now = to_micros(check_due_time(at, "at"))
        token = uuid.uuid4().hex
        until = now + int(self.options.claim_timeout.total_seconds() * 1_000_000)
        q = self.q

        def work(cur: Any) -> list[Any]:
            cur.execute(q["select_due_for_claim"], (now, now, limit))
            rows = list(cur.fetchall())
            if rows:
                marks = ",".join(["%s"] * len(rows))
                cur.execute(
                    f"UPDATE {self.table_sql} SET claim_token = %s, claimed_until = %s WHERE message_id IN ({marks})",
                    (token, until, *[r[0] for r in rows]),
                )
            return rows

        return [_message(r) for r in self._run(work, transaction=True)]

    def next_due(self) -> datetime | None:
        q = self.q

        def work(cur: Any) -> list[Any]:
            cur.execute(q["next_unclaimed"])
            a = cur.fetchone()
            cur.execute(q["next_claim_expiry"])
            b = cur.fetchone()
            return [r[0] for r in (a, b) if r is not None and r[0] is not None]

        times = self._run(work)
        return from_micros(min(times)) if times else None

    def _each(self, sql: str, ids: Sequence[Any]) -> int:
        def work(cur: Any) -> int:
            return sum(cur.execute(sql, (i,)) for i in ids)

        return int(self._run(work, transaction=True)) if ids else 0

    def remove(self, message_id: str) -> bool:
        return self._each(self.q["delete"], [message_id]) == 1

    def remove_many(self, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        marks = ",".join(["%s"] * len(message_ids))
        sql = f"DELETE FROM {self.table_sql} WHERE message_id IN ({marks})"  # StoreNotReady before connecting
        return int(self._run(lambda cur: cur.execute(sql, tuple(message_ids))))

    def increment_failure_count(self, message_id: str) -> bool:
        return self._each(self.q["increment_failure"], [message_id]) == 1

    def release(self, message_ids: Sequence[str]) -> int:
        return self._each(self.q["release"], message_ids)

    def get(self, message_id: str) -> DelayedMessage | None:
        q = self.q

        def work(cur: Any) -> Any:
            cur.execute(q["get"], (message_id,))
            return cur.fetchone()

        row = self._run(work)
        return None if row is None else _message(row)

    def _change(self, message_id: str, sql: str, params: tuple[Any, ...]) -> bool:
        now = to_micros(datetime.now(UTC))
        if self._run(lambda cur: cur.execute(sql, (*params, now))) == 1:
            return True
        if self.get(message_id) is not None:
            raise MessageInFlight(
                f"Message {message_id!r} is being forwarded right now; it cannot be changed."
            )
        return False

    def cancel(self, message_id: str) -> bool:
        return self._change(message_id, self.q["delete_unclaimed"], (message_id,))

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due = to_micros(check_due_time(due_at))
        return self._change(message_id, self.q["reschedule_unclaimed"], (due, message_id))

    def list(self, query: ListQuery) -> Page:
        where = ["failure_count >= %s"]
        params: list[Any] = [query.min_failures]
        if query.destination is not None:
            where.append("destination = %s")
            params.append(query.destination)
        if query.due_before is not None:
            where.append("due_at < %s")
            params.append(to_micros(check_due_time(query.due_before, "due_before")))
        if query.due_after is not None:
            where.append("due_at >= %s")
            params.append(to_micros(check_due_time(query.due_after, "due_after")))
        if query.after is not None:
            after_due = to_micros(query.after[0])
            where.append("(due_at > %s OR (due_at = %s AND message_id > %s))")
            params += [after_due, after_due, query.after[1]]
        sql = (
            f"SELECT {_COLUMNS} FROM {self.table_sql} WHERE {' AND '.join(where)} "
            "ORDER BY due_at, message_id LIMIT %s"
        )

        def work(cur: Any) -> list[Any]:
            cur.execute(sql, (*params, query.limit + 1))
            return list(cur.fetchall())

        rows = self._run(work)
        messages = [_message(r) for r in rows[: query.limit]]
        more = len(rows) > query.limit
        return Page(messages, (messages[-1].due_at, messages[-1].message_id) if more and messages else None)

    def counts(self, at: datetime) -> StoreCounts:
        now = to_micros(check_due_time(at, "at"))
        q = self.q

        def one(cur: Any, key: str, params: tuple[Any, ...] = ()) -> Any:
            cur.execute(q[key], params)
            return cur.fetchone()[0]

        def work(cur: Any) -> StoreCounts:
            estimate = one(cur, "estimate_rows", (self._table,)) or 0
            large = estimate > EXACT_COUNT_LIMIT
            by_destination: dict[str, int] = {}
            if not large:
                cur.execute(q["count_by_destination"])
                by_destination = {r[0]: r[1] for r in cur.fetchall()}
            return StoreCounts(
                total=estimate if large else one(cur, "count_total"),
                due=one(cur, "count_due", (now,)),
                claimed=one(cur, "count_claimed", (now,)),
                failing=one(cur, "count_failing"),
                next_due=None,
                by_destination=by_destination,
            )

        counts: StoreCounts = self._run(work)
        return StoreCounts(
            counts.total, counts.due, counts.claimed, counts.failing, self.next_due(), counts.by_destination
        )

    def close(self) -> None:
        with self._lock:
            self._drop()


class MysqlStore(AsyncStoreBridge):
    """The async MariaDB/MySQL store: the sync store on its own thread, plus a next-due poller
    standing in for LISTEN/NOTIFY (see the module docstring)."""

    sync: SyncMysqlStore

    def __init__(self, sync: SyncMysqlStore) -> None:
        super().__init__(sync, threaded=True, name="mysql-store")
        self._watcher: asyncio.Task[None] | None = None
        self._poller = SyncMysqlStore(sync.options)

    @classmethod
    def from_url(cls, url: str) -> MysqlStore:
        return cls(SyncMysqlStore.from_url(url))

    def subscribe(self, callback: Callable[[datetime | None], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(callback)
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return unsubscribe

    async def _watch(self) -> None:
        if self.sync.endpoint is None:
            return
        self._poller.initialize(self.sync.endpoint, TransactionMode.AT_LEAST_ONCE)
        last: datetime | None = None
        while True:
            await asyncio.sleep(self.sync.options.poll_interval)
            try:
                current = await asyncio.to_thread(self._poller.next_due)
            except Exception:  # the dispatcher's fetch breaker reports database trouble
                continue
            if current is not None and (last is None or current < last):
                self.subscribers.notify(current)
            last = current

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        await asyncio.to_thread(self._poller.close)
        await super().close()
