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
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import pymysql
from pymysql.constants.ER import LOCK_WAIT_TIMEOUT
from pymysql.err import IntegrityError, InterfaceError, OperationalError, ProgrammingError

from duetime.backends._keepalive import keep_alive
from duetime.backends._on_a_thread import AsyncStoreBridge, Subscribers, poll_next_due
from duetime.backends._schedules import Planned, schedules_need_setup
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    HOLD_TOKEN_SQL,
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    change_in_use,
    check_store_columns,
    claim_timeout_option,
    load_headers,
    micros_row,
    sql_filters,
    table_name,
)
from duetime.backends.sqlfiles import load_queries
from duetime.clock import from_micros, to_micros
from duetime.errors import (
    ConfigurationError,
    InvalidMessage,
    connection_failed,
    no_answer,
)
from duetime.inputs.identifiers import check_name, mariadb_name
from duetime.inputs.urls import number_option, redact, url_options
from duetime.interfaces import ListQuery, NextDue, StoreCounts
from duetime.message import DelayedMessage, dump_headers
from duetime.recurring.schedule import ScheduleRow
from duetime.settings import TransactionMode
from duetime.store_row import STORE_COLUMNS

log = logging.getLogger("duetime.mysql")
QUERIES = load_queries("duetime.backends.mysql")
EXACT_COUNT_LIMIT = 1_000_000
_COLUMNS = ", ".join(STORE_COLUMNS)
_OPTIONS = {"table", "claim_timeout", "poll_interval", "connect_timeout"}


@dataclass(frozen=True, slots=True)
class MysqlOptions:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    table: str | None = None
    claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT
    poll_interval: float = 0.25
    connect_timeout: float = 5.0
    display: str = ""

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> MysqlOptions:
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
        _, options = url_options(url, _OPTIONS, "MariaDB/MySQL")
        poll = number_option(options, "poll_interval", 0.25)
        connect = number_option(options, "connect_timeout", 5.0)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=database,
            table=None if "table" not in options else check_name("table", options["table"]),
            claim_timeout=claim_timeout_option(options, claim_timeout),
            poll_interval=poll,
            connect_timeout=connect,
            display=redact(url),
        )


T = TypeVar("T")


