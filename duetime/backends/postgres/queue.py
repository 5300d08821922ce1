"""A durable queue table in PostgreSQL: the transport duetime delivers into, and its consumer.

Receiving claims rows with ``FOR UPDATE SKIP LOCKED`` and hides them for the visibility timeout;
acknowledging deletes them. With the store in the same database and schema, the dispatcher moves
each message from store to queue in one transaction (exactly-once).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from duetime.backends._on_a_thread import AsyncQueueBridge
from duetime.backends._readable import wait_readable
from duetime.backends.postgres.connection import (
    QUEUE_TABLES,
    PgNames,
    PgOptions,
    all_there,
    dump_headers,
    enqueue_declared,
    pooled,
    reach,
)
from duetime.backends.queue_rows import ACKNOWLEDGE_WITHIN, received
from duetime.clock import SYSTEM
from duetime.errors import ConnectionFailed, DestinationNotFound, TransportUnavailable
from duetime.inputs.identifiers import check_name
from duetime.interfaces import Closing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers

log = logging.getLogger("duetime.queue")


def queue_schema_statements(q: dict[str, str]) -> list[str]:
    return [
        q["create_queues_table"],
        q["create_messages_table"],
        q["create_messages_index"],
        q["create_messages_waiting_index"],
    ]


def queue_setup(names: PgNames) -> list[tuple[str, dict[str, Any]]]:
    """The queue tables on their own (a consumer may start before any store), under the same
    advisory lock as the store's set-up."""
    return [
        (names.q["advisory_lock"], {"key": names.setup_lock}),
        (f"CREATE SCHEMA IF NOT EXISTS {names.quoted_schema}", {}),
        *[(sql, {}) for sql in queue_schema_statements(names.q)],
    ]


def _in_index_order(conn: psycopg.Connection[Any]) -> None:
    """Every question this queue asks is answered in the order of an index, so its connections
    tell the planner never to sort.

    The planner's statistics lag behind a queue table: rows come and go by the thousand between
    two autovacuum runs, and a queue name it has not seen yet gets a guessed share of 0.5 %. With
    too few rows expected, ``receive`` read every waiting row of the queue and sorted them to
    return the oldest 500 — measured 4 ms at 5,000 waiting and 54 ms at 50,000 (an external sort
    on disk) instead of 0.6 and 1 ms down the ready index, and so a drain slower with every row
    waiting. Sorting is the only way to be wrong here, so it is ruled out.
    """
    conn.execute("SET enable_sort = off")


def _asked(conn: psycopg.Connection[Any], options: PgOptions, sql: str, params: dict[str, Any]) -> list[Any]:
    """The rows of one of a queue's questions, answered in index order: by the connection's own
    setting (:func:`_in_index_order`), or where a pooler in transaction mode shares the server
    connection with other clients (a session setting would reach them) by one said for this
    question alone. Both go in one message of the simple protocol, which the server runs as one
    transaction (the setting ends with it) and a pooler passes on whole (psycopg's pipeline would
    not do: see :func:`~duetime.backends.postgres.connection.one_round_trip`)."""
    if not options.session_free:
        return conn.execute(sql, params).fetchall()
    with psycopg.ClientCursor(conn) as cursor:
        cursor.execute(f"SET LOCAL enable_sort = off; {sql}", params)
        cursor.nextset()
        return cursor.fetchall()


def _received(row: Sequence[Any], token: uuid.UUID) -> ReceivedMessage:
    seq, queue, message_id, headers, body, deliveries = row
    return received(queue, message_id, headers, body, f"{seq}:{token}", deliveries)


def _receipt(message: ReceivedMessage) -> tuple[int, uuid.UUID]:
    seq, _, token = message.receipt.partition(":")
    return int(seq), uuid.UUID(token)


