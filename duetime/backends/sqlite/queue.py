"""A durable local queue in a SQLite file: the transport duetime delivers into, and its consumer.

Receiving hides a message for ``visibility_timeout`` seconds; acknowledging deletes it. A consumer
that dies before acknowledging gets nothing lost: the message becomes visible again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from duetime.backends._on_a_thread import AsyncQueueBridge
from duetime.backends.queue_rows import ACKNOWLEDGE_WITHIN, received
from duetime.backends.sqlite.connection import (
    QUERIES,
    connect,
    dump_headers,
    parse_sqlite_url,
    write_transaction,
)
from duetime.backends.sqlite.filewatch import FileWatch, Looks
from duetime.backends.sqlite.filewatch import watch as watch_file
from duetime.clock import SYSTEM, to_micros
from duetime.errors import DestinationNotFound
from duetime.inputs.identifiers import check_name
from duetime.interfaces import Closing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers

QUEUE_SCHEMA = (
    "create_queues_table",
    "create_queue_messages_table",
    "create_queue_messages_index",
    "create_queue_messages_waiting_index",
)


def create_queue_schema(conn: sqlite3.Connection) -> None:
    for name in QUEUE_SCHEMA:
        conn.execute(QUERIES[name])


def enqueue(
    conn: sqlite3.Connection, queue: str, message: DelayedMessage, headers: Mapping[str, str], now: int
) -> None:
    """Insert into ``queue`` inside the caller's transaction."""
    conn.execute(
        QUERIES["enqueue"],
        (queue, message.message_id, dump_headers(headers), message.body, now, now),
    )


def queue_exists(conn: sqlite3.Connection, queue: str) -> bool:
    return conn.execute(QUERIES["queue_exists"], (queue,)).fetchone() is not None


def _received(row: tuple[Any, ...], token: str) -> ReceivedMessage:
    seq, queue, message_id, headers, body, deliveries = row
    return received(queue, message_id, headers, body, f"{seq}:{token}", deliveries)


