"""A SQLite file as the bulk jobs and the delivery log see it (:class:`Database`'s SQLite
answers): ``?`` marks, WAL, a writer that takes the write lock when it begins, and duetime's own
layout only."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from duetime.backends.source_rows import SourceRows
from duetime.backends.sqldb import Database
from duetime.backends.sqlite.bulk_rows import IDS_A_LOOK, SqliteBulkRows, source_rows
from duetime.backends.sqlite.connection import cannot_open, check_folder, parse_sqlite_url
from duetime.errors import ConfigurationError


@dataclass(frozen=True)
class SqliteDatabase(Database):
    """A SQLite file (``sqlite:///path``)."""

    dialect: ClassVar[str] = "sqlite"
    row_lock: ClassVar[str] = ""  # BEGIN IMMEDIATE holds the write lock for the whole transaction
    keeps_other_layouts: ClassVar[bool] = False

    def place(self) -> tuple[str, ...]:
        return ("sqlite", str(parse_sqlite_url(self.url)[0].resolve()))

    def sql(self, text: str) -> str:
        return text.replace("%s", "?")

    def key_text(self, length: int) -> str:
        return "TEXT"

    def source_rows(self, table: str) -> SourceRows:
        return source_rows(self.qualified(table))

    def store_rows(self, table: str) -> SqliteBulkRows:
        return SqliteBulkRows(table)

    def check_readable(self) -> None:
        if not parse_sqlite_url(self.url)[0].exists():  # opening it would make an empty one
            raise ConfigurationError(
                f"{self.display}: no such file, so there is nothing to read; check the path."
            )

    def check_writable(self) -> bool:
        path = parse_sqlite_url(self.url)[0]
        check_folder(path)
        return path.exists()

    def claim_ids(self, conn: Any, job: str, ids: Sequence[str]) -> set[str]:
        """Looks, then inserts: :meth:`become_only_writer` made this the only writer."""
        known: set[str] = set()
        for chunk in self.chunks(ids, IDS_A_LOOK):
            rows = self.execute(
                conn, self.query("scheduled_ids", marks=self.in_list(len(chunk))), [job, *chunk]
            )
            known |= {r[0] for r in rows.fetchall()}
        fresh = [i for i in ids if i not in known]
        self.executemany(conn, self.query("insert_scheduled_id"), [(job, i) for i in fresh])
        return set(fresh)

    def become_only_writer(self, conn: Any) -> None:
        conn.commit()
        conn.execute("BEGIN IMMEDIATE")

    def begin_writing(self, conn: Any) -> None:
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")

    def connect(self, write: bool = True) -> Any:
        path, _ = parse_sqlite_url(self.url)
        check_folder(path)
        try:
            conn: Any = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        except sqlite3.DatabaseError as error:
            raise cannot_open(path, error) or error from None
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as error:
            conn.close()
            raise cannot_open(path, error) or error from None
        # A writer takes the write lock up front, so status checks hold for the whole session.
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        return conn
