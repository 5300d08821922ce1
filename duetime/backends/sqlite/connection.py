"""Opening SQLite files the way duetime needs them: WAL, a busy timeout, explicit transactions."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from duetime.errors import ConfigurationError
from duetime.sqlfile import load_queries

QUERIES = load_queries("duetime.backends.sqlite")
SYNCHRONOUS = {"off", "normal", "full", "extra"}


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
    options = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    return Path(raw[1:]), options


def connect(path: Path, synchronous: str = "full", busy_timeout: float = 30.0) -> sqlite3.Connection:
    """A connection in autocommit mode; callers open ``BEGIN IMMEDIATE`` for every write."""
    if synchronous not in SYNCHRONOUS:
        raise ConfigurationError(f"synchronous must be one of {sorted(SYNCHRONOUS)}, got {synchronous!r}.")
    if path.parent and not path.parent.exists():
        raise ConfigurationError(f"Folder {path.parent} does not exist; create it or choose another path.")
    conn = sqlite3.connect(
        str(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    deadline = time.monotonic() + busy_timeout
    while True:  # switching to WAL needs a moment alone with the file
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    return conn


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE``: take the write lock up front, so readers never deadlock upgrading."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def dump_headers(headers: Mapping[str, str]) -> str:
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)


def load_headers(text: str) -> dict[str, str]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("stored headers are not a JSON object")
    return {str(k): str(v) for k, v in value.items()}


def option_float(options: Mapping[str, str], name: str, default: float) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"URL option {name}={raw!r} must be a number of seconds.") from None
    if value <= 0:
        raise ConfigurationError(f"URL option {name} must be greater than zero.")
    return value