class SyncSqliteQueue(Closing):
    """Blocking queue API: declare, send, receive, acknowledge, peek. Thread-safe."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "full",
        visibility_timeout: timedelta = timedelta(seconds=30),
        poll_interval: float = 0.005,
    ) -> None:
        self.path = Path(path)
        self.visibility_timeout = visibility_timeout
        self.poll_interval = poll_interval
        self._conn = connect(self.path, synchronous)
        self._lock = threading.RLock()
        #: The file's write events, opened by the first receive that waits (False: not yet).
        self._file_watch: FileWatch | Literal[False] | None = False
        with self._lock, write_transaction(self._conn):
            create_queue_schema(self._conn)

    @classmethod
    def from_url(cls, url: str) -> SyncSqliteQueue:
        path, options = parse_sqlite_url(url)
        return cls(path, synchronous=options.get("synchronous", "full"))

    def declare(self, queue: str) -> None:
        with self._lock, write_transaction(self._conn):
            self._conn.execute(QUERIES["declare_queue"], (check_name("queue", queue), _now()))

    def queues(self) -> dict[str, int]:
        """Declared queues and how many messages each holds."""
        with self._lock:
            return dict(self._conn.execute(QUERIES["list_queues"]).fetchall())

    def send(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        """Enqueue a batch in one transaction; an undeclared destination fails only its message."""
        results: list[Exception | None] = []
        now = _now()
        with self._lock, write_transaction(self._conn):
            known: dict[str, bool] = {}
            rows: list[tuple[Any, ...]] = []
            for message in messages:
                if message.destination not in known:
                    known[message.destination] = queue_exists(self._conn, message.destination)
                if not known[message.destination]:
                    results.append(DestinationNotFound(f"Queue {message.destination!r} does not exist."))
                    continue
                headers = dump_headers(outgoing_headers(message))
                rows.append((message.destination, message.message_id, headers, message.body, now, now))
                results.append(None)
            self._conn.executemany(QUERIES["enqueue"], rows)
        return results

    def _try_receive(
        self, queue: str, max_messages: int, done: Sequence[ReceivedMessage], alone: bool
    ) -> tuple[list[ReceivedMessage], Sequence[ReceivedMessage], float | None]:
        """Take what is ready, acknowledging ``done`` in the same transaction (a durable one: see
        :meth:`acknowledge`); with nothing ready, ``done`` is acknowledged only if ``alone``.
        What was taken, what of ``done`` is still to acknowledge, and, when nothing was ready,
        in how many seconds the queue's first message becomes visible (None: it holds none)."""
        token = uuid.uuid4().hex
        now = _now()
        until = now + int(self.visibility_timeout.total_seconds() * 1_000_000)
        with self._lock:
            first = self._conn.execute(QUERIES["first_visible"], {"queue": queue}).fetchone()[0]
            if first is None or first > now:
                visible_in = None if first is None else (first - now) / 1_000_000
                if done and alone:
                    self._acknowledge_locked(done)
                    return [], (), visible_in
                return [], done, visible_in
            # a receipt alone need not wait for the disk (see write_transaction); an acknowledgement does
            with write_transaction(self._conn, durable=bool(done)):
                for message in done:
                    self._acknowledge_one(message)
                rows = self._conn.execute(
                    QUERIES["receive"],
                    {"until": until, "token": token, "queue": queue, "now": now, "limit": max_messages},
                ).fetchall()
        rows.sort(key=lambda r: r[0])
        return [_received(r, token) for r in rows], (), None

    def receive(
        self,
        queue: str,
        max_messages: int = 100,
        wait: float = 0.0,
        done: Sequence[ReceivedMessage] = (),
    ) -> list[ReceivedMessage]:
        """Take up to ``max_messages``, waiting up to ``wait`` seconds for the first to arrive:
        asleep until another process writes the file (:mod:`.filewatch`), polling where that
        cannot be had, or until the queue's first message becomes visible (one a dispatcher
        moved ahead of its due time). ``done`` is acknowledged in the transaction of the look
        that takes the next messages, or alone once :data:`ACKNOWLEDGE_WITHIN` passes without one
        (or the wait ends): one transaction a message instead of two."""
        now = SYSTEM.monotonic()
        deadline = now + wait
        acknowledge_by = min(now + ACKNOWLEDGE_WITHIN, deadline)
        watch = self._watch() if wait > 0 else None  # before the version is read: no write slips by
        while True:
            with self._lock:
                version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            alone = SYSTEM.monotonic() >= acknowledge_by
            taken, done, visible_in = self._try_receive(queue, max_messages, done, alone)
            if taken or (not done and SYSTEM.monotonic() >= deadline):
                return taken
            if visible_in is not None:  # look again when it shows, if that is before the deadline
                deadline_or_visible = min(deadline, SYSTEM.monotonic() + visible_in)
            else:
                deadline_or_visible = deadline
            looks = Looks()
            while (left := deadline_or_visible - SYSTEM.monotonic()) > 0:  # for another connection's write
                if done and (left := min(left, acknowledge_by - SYSTEM.monotonic())) <= 0:
                    break  # time to acknowledge them alone
                if (written := None if watch is None else watch.try_wait(min(left, looks.timeout()))) is None:
                    time.sleep(min(left, self.poll_interval))  # no watch, or another thread is on it
                else:
                    looks.after(written)
                with self._lock:
                    if self._conn.execute("PRAGMA data_version").fetchone()[0] != version:
                        break

    def _watch(self) -> FileWatch | None:
        with self._lock:
            if self._file_watch is False:
                self._file_watch = watch_file(self.path)
            return self._file_watch or None

    def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Receive these particular messages (an operator sending errors back)."""
        token = uuid.uuid4().hex
        now = _now()
        until = now + int(self.visibility_timeout.total_seconds() * 1_000_000)
        params = {"until": until, "token": token, "queue": queue, "now": now}
        with self._lock, write_transaction(self._conn):
            rows = self._conn.execute(
                QUERIES["receive_by_id"], params | {"message_ids": json.dumps(list(message_ids))}
            ).fetchall()
        return [_received(row, token) for row in sorted(rows, key=lambda r: r[0])]

    def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        with self._lock:
            return self._acknowledge_locked(messages)

    def _acknowledge_locked(self, messages: Sequence[ReceivedMessage]) -> int:
        with write_transaction(self._conn):
            return sum(self._acknowledge_one(m) for m in messages)

    def _acknowledge_one(self, message: ReceivedMessage) -> int:
        """Remove one received message in the open transaction; 1 if its receipt still held."""
        seq, _, token = message.receipt.partition(":")
        return int(self._conn.execute(QUERIES["acknowledge"], (int(seq), token)).rowcount)

    def peek(self, queue: str, limit: int = 100) -> list[ReceivedMessage]:
        with self._lock:
            rows = self._conn.execute(QUERIES["peek"], (queue, limit)).fetchall()
        return [_received(r, "peek") for r in rows]

    def depth(self, queue: str) -> int:
        with self._lock:
            return int(self._conn.execute(QUERIES["depth"], (queue,)).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._file_watch:
                self._file_watch.close()
            self._file_watch = None
            self._conn.close()


class SqliteQueueTransport(AsyncQueueBridge):
    """The async transport over :class:`SyncSqliteQueue`, run on its own thread."""

    def __init__(self, path: str | Path, *, synchronous: str = "full") -> None:
        self.path = Path(path)
        super().__init__(lambda: SyncSqliteQueue(self.path, synchronous=synchronous), name="sqlite-queue")

    @classmethod
    def from_url(cls, url: str) -> SqliteQueueTransport:
        path, options = parse_sqlite_url(url)
        return cls(path, synchronous=options.get("synchronous", "full"))


def _now() -> int:
    return to_micros(SYSTEM.now())
