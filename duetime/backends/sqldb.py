"""One SQL database as the bulk jobs and the delivery log see it: a picklable URL, a DB-API connection, dialect bits.

Spark ships a :class:`Database` to each executor, which opens its own connection with the Python
driver (psycopg, PyMySQL, sqlite3): no JDBC jar and no download at run time.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode, urlsplit

from duetime.backends.source_rows import SourceRows
from duetime.backends.sqlfiles import load_queries
from duetime.errors import ConfigurationError
from duetime.inputs.identifiers import check_name, mariadb_name, postgres_name
from duetime.inputs.urls import redact, split_options

T = TypeVar("T")
DIALECTS = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite": "sqlite",
}
#: URL options the bulk jobs read themselves; everything else goes to the store or the driver.
BULK_OPTIONS = ("layout", "table", "schema")
#: The tables duetime keeps beside the stores, by the name ``sqldb.sql`` uses for them.
STATE_TABLES = {
    "runs": "duetime_bulk_runs",
    "batches": "duetime_bulk_batches",
    "staged": "duetime_bulk_staged",
    "ledger": "duetime_bulk_ledger",
    "scheduled": "duetime_bulk_scheduled",
    "log": "duetime_delivery_log",
}


@dataclass(frozen=True)
class Database:
    """A database URL split into what the driver needs and the bulk options (layout, table)."""

    url: str = field(repr=False)
    dialect: str
    layout: str = "duetime"
    table: str | None = None
    schema: str | None = None
    display: str = ""

    @classmethod
    def from_url(cls, url: str) -> Database:
        parts = urlsplit(url)
        dialect = DIALECTS.get(parts.scheme.lower())
        if dialect is None:
            raise ConfigurationError(
                f"{redact(url)} is not a database URL bulk jobs can read; use postgresql://, "
                "mysql:// or sqlite:///, or a parquet:/ or jsonl:/ path."
            )
        driver_url, ours = split_options(url, BULK_OPTIONS)
        layout = ours.get("layout", "duetime").lower()
        if layout not in ("duetime", "timeoutdata", "msmq"):
            raise ConfigurationError(
                f"Unknown layout {layout!r} in {redact(url)}; use layout=duetime (a duetime store), "
                "layout=timeoutdata (NServiceBus SQL persistence) or layout=msmq (the NServiceBus MSMQ transport's delayed store)."
            )
        table = ours.get("table")
        schema = ours.get("schema")
        return cls(
            url=driver_url,
            dialect=dialect,
            layout=layout,
            table=None if table is None else check_name("table", table),
            schema=None if schema is None else check_name("schema", schema),
            display=redact(url),
        )

    def place(self) -> tuple[str, ...]:
        """Where its tables are, as the server itself says: two URLs naming one server two ways
        (``localhost`` and ``127.0.0.1``, a socket and a port) are one place. Connects, except
        for SQLite (a file's resolved path)."""
        if self.dialect == "sqlite":
            from duetime.backends.sqlite.connection import parse_sqlite_url

            return ("sqlite", str(parse_sqlite_url(self.url)[0].resolve()))
        with self.session(write=False) as conn:
            server = [str(value) for value in self.execute(conn, self.query("server_identity")).fetchone()]
        schema = (self.schema or "public") if self.dialect == "postgres" else ""
        return (self.dialect, *server, schema)

    def store_url(self, table: str | None = None) -> str:
        """The URL a duetime store for one table would be opened with."""
        extra = [("schema", self.schema)] if self.schema and self.dialect == "postgres" else []
        if table:
            extra.append(("table", table))
        if not extra:
            return self.url
        joiner = "&" if "?" in self.url else "?"
        return self.url + joiner + urlencode(extra)

    # -- dialect ----------------------------------------------------------------------------------

    def quote(self, name: str) -> str:
        if self.dialect == "mysql":
            return "`" + name.replace("`", "``") + "`"
        return '"' + name.replace('"', '""') + '"'

    def qualified(self, table: str) -> str:
        if self.dialect == "postgres":
            return f"{self.quote(self.schema or 'public')}.{self.quote(self.kept_name(table))}"
        return self.quote(self.kept_name(table))

    def kept_name(self, table: str) -> str:
        """``table``'s name as this database keeps it: a long one cut as the stores cut theirs."""
        if self.dialect == "postgres":
            return postgres_name(table)
        return mariadb_name(table) if self.dialect == "mysql" else table

    def query(self, name: str, **names: object) -> str:
        """The statement ``name`` of ``sqldb.sql`` in this dialect, with the state tables, the column
        types and ``names`` (a table, an IN list's marks) filled in."""
        queries = load_queries("duetime.backends", "sqldb.sql")
        text = queries.get(f"{name}.{self.dialect}") or queries[name]
        return text.format_map({**self._words(), **names})

    def _words(self) -> dict[str, str]:
        words = {key: self.qualified(table) for key, table in STATE_TABLES.items()}
        words |= {f"key{n}": self.key_text(n) for n in (16, 64, 200, 250)}
        words |= {
            "text": self.text,
            "blob": self.blob,
            "lock": "" if self.dialect == "sqlite" else " FOR UPDATE",
        }
        return words

    def sql(self, text: str) -> str:
        """Queries are written with ``%s``; sqlite3 wants ``?``."""
        return text.replace("%s", "?") if self.dialect == "sqlite" else text

    @property
    def blob(self) -> str:
        return {"postgres": "bytea", "mysql": "LONGBLOB", "sqlite": "BLOB"}[self.dialect]

    @property
    def text(self) -> str:
        return "LONGTEXT" if self.dialect == "mysql" else "TEXT"

    def key_text(self, length: int) -> str:
        return "TEXT" if self.dialect == "sqlite" else f"VARCHAR({length})"

    def source_rows(self, table: str) -> SourceRows:
        """``table`` of this database as a migration takes rows out of it and puts them back, with
        the statements of this database's backend (its ``bulk_rows`` module)."""
        if self.dialect == "postgres":
            from duetime.backends.postgres.bulk_rows import source_rows
        elif self.dialect == "mysql":
            from duetime.backends.mysql.bulk_rows import source_rows
        else:
            from duetime.backends.sqlite.bulk_rows import source_rows
        return source_rows(self.qualified(table))

    # -- connections --------------------------------------------------------------------------------

    def connect(self, write: bool = True) -> Any:
        """A new DB-API connection, not in autocommit; the caller commits. A server that cannot
        be reached, or a database that is not there, is one line (:class:`ConnectionFailed`)."""
        if self.dialect == "postgres":
            from duetime.backends.postgres.connection import PgOptions, connect

            return connect(PgOptions.from_url(self.url))
        if self.dialect == "mysql":
            from duetime.backends.mysql.store import MysqlOptions, mysql_connect

            return mysql_connect(MysqlOptions.from_url(self.url), autocommit=False)
        from duetime.backends.sqlite.connection import cannot_open, check_folder, parse_sqlite_url

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

    @contextmanager
    def session(self, write: bool = True) -> Iterator[Any]:
        """A connection that commits on success, rolls back on error, and is always closed."""
        conn = self.connect(write)
        try:
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def ensure_schema(self, conn: Any) -> None:
        """PostgreSQL: the schema named in the URL, created if missing (before any table in it)."""
        if (
            self.dialect == "postgres"
            and self.schema
            and not self.execute(conn, self.query("schema_exists"), [self.schema]).fetchone()
        ):
            self.execute(conn, self.query("create_schema", schema=self.quote(self.schema)))

    def retrying(self, action: Callable[[], T], attempts: int = 8) -> T:
        """Run a whole transaction again when the database chose it as a deadlock victim."""
        for attempt in range(attempts):
            try:
                return action()
            except Exception as error:
                if attempt == attempts - 1 or not _is_deadlock(error):
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    def execute(self, conn: Any, text: str, params: Sequence[Any] = ()) -> Any:
        cur = conn.cursor()
        cur.execute(self.sql(text), tuple(params))
        return cur

    def stream(
        self, conn: Any, text: str, params: Sequence[Any] = (), size: int = 5000
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of a query in lists of at most ``size``, never the whole result in memory: a
        server-side cursor on PostgreSQL (a plain one fetches everything at once), an unbuffered
        one on MariaDB (the connection runs nothing else meanwhile); SQLite steps as it goes."""
        if self.dialect == "postgres":
            cur = conn.cursor(name=f"duetime_stream_{next(_CURSORS)}")
            cur.itersize = size
        elif self.dialect == "mysql":
            import pymysql.cursors

            cur = conn.cursor(pymysql.cursors.SSCursor)
        else:
            cur = conn.cursor()
        try:
            cur.execute(self.sql(text), tuple(params))
            while rows := cur.fetchmany(size):
                yield [tuple(r) for r in rows]
        finally:
            cur.close()

    def executemany(self, conn: Any, text: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            cur = conn.cursor()
            cur.executemany(self.sql(text), [tuple(r) for r in rows])

    def table_exists(self, conn: Any, table: str) -> bool:
        name = self.kept_name(table)
        where = [self.schema or "public", name] if self.dialect == "postgres" else [name]
        return self.execute(conn, self.query("table_exists"), where).fetchone() is not None

    def tables(self, conn: Any) -> list[str]:
        where = [self.schema or "public"] if self.dialect == "postgres" else []
        return sorted(str(r[0]) for r in self.execute(conn, self.query("tables"), where).fetchall())

    def chunks(self, items: Sequence[Any], size: int = 1000) -> Iterator[Sequence[Any]]:
        for start in range(0, len(items), size):
            yield items[start : start + size]

    def in_list(self, count: int) -> str:
        return ", ".join(["%s"] * count)


_CURSORS = itertools.count()


def _is_deadlock(error: Exception) -> bool:
    code = getattr(error, "sqlstate", None)
    if code in ("40P01", "40001"):  # PostgreSQL: deadlock detected, serialization failure
        return True
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    return len(args) > 0 and args[0] in (1213, 1205)  # MariaDB: deadlock, lock wait timeout