def _micros(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def table_identifier(name: str) -> str:
    """A table's name as MariaDB takes it: backquoted, and within its 64 characters (a long one
    cut, with a hash of the whole to keep it apart): the store and its bulk writes alike."""
    return "`" + mariadb_name(name).replace("`", "``") + "`"


def _message(row: Sequence[Any]) -> DelayedMessage:
    return DelayedMessage.from_store(
        row[0], row[1], from_micros(row[2]), bytes(row[4]), load_headers(row[3]), row[5], row[6]
    )


def mysql_connect(o: MysqlOptions, *, autocommit: bool) -> pymysql.connections.Connection[Any]:
    """A connection as duetime uses them: utf8mb4, READ COMMITTED (so SKIP LOCKED claims see
    each other's commits at once). A server that cannot be reached is one line."""
    try:
        conn = pymysql.connect(
            host=o.host,
            port=o.port,
            user=o.user,
            password=o.password,
            database=o.database,
            charset="utf8mb4",
            autocommit=autocommit,
            connect_timeout=int(o.connect_timeout),
            # connect_timeout bounds the TCP connect only: a server that accepts and never greets
            # (another kind of server on that port) kept the handshake waiting for ever
            read_timeout=o.connect_timeout,
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            # PyMySQL's own cap is 16 MiB whatever the server allows: the server's rules
            max_allowed_packet=1 << 30,
        )
    except pymysql.err.OperationalError as error:
        if "timed out" in str(error):  # pymysql: "Lost connection to MySQL server ... (timed out)"
            raise connection_failed(
                o.display, no_answer(f"{o.host}:{o.port}", o.connect_timeout, "MariaDB or MySQL")
            ) from None
        raise connection_failed(o.display, error.args[-1] if error.args else error) from None
    conn._read_timeout = None  # type: ignore[attr-defined]  # queries take as long as they take; no setter
    keep_alive(conn._sock)  # type: ignore[attr-defined]  # PyMySQL has no option for it: its socket
    return conn


#: Bytes of an INSERT besides a message's body and headers (its statement, id, destination, group).
PACKET_SLACK = 4096
_ESCAPED = b"\x00\n\r\x1a'\"\\"


def _escaped_size(body: bytes) -> int:
    """A body's size as PyMySQL sends it: each of the seven bytes it escapes takes two."""
    return len(body) + sum(body.count(bytes([c])) for c in _ESCAPED)


def _earliest(cur: Any, q: Mapping[str, str]) -> datetime | None:
    """The earliest unclaimed due time or claim's end, asked on ``cur``."""
    cur.execute(q["next_times"])
    row = cur.fetchone()
    times = [t for t in (row or ()) if t is not None]
    return from_micros(min(times)) if times else None


class SyncMysqlStore(StoreRules):
    """Blocking MariaDB/MySQL store; one connection behind a lock, re-opened after it breaks."""

    def __init__(self, options: MysqlOptions) -> None:
        super().__init__(claim_timeout=options.claim_timeout)
        self.options = options
        self._lock = threading.RLock()
        self._conn: pymysql.connections.Connection[Any] | None = None
        # what an operator reads (counts, pages, a group's size) goes through a connection of its
        # own, so a count of a million rows never holds the dispatcher's (it made deliveries
        # seconds late)
        self._read_lock = threading.Lock()
        self._reader: pymysql.connections.Connection[Any] | None = None
        self._table: str | None = None
        self._max_packet: int | None = None

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SyncMysqlStore:
        return cls(MysqlOptions.from_url(url, claim_timeout=claim_timeout))

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None:
            o = self.options
            self._conn = mysql_connect(o, autocommit=True)
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

    def _read(self, work: Callable[[Any], Any]) -> Any:
        """``work(cursor)`` on the operator's connection (opened on first use, dropped if it breaks)."""
        with self._read_lock:
            if self._reader is None:
                self._reader = mysql_connect(self.options, autocommit=True)
            try:
                with self._reader.cursor() as cur:
                    return work(cur)
            except (OperationalError, InterfaceError):
                with contextlib.suppress(Exception):
                    self._reader.close()
                self._reader = None
                raise

    def _read_all(self, sql: str, params: Any = ()) -> list[Any]:
        def work(cur: Any) -> list[Any]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        return list(self._read(work))

    def _execute(self, sql: str, params: Any = (), *, transaction: bool = False) -> int:
        return int(self._run(lambda cur: cur.execute(sql, params), transaction))

    def _fetch(self, sql: str, params: Any = ()) -> list[Any]:
        def work(cur: Any) -> list[Any]:
            cur.execute(sql, params)
            return list(cur.fetchall())

        return list(self._run(work))

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # it is broken already
                self._conn.close()
            self._conn = None

    def _queries(self, table: str, collation: str) -> dict[str, str]:
        return {
            name: sql.format(table=table_identifier(table), collation=collation, held=HOLD_TOKEN_SQL)
            for name, sql in QUERIES.items()
        }

    def table_for(self, endpoint: str) -> str:
        return table_name(endpoint, self.options.table)

    # --- primitives -----------------------------------------------------------------------
    def _location(self, endpoint: str) -> str:
        return f"table {self.table_for(endpoint)!r} in {self.options.display}"

    def _create(self, endpoint: str) -> None:
        table = self.table_for(endpoint)
        kept = mariadb_name(table)  # the catalogue's name for it

        def work(cur: Any) -> None:
            cur.execute("SELECT VERSION()")
            collation = "utf8mb4_nopad_bin" if "mariadb" in cur.fetchone()[0].lower() else "utf8mb4_0900_bin"
            q = self._queries(table, collation)
            cur.execute(q["setup_lock"])
            try:
                cur.execute(q["create_schema_table"])
                cur.execute(q["create_store_table"])
                cur.execute(q["table_columns"], (kept,))
                check_store_columns(table, self.options.display, (str(r[0]) for r in cur.fetchall()))
                for missing, change in (
                    ("has_group_column", "add_group_column"),  # a table of schema version 1
                    ("has_group_key", "add_group_key"),
                    ("has_failing_key", "add_failing_key"),
                ):
                    cur.execute(q[missing], (kept,))
                    if not cur.fetchone()[0]:
                        self._change_in_use(cur, q, change, table)
                cur.execute(q["create_presence_table"])
                cur.execute(q["create_api_key_table"])
                cur.execute(q["create_record_table"])
                cur.execute(q["create_schedule_table"])
                cur.execute(q["record_version"], (f"store:{table}", SCHEMA_VERSION))
            finally:
                cur.execute(q["setup_unlock"])

        self._run(work)

    def _change_in_use(self, cur: Any, q: Mapping[str, str], change: str, table: str) -> None:
        """Run the set-up's ``ALTER TABLE`` ``change`` on a table that may be in use without
        stopping its writers: InnoDB makes the change online, but takes the table's lock for a
        moment at its start and end, and while it waits for that lock every writer waits behind
        it. So each try waits a second at most (:func:`change_in_use`)."""
        log.info("changing table %s: %s; writes to it go on meanwhile", table, change.replace("_", " "))
        cur.execute(q["brief_lock_waits"])
        try:
            change_in_use(
                lambda: cur.execute(q[change]),
                lambda error: isinstance(error, OperationalError) and error.args[0] == LOCK_WAIT_TIMEOUT,
                table,
                self.options.display,
                "a second",
            )
        finally:
            cur.execute(q["usual_lock_waits"])

    def _schema_version(self, endpoint: str) -> int | None:
        try:
            rows = self._fetch(QUERIES["read_version"], (f"store:{self.table_for(endpoint)}",))
        except ProgrammingError:
            return None
        return int(rows[0][0]) if rows else None

    def _bind(self, endpoint: str) -> None:
        self._table = self.table_for(endpoint)
        self._q = self._queries(self._table, "")

    def _packet_limit(self) -> int:
        """The server's ``max_allowed_packet`` (bytes), read once per store."""
        if self._max_packet is None:
            self._max_packet = int(self._fetch("SELECT @@max_allowed_packet")[0][0])
        return self._max_packet

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        rows = [micros_row(m) for m in messages]
        self._check_packets(messages, rows)
        q = self.q
        try:
            self._run(lambda cur: cur.executemany(q["insert"], rows), transaction=True)
        except IntegrityError as error:
            detail = str(error)
            raise Duplicate(
                next((m.message_id for m in messages if f"'{m.message_id}'" in detail), None)
            ) from None

    def _check_packets(self, messages: Sequence[DelayedMessage], rows: Sequence[tuple[Any, ...]]) -> None:
        """InvalidMessage for a message the server's max_allowed_packet would refuse."""
        limit = self._packet_limit()
        for m, row in zip(messages, rows, strict=True):
            if (len(m.body) + len(row[3]) * 2) * 2 > limit // 2:  # near the limit: measure it
                # the server holds a value twice while it reads it: measured, a body of half the
                # limit is refused with "Got a packet bigger than 'max_allowed_packet' bytes"
                size = 2 * (_escaped_size(m.body) + len(row[3].encode()) * 2) + PACKET_SLACK
                if size > limit:
                    raise InvalidMessage(
                        f"message {m.message_id} needs about {size:,} bytes of this MariaDB/MySQL "
                        f"server's max_allowed_packet of {limit:,} (a value counts twice): raise it "
                        "(SET GLOBAL max_allowed_packet, and in the server's configuration) or send "
                        "a smaller body."
                    )

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        return self._claimed(at, until, limit, ask_next=False)[0]

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        """A short batch's transaction also asks the next due time, once its rows are marked
        claimed (one round trip more before the commit, where asking apart took a call of its own)."""
        return self._claimed(at, until, limit, ask_next=True)

    def _claimed(
        self, at: datetime, until: datetime, limit: int, *, ask_next: bool
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        now, token, q = to_micros(at), uuid.uuid4().hex, self.q

        def work(cur: Any) -> tuple[list[Any], NextDue | None]:
            cur.execute(q["select_due_for_claim"], (now, now, limit))
            rows = list(cur.fetchall())
            if rows:
                cur.execute(q["mark_claimed"], (token, to_micros(until), tuple(r[0] for r in rows)))
            return rows, (NextDue(_earliest(cur, q)) if ask_next and len(rows) < limit else None)

        rows, next_due = self._run(work, transaction=True)
        return [_message(r) for r in rows], next_due

    def _server_time(self) -> datetime | None:
        def work(cur: Any) -> Any:
            cur.execute(self.q["server_time"])
            return cur.fetchone()[0]

        return self._run(work).replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def _next_due(self) -> datetime | None:
        return self._run(lambda cur: _earliest(cur, self.q))  # type: ignore[no-any-return]

    def _delete(self, message_ids: Sequence[str]) -> int:
        return self._execute(self.q["delete_many"], (tuple(message_ids),))

    def _fail(self, message_id: str) -> bool:
        return self._execute(self.q["increment_failure"], (message_id,)) == 1

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        return self._execute(self.q["increment_failure_until"], (to_micros(due_at), message_id)) == 1

    def _release(self, message_ids: Sequence[str]) -> int:
        return self._execute(self.q["release"], (tuple(message_ids),)) if message_ids else 0

    def _get(self, message_id: str) -> DelayedMessage | None:
        rows = self._fetch(self.q["get"], (message_id,))
        return _message(rows[0]) if rows else None

    def _stored_ids(self, message_ids: Sequence[str]) -> set[str]:
        return (
            {r[0] for r in self._fetch(self.q["stored_ids"], (tuple(message_ids),))} if message_ids else set()
        )

    # --- recurring schedules ------------------------------------------------------------------
    def _schedule_insert(self, row: ScheduleRow) -> bool:
        params = (self._ready(), row.schedule_id, row.text, _micros(row.planned_until))
        # ON DUPLICATE KEY ... counts 0 rows for a row that is there (CLIENT.FOUND_ROWS is off)
        return self._schedules(lambda: self._execute(self.q["schedule_insert"], params)) == 1

    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        q, endpoint = self.q, self._ready()

        def work(cur: Any) -> list[bool]:
            written = []
            new: list[DelayedMessage] = []
            for row, ticks in changes:
                params = (row.text, _micros(row.planned_until), endpoint, row.schedule_id, row.version)
                done = cur.execute(q["schedule_update"], params) == 1
                if done:
                    new += ticks
                written.append(done)
            if new:
                cur.executemany(q["insert_new"], [micros_row(t) for t in new])
            return written

        return list(self._schedules(lambda: self._run(work, transaction=True)))

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        rows = self._schedule_rows("schedule_get", (self._ready(), schedule_id))
        return rows[0] if rows else None

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedule_page", (self._ready(), after, limit))

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        return self._schedule_rows("schedules_to_plan", (self._ready(), to_micros(until), limit))

    def _schedule_delete(self, schedule_id: str) -> bool:
        params = (self._ready(), schedule_id)
        return self._schedules(lambda: self._execute(self.q["schedule_delete"], params)) == 1

    def _schedule_rows(self, name: str, params: tuple[Any, ...]) -> list[ScheduleRow]:
        rows = self._schedules(lambda: self._fetch(self.q[name], params))
        return [ScheduleRow(r[0], r[1], None if r[2] is None else from_micros(r[2]), int(r[3])) for r in rows]

    def _schedules(self, work: Callable[[], T]) -> T:
        """A store set up before schedules existed has no table for them: `duetime setup` adds it."""
        try:
            return work()
        except ProgrammingError as error:
            if "duetime_schedules" in str(error):
                raise schedules_need_setup() from None
            raise

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        return self._execute(self.q["delete_unclaimed"], (message_id, to_micros(now))) == 1

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        return self._execute(self.q["delete_group_unclaimed"], (group, to_micros(now), limit or 2**62))

    def _count_group(self, group: str) -> int:
        return int(self._read_all(self.q["count_group"], (group,))[0][0])

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        lock = ("lock_unclaimed", (message_id, to_micros(now)))
        return self._change_unclaimed(lock, "reschedule", (to_micros(due_at), message_id))

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        row = micros_row(message)
        self._check_packets([message], [row])
        message_id, *content = row
        return self._change_unclaimed(("lock_unheld", (message_id,)), "replace", (*content, message_id))

    def _change_unclaimed(
        self, lock: tuple[str, tuple[Any, ...]], change: str, params: tuple[Any, ...]
    ) -> bool:
        """Run the named ``change`` of a message once the ``lock`` query (its name and parameters)
        has locked its row, if the row is there and free to change."""
        q = self.q

        def work(cur: Any) -> bool:
            if not cur.execute(q[lock[0]], lock[1]):
                return False
            cur.execute(q[change], params)
            return True

        return bool(self._run(work, transaction=True))

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        self._execute(QUERIES["beat"], (endpoint, dispatcher_id, to_micros(seen_at), info))

    def _presences(self, endpoint: str) -> list[str]:
        return [r[0] for r in self._fetch(QUERIES["presences"], (endpoint,))]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        self._execute(QUERIES["forget"], (endpoint, to_micros(seen_before)))

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        return self._execute(QUERIES["key_insert"], (endpoint, name, info)) == 1

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        return self._execute(QUERIES["key_update"], (info, endpoint, name)) == 1

    def _key_records(self, endpoint: str) -> list[str]:
        return [r[0] for r in self._fetch(QUERIES["key_records"], (endpoint,))]

    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        return self._execute(QUERIES["record_insert"], (endpoint, kind, name, info)) == 1

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        # MariaDB counts a row changed to what it held as untouched: look for it then.
        changed = self._execute(QUERIES["record_update"], (info, endpoint, kind, name)) == 1
        return changed or info in self._records(endpoint, kind)

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        return self._execute(QUERIES["record_delete"], (endpoint, kind, name)) == 1

    def _records(self, endpoint: str, kind: str) -> list[str]:
        return [r[0] for r in self._fetch(QUERIES["records"], (endpoint, kind))]

    def _audit_range(
        self, endpoint: str, above: str, below: str, limit: int, oldest_first: bool
    ) -> list[str]:
        sql = QUERIES["audit_oldest" if oldest_first else "audit_newest"]
        return [r[0] for r in self._fetch(sql, (endpoint, above, below, limit))]

    def _audit_prune(self, endpoint: str, below: str) -> int:
        return self._execute(QUERIES["audit_prune"], (endpoint, below))

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        if old is None:
            done = self._execute(QUERIES["record_insert"], (endpoint, kind, name, new)) == 1
        else:
            done = self._execute(QUERIES["record_swap"], (new, endpoint, kind, name, old)) == 1
        if done:
            return True, None
        rows = self._fetch(QUERIES["record_get"], (endpoint, kind, name))
        return False, rows[0][0] if rows else None

    def _hold(self, until: Mapping[str, datetime]) -> int:
        rows = [(to_micros(t), i) for i, t in until.items()]
        return int(self._run(lambda cur: cur.executemany(self.q["hold"], rows), transaction=True))

    def _release_held(self) -> int:
        return self._execute(self.q["release_held"])

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        q = self.q
        wanted = {old.message_id: (old, new) for old, new in pairs}

        def work(cur: Any) -> int:
            cur.execute(q["reseal_look"], (tuple(wanted),))
            changes = [
                (dump_headers(new.headers), new.body, i)
                for i, headers, body in cur.fetchall()
                for old, new in (wanted[i],)
                if (load_headers(headers), bytes(body)) == (dict(old.headers), old.body)
            ]
            if changes:
                cur.executemany(q["reseal"], changes)
            return len(changes)

        return int(self._run(work, transaction=True)) if wanted else 0

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        where, params = sql_filters(query, "%({})s", to_micros)
        table = table_identifier(self._table or "")
        sql = f"SELECT {_COLUMNS} FROM {table} WHERE {where} ORDER BY due_at, message_id LIMIT %(limit)s"
        return [_message(r) for r in self._read_all(sql, params | {"limit": limit})]

    def _count_due(self, at: datetime) -> int:
        return int(self._fetch(self.q["count_due"], (to_micros(at),))[0][0])

    def _count_destinations(self) -> int:
        return int(self._read_all(self.q["count_destinations"])[0][0])

    def _count(self, at: datetime) -> StoreCounts:
        now, q = to_micros(at), self.q

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
            total = estimate if large else one(cur, "count_total")
            return StoreCounts(
                total=total,
                due=one(cur, "count_due", (now,)),
                claimed=one(cur, "count_claimed", (now,)),
                held=one(cur, "count_held", (now,)),
                failing=one(cur, "count_failing"),
                next_due=None,
                by_destination=by_destination,
                # MariaDB keeps no sample of a column's values: past the limit, the messages
                # are said to be for destinations not counted
                more_messages=total if large else 0,
                estimated=large,
            )

        counts: StoreCounts = self._read(work)
        return counts

    def _close(self) -> None:
        with self._lock:
            self._drop()
        with self._read_lock:
            if self._reader is not None:
                with contextlib.suppress(Exception):
                    self._reader.close()
                self._reader = None


class MysqlStore(AsyncStoreBridge):
    """The async MariaDB/MySQL store: the sync store on its own thread, plus a next-due poller
    standing in for LISTEN/NOTIFY (see the module docstring)."""

    sync: SyncMysqlStore

    def __init__(self, sync: SyncMysqlStore) -> None:
        super().__init__(sync, name="mysql-store", watch=self._poll_next_due, reads_apart=True)
        self._poller = SyncMysqlStore(sync.options)

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> MysqlStore:
        return cls(SyncMysqlStore.from_url(url, claim_timeout=claim_timeout))

    async def _poll_next_due(self, subscribers: Subscribers) -> None:
        if self.sync.endpoint is None:
            return
        await asyncio.to_thread(self._poller.initialize, self.sync.endpoint, TransactionMode.AT_LEAST_ONCE)
        await poll_next_due(self._poller.next_due, self.sync.options.poll_interval, subscribers)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self._poller.close)