def _acknowledging(messages: Sequence[ReceivedMessage]) -> dict[str, list[Any]]:
    """The parameters that acknowledge ``messages`` (none: empty arrays)."""
    receipts = [_receipt(m) for m in messages]
    return {"seqs": [s for s, _ in receipts], "receipts": [r for _, r in receipts]}


def _split(
    messages: Sequence[DelayedMessage], known: set[str]
) -> tuple[list[tuple[Any, ...]], list[Exception | None]]:
    rows: list[tuple[Any, ...]] = []
    results: list[Exception | None] = []
    for m in messages:
        if m.destination in known:
            rows.append((m.destination, m.message_id, dump_headers(outgoing_headers(m)), m.body))
            results.append(None)
        else:
            results.append(_not_found(m))
    return rows, results


def _not_found(message: DelayedMessage) -> DestinationNotFound:
    return DestinationNotFound(f"Queue {message.destination!r} does not exist.")


class SyncPostgresQueue(Closing):
    """Blocking queue API for consumers: declare, send, receive, acknowledge, peek."""

    def __init__(
        self,
        options: PgOptions,
        *,
        visibility_timeout: timedelta = timedelta(seconds=30),
        poll_interval: float = 0.02,
        recheck: float = 1.0,
    ) -> None:
        self.options = options
        self.names = PgNames(options.schema, QUEUE_TABLES)
        self.visibility_timeout = visibility_timeout
        #: How often a receiver looks when it cannot wait on the queue channel.
        self.poll_interval = poll_interval
        #: How often a receiver asleep on the channel looks anyway (visibility timeouts end
        #: without a NOTIFY).
        self.recheck = recheck
        reach(options)
        self.pool = ConnectionPool(
            options.conninfo,
            min_size=1,
            max_size=2,
            open=True,
            kwargs={"autocommit": True, **options.connect_kwargs},
            timeout=options.pool_timeout,
            configure=None if options.session_free else _in_index_order,
        )
        with pooled(self.pool, self.options) as conn:
            if not all_there(conn, self.names.queue_relations):  # else no DDL: see all_there
                with conn.transaction():
                    for sql, params in queue_setup(self.names):
                        conn.execute(sql, params)
        self._listener = _Listener(options.listen_conninfo, self.names.queue_channel)
        #: Queues found empty of what could be taken, by name (see :meth:`receive`).
        self._quiet: dict[str, _Quiet] = {}
        if options.listen_conninfo is None:  # nothing to wait on: look every `poll` seconds
            self.poll_interval = max(poll_interval, options.poll)

    @classmethod
    def from_url(cls, url: str) -> SyncPostgresQueue:
        return cls(PgOptions.from_url(url))

    def _receive_params(self, queue: str, limit: int, done: Sequence[ReceivedMessage] = ()) -> dict[str, Any]:
        """A receive's parameters; ``done`` is what it acknowledges first."""
        lease = {"visibility": self.visibility_timeout, "token": uuid.uuid4(), "queue": queue, "limit": limit}
        return lease | _acknowledging(done)

    def declare(self, queue: str) -> None:
        with pooled(self.pool, self.options) as conn:
            conn.execute(self.names.q["declare_queue"], {"name": check_name("queue", queue)})

    def queues(self) -> dict[str, int]:
        with pooled(self.pool, self.options) as conn:
            return {r[0]: r[1] for r in conn.execute(self.names.q["list_queues"]).fetchall()}

    def send(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        """One statement, one round trip: insert what has a declared queue, report the rest."""
        if len({m.message_id for m in messages}) == len(messages):
            entries = [
                (m.destination, m.message_id, dump_headers(outgoing_headers(m)), m.body) for m in messages
            ]
            with pooled(self.pool, self.options) as conn:
                sent = enqueue_declared(conn, self.names, entries)
            return [None if m.message_id in sent else _not_found(m) for m in messages]
        q = self.names.q
        with pooled(self.pool, self.options) as conn, conn.transaction():
            wanted = list({m.destination for m in messages})
            known = {r[0] for r in conn.execute(q["existing_queues"], {"names": wanted}).fetchall()}
            rows, results = _split(messages, known)
            with conn.cursor() as cur:
                cur.executemany(q["enqueue"], rows)
            conn.execute(
                q["notify_queues"],
                {"channel": self.names.queue_channel, "queues": sorted({r[0] for r in rows})},
            )
        return results

    def receive(
        self,
        queue: str,
        max_messages: int = 100,
        wait: float = 0.0,
        done: Sequence[ReceivedMessage] = (),
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages``, waiting up to ``wait`` seconds for the first: asleep on the
        queue channel's NOTIFY (every enqueue sends one), looking again when the queue's next
        message becomes visible (one moved ahead of its due time, or one whose visibility
        timeout runs out) and at least every ``recheck`` seconds.

        A look that came back with less than it could take found all there was; until the queue
        is woken or ``recheck`` passes, nothing new can be there, so the next receive waits
        without asking (at a few hundred messages a second that question was a third of a
        consumer's statements, each answered "nothing"). ``done`` is acknowledged in the
        statement of the next look, or alone once :data:`ACKNOWLEDGE_WITHIN` passes without one
        (or the wait ends): at a few hundred messages a second, one statement a message."""
        now = SYSTEM.monotonic()
        deadline = now + wait
        acknowledge_by = now + min(wait, ACKNOWLEDGE_WITHIN)
        visible_in: float | None = None
        while True:
            heard = self._listener.heard(queue)
            quiet = self._quiet.get(queue)
            if quiet is None or quiet.heard != heard or SYSTEM.monotonic() >= quiet.until:
                params = self._receive_params(queue, max_messages, done)
                done = ()
                with pooled(self.pool, self.options) as conn:
                    answer = _asked(conn, self.options, self.names.q["receive"], params)
                looked = SYSTEM.monotonic()
                rows = [r[:6] for r in answer if r[0] is not None]
                visible_in = answer[0][6] if answer else None  # a message moved ahead, a receipt's end
                if heard is not None and len(rows) < max_messages:
                    recheck = self.recheck if visible_in is None else min(self.recheck, visible_in)
                    quiet = self._quiet[queue] = _Quiet(heard, looked + recheck)
                else:
                    self._quiet.pop(queue, None)
                    quiet = None
                if rows:
                    return [_received(r, params["token"]) for r in sorted(rows, key=lambda r: r[0])]
            now = SYSTEM.monotonic()
            if done and now >= min(acknowledge_by, deadline):  # no look came in time to carry them
                self.acknowledge(done)
                done = ()
            left = deadline - now
            if left <= 0:
                return []
            if heard is None and self._listener.listen():
                continue  # listening now: look once more, so nothing slips in between
            until = left if quiet is None else min(left, quiet.until - now)
            if done:
                until = min(until, acknowledge_by - now)
            if heard is None or not self._listener.wait_for(queue, heard, max(until, 0.0)):
                poll = self.poll_interval if visible_in is None else min(self.poll_interval, visible_in)
                time.sleep(max(min(left, poll), 0.0))

    def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        """Remove a batch in one statement; a receipt that expired (handed out again) is skipped."""
        if not messages:
            return 0
        with pooled(self.pool, self.options) as conn:
            return conn.execute(self.names.q["acknowledge"], _acknowledging(messages)).rowcount

    def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Receive these particular messages (an operator sending errors back)."""
        params = self._receive_params(queue, 0) | {"message_ids": list(message_ids)}
        with pooled(self.pool, self.options) as conn:
            rows = _asked(conn, self.options, self.names.q["receive_by_id"], params)
        return [_received(r, params["token"]) for r in sorted(rows, key=lambda r: r[0])]

    def peek(self, queue: str, limit: int = 100) -> list[ReceivedMessage]:
        with pooled(self.pool, self.options) as conn:
            rows = _asked(conn, self.options, self.names.q["peek"], {"queue": queue, "limit": limit})
        return [_received(r, uuid.UUID(int=0)) for r in rows]

    def depth(self, queue: str) -> int:
        with pooled(self.pool, self.options) as conn:
            row = conn.execute(self.names.q["depth"], {"queue": queue}).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._listener.close()
        self.pool.close()


@dataclass(frozen=True)
class _Quiet:
    """A queue found empty of what could be taken: as its wake-ups stood before that look, and
    until when that answer holds (visibility timeouts end without a wake-up)."""

    heard: tuple[int, int]
    until: float


class _Listener:
    """One connection LISTENing on the queue channel, shared by this queue's receivers: one waits
    on it at a time, the others poll (``wait_for`` answers False); a lost connection is opened
    again on the next wait, and until then receivers poll.

    Every wake-up read is counted by queue, whoever reads it: a receiver compares counts
    (:meth:`heard`) instead of hoping to be the one reading its own queue's wake-up."""

    def __init__(self, conninfo: str | None, channel: str) -> None:
        self.conninfo, self.channel = conninfo, channel
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        #: Wake-ups read, by queue, since the connection was opened (its generation).
        self._counts: dict[str, int] = {}
        self._generation = 0

    def heard(self, queue: str) -> tuple[int, int] | None:
        """Where ``queue``'s wake-ups stand (equal marks: none read in between); None while not
        listening (wake-ups are missed then)."""
        if self._conn is None:
            return None
        return self._generation, self._counts.get(queue, 0)

    def listen(self) -> bool:
        """Whether this queue is listening now (connected, or connected just now)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.conninfo is None:  # told to poll: nowhere to LISTEN
                return False
            if self._conn is None:
                conn = psycopg.connect(self.conninfo, autocommit=True)
                conn.execute(f"LISTEN {self.channel}")
                self._counts, self._generation = {}, self._generation + 1
                self._conn = conn
            return True
        except psycopg.Error as error:
            log.debug("cannot LISTEN for queue wake-ups (%s); polling", type(error).__name__)
            return False
        finally:
            self._lock.release()

    def wait_for(self, queue: str, since: tuple[int, int], seconds: float) -> bool:
        """Sleep until ``queue`` is woken after ``since`` (a :meth:`heard` mark) or ``seconds``
        pass; False if this receiver cannot wait here (another is waiting, or the connection is
        lost) and must poll."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._conn is None:
                return False
            end = SYSTEM.monotonic() + seconds
            while self.heard(queue) == since and (left := end - SYSTEM.monotonic()) > 0:
                # not psycopg's notifies(timeout=left): its wait spins through a millisecond's
                # remainder, and a receiver waiting for a visible time waits one every time
                wait_readable(self._conn.fileno(), left)
                for note in self._conn.notifies(timeout=0):  # what came, and any heard before
                    self._counts[note.payload] = self._counts.get(note.payload, 0) + 1
            return True
        except psycopg.Error:
            self._drop()
            return False
        finally:
            self._lock.release()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()


class PostgresQueueTransport(AsyncQueueBridge):
    """The async transport into the PostgreSQL queue table: :class:`SyncPostgresQueue` on a thread."""

    def __init__(
        self,
        options: PgOptions,
        *,
        visibility_timeout: timedelta = timedelta(seconds=30),
        poll_interval: float = 0.02,
    ) -> None:
        self.options = options
        super().__init__(
            lambda: SyncPostgresQueue(
                options, visibility_timeout=visibility_timeout, poll_interval=poll_interval
            ),
            name="pg-queue",
        )

    @classmethod
    def from_url(cls, url: str) -> PostgresQueueTransport:
        return cls(PgOptions.from_url(url))

    async def start(self) -> None:
        try:
            await super().start()
        except ConnectionFailed as error:  # for a dispatcher, a queue database that is down is an outage
            raise TransportUnavailable(str(error)) from None
