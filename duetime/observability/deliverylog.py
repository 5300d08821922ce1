"""The dispatcher's opt-in delivery log: one entry per forwarded or dead-lettered message.

``duetime bulk report`` reads it to chart lateness over time. It is written after each batch was
delivered and removed from the store, so it never decides a delivery: a log that cannot be written
costs a warning, not a message (a slow one slows the next batch; keep it local or on a fast table).
Destinations: JSON Lines files (``jsonl:/var/log/duetime``, one file per UTC day) or a table
``duetime_delivery_log`` in a SQL database (``postgresql://…``, ``mysql://…``, ``sqlite:///…``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from duetime.clock import to_micros
from duetime.errors import ConfigurationError
from duetime.interfaces import Delivery, DeliveryLog

log = logging.getLogger("duetime.deliverylog")


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
            await asyncio.to_thread(self.write, entries)

    async def close(self) -> None:
        return None


class SqlDeliveryLog:
    """Rows in ``duetime_delivery_log`` (times as µs since 1970), through the Python driver."""

    def __init__(self, url: str) -> None:
        from duetime.backends.sqldb import Database

        self.db = Database.from_url(url)
        self._conn: Any = None
        self._lock = threading.Lock()

    def reach(self) -> None:
        """Connect and make the table now: a URL that cannot work is said when the dispatcher
        starts, not as a warning at every batch (later failures stay warnings: the log never
        holds up a delivery)."""
        with self._lock:
            self._connect()

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
                e.outcome,
            )
            for e in entries
        ]
        with self._lock:
            conn = self._connect()
            try:
                if self.db.dialect == "sqlite" and not conn.in_transaction:
                    conn.execute("BEGIN IMMEDIATE")
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
            await asyncio.to_thread(self.write, entries)

    async def close(self) -> None:
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
