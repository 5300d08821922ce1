"""The dispatcher's opt-in delivery log: one entry per forwarded or dead-lettered message.

``duetime bulk report`` reads it to chart lateness over time. It is written after each batch was
delivered and removed from the store, by a task and a thread of its own, so it never decides or
delays a delivery: a log that cannot be written, is slow or never answers costs a warning (and,
when it falls far behind, its oldest entries), not a message.
Destinations: JSON Lines files (``jsonl:/var/log/duetime``, one file per UTC day) or a table
``duetime_delivery_log`` in a SQL database (``postgresql://…``, ``mysql://…``, ``sqlite:///…``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from duetime.clock import to_micros
from duetime.errors import ConfigurationError, DuetimeError, server_reason
from duetime.inputs.urls import redact
from duetime.interfaces import HELD_OUTCOME, Delivery, DeliveryLog

log = logging.getLogger("duetime.deliverylog")
#: Seconds ``close`` waits for a write in flight before it leaves the log as it is.
CLOSE_WITHIN = 2.0


class _WriterThread:
    """A daemon thread of its own for a log's blocking writes. A write that never returns (a
    database behind a partition) then holds only this thread: not the event loop's default
    threads, which the stores' calls use, and not the process's exit, which waits for those."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def call(self, work: Callable[..., None], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="duetime-delivery-log", daemon=True)
            self._thread.start()
        self._jobs.put((loop, future, work, args))
        await future

    def stop(self) -> None:
        """End the thread once the jobs given before are done (a log that closed)."""
        if self._thread is not None:
            self._jobs.put(())
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if not job:
                return
            loop, future, work, args = job
            error: BaseException | None = None
            try:
                work(*args)
            except BaseException as failed:
                error = failed
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_settle, future, error)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        future.set_result(None) if error is None else future.set_exception(error)


class JsonLinesDeliveryLog:
    """Appends to ``<folder>/deliveries-YYYY-MM-DD.jsonl`` (UTC day of dispatch)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigurationError(
                f"Cannot keep the delivery log in {self.folder}: it is a file; name a folder (jsonl:/var/log/duetime)."
            ) from None
        except OSError as error:
            raise ConfigurationError(
                f"Cannot keep the delivery log in {self.folder}: {error.strerror or error}; name a folder "
                "duetime can create and write to."
            ) from None
        if not os.access(self.folder, os.W_OK):  # said now, not at the first delivery
            raise ConfigurationError(
                f"Cannot keep the delivery log in {self.folder}: this user may not write there; name a "
                "folder duetime can write to."
            )
        self._lock = threading.Lock()
        self._writer = _WriterThread()

    def write(self, entries: Sequence[Delivery]) -> None:
        by_day: dict[str, list[str]] = {}
        for entry in entries:
            day = entry.dispatched_at.date().isoformat()
            by_day.setdefault(day, []).append(json.dumps(entry.as_json(), ensure_ascii=False))
        with self._lock:
            for day, lines in by_day.items():
                with (self.folder / f"deliveries-{day}.jsonl").open("a", encoding="utf-8") as out:
                    out.write("\n".join(lines) + "\n")

    async def record(self, entries: Sequence[Delivery]) -> None:
        if entries:
            await self._writer.call(self.write, entries)

    async def close(self) -> None:
        self._writer.stop()


class SqlDeliveryLog:
    """Rows in ``duetime_delivery_log`` (times as µs since 1970), through the Python driver."""

    def __init__(self, url: str) -> None:
        from duetime.registry import open_sql_database

        self.db = open_sql_database(url)
        self.url = url
        self._conn: Any = None
        self._lock = threading.Lock()
        self._writer = _WriterThread()

    def reach(self) -> None:
        """Connect and make the table now: a URL that cannot work is said when the dispatcher
        starts, not as a warning at every batch (later failures stay warnings: the log never
        holds up a delivery)."""
        with self._lock:
            try:
                self._connect()
            except DuetimeError:
                raise
            except Exception as error:  # a schema that is not there, a user who may not create
                raise ConfigurationError(
                    f"Cannot keep the delivery log in {redact(self.url)}: {server_reason(error)}; give a "
                    "database (and schema) this user can create a table in."
                ) from None

    def _connect(self) -> Any:
        if self._conn is None:
            conn = self.db.connect()
            self.db.execute(conn, self.db.query("create_log"))
            conn.commit()
            self._conn = conn
        return self._conn

    def write(self, entries: Sequence[Delivery]) -> None:
        rows = [
            (
                e.message_id,
                e.destination,
                to_micros(e.due_at),
                to_micros(e.dispatched_at),
                e.attempts,
                HELD_OUTCOME if e.held else e.outcome,
            )
            for e in entries
        ]
        with self._lock:
            conn = self._connect()
            try:
                self.db.begin_writing(conn)
                self.db.executemany(conn, self.db.query("insert_log"), rows)
                conn.commit()
            except Exception:
                self._drop()
                raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    async def record(self, entries: Sequence[Delivery]) -> None:
        if entries:
            await self._writer.call(self.write, entries)

    async def close(self) -> None:
        """Close the connection on the thread that writes with it (a SQLite connection serves
        only the thread that opened it: closed from another, it stayed open), unless a write
        still holds that thread after :data:`CLOSE_WITHIN` (a server that does not answer): the
        connection is then closed once that write returns."""
        try:
            await asyncio.wait_for(self._writer.call(self._drop_when_free), CLOSE_WITHIN)
        except TimeoutError:
            log.warning(
                "the delivery log did not answer within %.0f s; closing it is left to its thread",
                CLOSE_WITHIN,
            )
        finally:
            self._writer.stop()

    def _drop_when_free(self) -> None:
        with self._lock:
            self._drop()


def open_delivery_log(spec: str) -> DeliveryLog:
    """``jsonl:/folder`` or a database URL."""
    scheme, _, rest = spec.partition(":")
    if scheme == "jsonl":
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ConfigurationError("Name a folder for the delivery log: jsonl:/var/log/duetime.")
        return JsonLinesDeliveryLog(path)
    if scheme in ("postgresql", "postgres", "mysql", "mariadb", "sqlite"):
        return SqlDeliveryLog(spec)
    raise ConfigurationError(
        f"Cannot write a delivery log to {spec.split('@')[-1]!r}; use jsonl:/folder or a "
        "postgresql://, mysql:// or sqlite:/// URL."
    )
