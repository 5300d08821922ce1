"""Opening SQLite files the way duetime needs them: WAL, a busy timeout, explicit transactions."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from duetime.backends._store import load_headers
from duetime.backends.sqlfiles import load_queries
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, StorageFull
from duetime.inputs.urls import options_of
from duetime.message import dump_headers

QUERIES = load_queries("duetime.backends.sqlite")
SYNCHRONOUS = {"off", "normal", "full", "extra"}
__all__ = [
    "QUERIES",
    "connect",
    "dump_headers",
    "load_headers",
    "many_rows",
    "parse_sqlite_url",
    "write_statement",
    "write_transaction",
]


def parse_sqlite_url(url: str) -> tuple[Path, dict[str, str]]:
    """``sqlite:///relative.db`` or ``sqlite:////absolute.db``, options in the query string."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigurationError(f"Not a SQLite URL: {url!r}; write sqlite:///path/to/file.db.")
    if parts.netloc:
        raise ConfigurationError(
            f"SQLite URL {url!r} has a host part; use three slashes for a relative path "
            "(sqlite:///duetime.db) or four for an absolute one (sqlite:////var/lib/duetime.db)."
        )
    raw = unquote(parts.path)
    if not raw.startswith("/") or raw == "/":
        raise ConfigurationError(f"SQLite URL {url!r} names no file; e.g. sqlite:///duetime.db.")
    options = options_of(url)
    return Path(raw[1:]), options


class Connection(sqlite3.Connection):
    """A connection that knows how long a writer may wait for the write lock."""

    write_lock_timeout: float = 30.0
    #: The file, for the one line that says it cannot be written.
    path: Path | None = None
    #: Its ``PRAGMA synchronous``: full and extra wait for the disk at each commit.
    synchronous: str = "full"


def check_folder(path: Path) -> None:
    """SQLite makes a missing file, never a missing folder, and cannot open a folder as a file:
    say so in one line (its own words are "unable to open database file")."""
    if path.parent and not path.parent.exists():
        raise ConfigurationError(f"Folder {path.parent} does not exist; create it or choose another path.")
    if path.is_dir():
        raise ConfigurationError(
            f"{path} is a folder, not a SQLite file; name a file in it, e.g. sqlite:///{path / 'duetime.db'}."
        )


def cannot_open(path: Path, error: sqlite3.DatabaseError) -> ConfigurationError | None:
    """The one line for a first read that failed because of the file itself (not SQLite's, or not
    this user's to open); None for any other error."""
    if "file is not a database" in str(error):
        return ConfigurationError(
            f"{path} is not a SQLite database (it holds something else); name another file."
        )
    if "unable to open" in str(error) or "readonly" in str(error):
        return ConfigurationError(
            f"Cannot open the SQLite file {path} ({error}); check that this user may read and write it "
            "and its folder."
        )
    return None


def connect(path: Path, synchronous: str = "full", busy_timeout: float = 30.0) -> Connection:
    """A connection in autocommit mode; callers open ``BEGIN IMMEDIATE`` for every write.

    SQLite's own busy handler backs off to 100 ms sleeps, which makes a contended lock late by
    that much; so statements get a 5 ms busy timeout and :func:`write_transaction` retries the
    write lock itself, every millisecond or so, until ``busy_timeout`` seconds have passed.
    """
    if synchronous not in SYNCHRONOUS:
        raise ConfigurationError(f"synchronous must be one of {sorted(SYNCHRONOUS)}, got {synchronous!r}.")
    check_folder(path)
    try:  # a file this user may not create or open fails here, one that is not SQLite's below
        conn = sqlite3.connect(
            str(path), timeout=0.005, isolation_level=None, check_same_thread=False, factory=Connection
        )
    except sqlite3.DatabaseError as error:
        raise cannot_open(path, error) or error from None
    conn.write_lock_timeout = busy_timeout
    conn.path = path
    try:  # the file's first read: where a file that is not SQLite's, or not ours to open, shows
        _retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"), busy_timeout)
    except sqlite3.DatabaseError as error:
        conn.close()
        raise cannot_open(path, error) or error from None
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    conn.synchronous = synchronous
    return conn


def _retry_locked(action: Callable[[], object], timeout: float) -> None:
    deadline = SYSTEM.monotonic() + timeout
    pause = 0.0005
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            if SYSTEM.monotonic() > deadline:
                raise sqlite3.OperationalError(
                    f"{error} (waited {timeout:g} s for the write lock; another process holds it)"
                ) from None
            time.sleep(pause + random.random() * pause)
            pause = min(pause * 2, 0.002)


@contextlib.contextmanager
def _writable(conn: sqlite3.Connection) -> Iterator[None]:
    """A file this user may only read (or whose folder it may not write: SQLite keeps -wal and
    -shm files beside it) opens and reads fine, then refuses the first write with "attempt to
    write a readonly database": said in one line, naming the file."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if "disk is full" in str(error) or getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            raise _full(getattr(conn, "path", None) or "") from None
        if "readonly" not in str(error):
            raise
        raise ConfigurationError(
            f"Cannot write the SQLite file {getattr(conn, 'path', None) or ''} ({error}); check that this "
            "user may write it and its folder (SQLite keeps -wal and -shm files beside it)."
        ) from None


def _full(path: str) -> StorageFull:
    """A full disk under a SQLite file, said with the file, its filesystem and what is free."""
    where = os.path.dirname(os.path.abspath(path)) if path else "."
    try:
        stats = os.statvfs(where)
        free = f"{stats.f_bavail * stats.f_frsize:,} of {stats.f_blocks * stats.f_frsize:,} bytes free"
    except OSError:
        free = "free space unknown"
    return StorageFull(
        f"The disk holding the SQLite file {path} is full (the filesystem of {where}: {free}); "
        "free some space there, then try again. Nothing was written by this call."
    )


def write_statement(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
    """One writing statement in a transaction of its own (autocommit), waiting for the write lock
    as :func:`write_transaction` does: one call into SQLite where a transaction takes three, so a
    thread gives up and takes back the interpreter once (a failed statement changed nothing, so
    trying it again is safe)."""
    done: list[sqlite3.Cursor] = []
    with _writable(conn):
        _retry_locked(
            lambda: done.append(conn.execute(sql, params)), getattr(conn, "write_lock_timeout", 30.0)
        )
    return done[0]


@functools.lru_cache(maxsize=256)
def many_rows(insert: str, count: int) -> str:
    """``insert`` (``INSERT … VALUES (?, …);``) for ``count`` rows in one statement."""
    head, _, row = insert.strip().rstrip(";").rpartition("VALUES")
    return f"{head}VALUES {', '.join([row.strip()] * count)}"


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``: take the write lock up front, so readers never deadlock upgrading.

    ``durable=False``: the commit does not wait for the disk (``synchronous=NORMAL`` for this
    transaction; the next flushed commit by any connection flushes it too). For writes a power cut
    may undo without harm: a queue receipt, whose loss hands the message out again as a consumer
    that died would. A process killed at any moment loses nothing either way."""
    level = getattr(conn, "synchronous", "full")
    relaxed = not durable and level in ("full", "extra")
    if relaxed:
        conn.execute("PRAGMA synchronous=NORMAL")
    try:
        with _writable(conn):
            _retry_locked(lambda: conn.execute("BEGIN IMMEDIATE"), getattr(conn, "write_lock_timeout", 30.0))
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
    finally:
        if relaxed:
            conn.execute(f"PRAGMA synchronous={level.upper()}")
