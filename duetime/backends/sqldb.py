"""One SQL database as the bulk jobs and the delivery log see it: a picklable URL, a DB-API
connection, and what differs between databases answered by each backend's subclass.

The base holds what every SQL database shares (the statements of ``sqldb.sql``, sessions,
retries, streaming); each backend's folder holds its own (``sql_database.py``: quoting, column
types, connecting, and the abilities bulk asks about, such as reading by blocks or copying
rows between two servers). Bulk never asks which database it is: it asks an ability
(:class:`duetime.bulk_interfaces.SqlDatabase`). Spark ships one to each executor, which
opens its own connection with the Python driver (psycopg, PyMySQL, sqlite3): no JDBC jar.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlencode

from duetime.backends.source_rows import SourceRows
from duetime.backends.sqlfiles import load_queries
from duetime.bulk_interfaces import STATE_TABLES, MovingBulkRows, Selection, SqlDatabase, StoreBulkRows
from duetime.errors import ConfigurationError
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact, split_options

T = TypeVar("T")
#: URL options the bulk jobs read themselves; everything else goes to the store or the driver.
BULK_OPTIONS = ("layout", "table", "schema")
#: The layouts a bulk job reads: duetime's own store tables, and NServiceBus's two.
LAYOUTS = ("duetime", "timeoutdata", "msmq")


@dataclass(frozen=True)
class Database:
    """A database URL split into what the driver needs and the bulk options (layout, table).

    Not used itself: each SQL backend subclasses it (``duetime.backends.<store>.sql_database``)
    and the registry opens the one a URL's scheme names."""

    url: str = field(repr=False)
    layout: str = "duetime"
    table: str | None = None
    schema: str | None = None
    display: str = ""

    #: The suffix of this database's own statements in ``sqldb.sql`` (``name.postgres``).
    dialect: ClassVar[str] = ""
    #: Column types of the state tables.
    blob: ClassVar[str] = "BLOB"
    text: ClassVar[str] = "TEXT"
    #: The lock a read that is about to change rows takes ("" where the transaction holds it).
    row_lock: ClassVar[str] = " FOR UPDATE"
    #: Holds NServiceBus's layouts (``TimeoutData``, the MSMQ store): server databases do.
    keeps_other_layouts: ClassVar[bool] = True

    @classmethod
    def from_url(cls, url: str) -> Database:
        """``url`` as this database: its bulk options taken out and checked."""
        driver_url, ours = split_options(url, BULK_OPTIONS)
        layout = ours.get("layout", "duetime").lower()
        if layout not in LAYOUTS:
            raise ConfigurationError(
                f"Unknown layout {layout!r} in {redact(url)}; use layout=duetime (a duetime store), "
                "layout=timeoutdata (NServiceBus SQL persistence) or layout=msmq (the NServiceBus MSMQ transport's delayed store)."
            )
        table = ours.get("table")
        schema = ours.get("schema")
        return cls(
            url=driver_url,
            layout=layout,
            table=None if table is None else check_name("table", table),
            schema=None if schema is None else check_name("schema", schema),
            display=redact(url),
        )

    def place(self) -> tuple[str, ...]:
        """Where its tables are, as the server itself says: two URLs naming one server two ways
        (``localhost`` and ``127.0.0.1``, a socket and a port) are one place. Connects, except
        for SQLite (a file's resolved path)."""
        with self.session(write=False) as conn:
            server = [str(value) for value in self.execute(conn, self.query("server_identity")).fetchone()]
        return (self.dialect, *server, *self.schema_params())

    def store_url(self, table: str | None = None) -> str:
        """The URL a duetime store for one table would be opened with."""
        extra = self._store_options()
        if table:
            extra.append(("table", table))
        if not extra:
            return self.url
        joiner = "&" if "?" in self.url else "?"
        return self.url + joiner + urlencode(extra)

    def _store_options(self) -> list[tuple[str, str]]:
        """The URL options a store of this database is opened with besides its table."""
        return []

    # -- how this database writes things ----------------------------------------------------------

    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def qualified(self, table: str) -> str:
        return self.quote(self.kept_name(table))

    def kept_name(self, table: str) -> str:
        """``table``'s name as this database keeps it: a long one cut as the stores cut theirs."""
        return table

    def schema_params(self) -> list[str]:
        """The parameters naming this database's schema in the catalog statements (none where a
        database has one)."""
        return []

    def as_text(self, column: str) -> str:
        """A column read as its stored text (PostgreSQL would parse a json column)."""
        return self.quote(column)

    def store_due(self, due_us: int) -> Any:
        """A due time as a duetime store table of this database keeps it: µs since 1970."""
        return due_us

    def uuid_param(self, text: str) -> Any:
        """A GUID column's value as this database's driver takes it."""
        return text

    def block_range(self, lower: int | None, upper: int | None) -> tuple[str, list[Any]] | None:
        """A condition for the rows in physical blocks ``lower`` to ``upper`` (either may be open),
        where this database can read a table that way (:meth:`reads_by_blocks`)."""
        return None

    def query(self, name: str, **names: object) -> str:
        """The statement ``name`` of ``sqldb.sql`` in this dialect, with the state tables, the column
        types and ``names`` (a table, an IN list's marks) filled in."""
        queries = load_queries("duetime.backends", "sqldb.sql")
        text = queries.get(f"{name}.{self.dialect}") or queries[name]
        return text.format_map({**self._words(), **names})

    def _words(self) -> dict[str, str]:
        words = {key: self.qualified(table) for key, table in STATE_TABLES.items()}
        words |= {f"key{n}": self.key_text(n) for n in (16, 64, 200, 250)}
        words |= {"text": self.text, "blob": self.blob, "lock": self.row_lock}
        return words

    def sql(self, text: str) -> str:
        """Queries are written with ``%s``; a driver that wants another mark overrides this."""
        return text

    def key_text(self, length: int) -> str:
        return f"VARCHAR({length})"

    def source_rows(self, table: str) -> SourceRows:
        """``table`` of this database as a migration takes rows out of it and puts them back, with
        the statements of this database's backend (its ``bulk_rows`` module)."""
        raise NotImplementedError

    def store_rows(self, table: str) -> StoreBulkRows:
        """The duetime store's bulk writer for one endpoint's ``table`` in this database
        (:class:`duetime.bulk_interfaces.StoreBulkRows`)."""
        raise NotImplementedError

    def moving_rows(self, table: str) -> MovingBulkRows:
        """The store's writer that takes rows from statements in this server
        (:class:`duetime.bulk_interfaces.MovingBulkRows`): only where :meth:`same_database` or
        :meth:`pipes_from` said so."""
        raise NotImplementedError

    # -- what this database can do, asked by bulk ---------------------------------------------------

    def check_readable(self) -> None:
        """Before reading: one line if there is nothing to read (a SQLite file that is not there,
        which opening would create)."""

    def check_writable(self) -> bool:
        """Before writing: one line if it cannot be written; False when there is nothing there yet
        to connect to (a SQLite file the job will make)."""
        return True

    def reads_by_blocks(self, conn: Any) -> bool:
        """Plans a table's batches by physical blocks (:meth:`block_range`) on this server."""
        return False

    def table_blocks(self, conn: Any, table: str) -> tuple[int, int]:
        """How many physical blocks ``table`` has and the rows its statistics expect (only where
        :meth:`reads_by_blocks`)."""
        raise NotImplementedError

    def count_block_slices(
        self, conn: Any, table: str, selection: Selection, starts: Sequence[int]
    ) -> list[int]:
        """The selected rows in each slice of blocks from one start to the next (only where
        :meth:`reads_by_blocks`)."""
        raise NotImplementedError

    def exact_in_server(self, conn: Any) -> bool:
        """Computes a record's columns (:meth:`record_columns`) in this server exactly, to the
        microsecond."""
        return False

    # -- records computed in the server: only where record_columns(layout) and exact_in_server ---

    def record_columns(self, layout: str) -> list[str] | None:
        """The expressions this server computes a record of ``layout``'s rows with; None where
        only Python reads them as records."""
        return None

    def read_records(
        self, conn: Any, table: str, layout: str, selection: Selection, size: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The selected rows as records (and each one's group), computed in the server."""
        raise NotImplementedError

    def stage_records(
        self, conn: Any, table: str, layout: str, selection: Selection, run_id: str, batch: int, endpoint: str
    ) -> int:
        """The selected rows moved into the staging table as records, in the server: how many."""
        raise NotImplementedError

    def staged_to_check(self, conn: Any, run_id: str, batch: int) -> list[tuple[Any, ...]]:
        """The batch's staged rows (without bodies) the server cannot vouch for."""
        raise NotImplementedError

    def ids_held(
        self, conn: Any, table: str, layout: str, selection: Selection, rows: MovingBulkRows
    ) -> list[str]:
        """The selected rows' ids the store table ``rows`` writes holds already."""
        raise NotImplementedError

    def move_plainly_fine(
        self, conn: Any, table: str, layout: str, selection: Selection, held: Sequence[str], rows: Any
    ) -> tuple[int, int, int | None]:
        """The selected rows the server vouches for, but ``held``, moved into the store table in
        one statement: taken, stored, the earliest due (µs)."""
        raise NotImplementedError

    def records_left(
        self, conn: Any, table: str, layout: str, selection: Selection, held: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """The selected rows (but ``held``) still in the table, as records."""
        raise NotImplementedError

    def take_ids(
        self, conn: Any, table: str, layout: str, selection: Selection, ids: Sequence[str]
    ) -> set[str]:
        """Delete the selected rows with ``ids``: the ids that went."""
        raise NotImplementedError

    def figures(
        self,
        conn: Any,
        table: str,
        layout: str,
        selection: Selection,
        now_us: int,
        horizons: Sequence[tuple[str, float | None]],
        top: int,
    ) -> list[tuple[Any, ...]]:
        """The selected rows counted by destination, horizon and failures, and the largest, in
        one scan: ``(destination, horizon, failures, grouping, count or size, id)`` rows."""
        raise NotImplementedError

    def same_database(self, other: Database) -> bool:
        """``other`` is this very database as the same user, so one connection can move rows
        between their tables inside the server."""
        return False

    def pipes_from(self, other: Database) -> bool:
        """Rows can stream from ``other``'s server into this one without being decoded here."""
        return False

    def write_staged(self, conn: Any, rows: Sequence[Sequence[Any]]) -> None:
        """Staged rows (``insert_staged``'s columns) into the staging table."""
        self.executemany(conn, self.query("insert_staged"), rows)

    def lock_ledger_row(self, conn: Any, run_id: str, batch: int) -> None:
        """Where a concurrent twin of a batch write would not wait on its own: lock the batch's
        ledger row first."""

    def claim_ids(self, conn: Any, job: str, ids: Sequence[str]) -> set[str]:
        """Record ``ids`` as scheduled by ``job``; returns those it had not scheduled before."""
        raise NotImplementedError

    def become_only_writer(self, conn: Any) -> None:
        """Make the open transaction the only writer from its start (SQLite); the server
        databases lock the rows they touch instead."""

    def begin_writing(self, conn: Any) -> None:
        """Start a write on a connection kept open between commits, where the driver does not."""

    # -- connections --------------------------------------------------------------------------------

    def connect(self, write: bool = True) -> Any:
        """A new DB-API connection, not in autocommit; the caller commits. A server that cannot
        be reached, or a database that is not there, is one line (:class:`ConnectionFailed`)."""
        raise NotImplementedError

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
        """The schema named in the URL, created if missing (before any table in it), where a
        database has schemas."""

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
        """The rows of a query in lists of at most ``size``, never the whole result in memory
        (each database's :meth:`_streaming_cursor`)."""
        cur = self._streaming_cursor(conn, size)
        try:
            cur.execute(self.sql(text), tuple(params))
            while rows := cur.fetchmany(size):
                yield [tuple(r) for r in rows]
        finally:
            cur.close()

    def _streaming_cursor(self, conn: Any, size: int) -> Any:
        """A cursor that fetches as it goes (SQLite steps as it goes)."""
        return conn.cursor()

    def executemany(self, conn: Any, text: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            cur = conn.cursor()
            cur.executemany(self.sql(text), [tuple(r) for r in rows])

    def table_exists(self, conn: Any, table: str) -> bool:
        where = [*self.schema_params(), self.kept_name(table)]
        return self.execute(conn, self.query("table_exists"), where).fetchone() is not None

    def tables(self, conn: Any) -> list[str]:
        return sorted(
            str(r[0]) for r in self.execute(conn, self.query("tables"), self.schema_params()).fetchall()
        )

    def store_tables(self, conn: Any) -> list[str]:
        """The tables duetime stores in this database keep (their ``duetime_schema`` rows), those
        that are there."""
        if not self.table_exists(conn, "duetime_schema"):
            return []
        rows = self.execute(conn, self.query("store_components", table=self._schema_table())).fetchall()
        tables = sorted(str(r[0])[len("store:") :] for r in rows)
        return [t for t in tables if self.table_exists(conn, t)]

    def _schema_table(self) -> str:
        """``duetime_schema`` as ``store_components`` names it."""
        return "duetime_schema"

    # -- a migration's source rows and state ------------------------------------------------------

    def take_rows(self, conn: Any, table: str, key: str, keys: Sequence[Any]) -> int:
        """Delete ``table``'s rows whose ``key`` column is one of ``keys``: how many went."""
        return self.source_rows(table).take_keys(conn, self.quote(key), keys)

    def put_back(self, conn: Any, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows taken out, back into ``table`` (``columns``: their names, in the rows' order)."""
        self.source_rows(table).put_back(conn, [self.quote(c) for c in columns], rows)

    def rows_in_states(self, conn: Any, run_id: str, statuses: Sequence[str]) -> int:
        """The planned rows of a run's batches whose status is one of ``statuses``."""
        query = self.query("rows_in_states", marks=self.in_list(len(statuses)))
        return int(self.execute(conn, query, [run_id, *statuses]).fetchone()[0])

    def release_scheduled(self, conn: Any, job: str, ids: Sequence[str]) -> None:
        """``ids`` are no longer ``job``'s (it replaces them after this commit, then claims them)."""
        for part in self.chunks(ids, 500):
            self.execute(
                conn, self.query("release_scheduled_ids", marks=self.in_list(len(part))), [job, *part]
            )

    def is_store_table(self, conn: Any, table: str) -> bool:
        """``table`` is a duetime store's (it has the store's columns); a failed look is rolled back."""
        try:
            self.execute(conn, self.query("is_duetime_store", table=self.qualified(table))).fetchall()
        except Exception:
            conn.rollback()
            return False
        return True

    def staged_store_rows(self, source: Database) -> str:
        """The statement giving an endpoint's staged rows of a batch in ``source`` (this very
        database) as a store keeps them (only where :meth:`same_database`)."""
        raise NotImplementedError

    def copy_staged_out(self) -> str:
        """The statement streaming an endpoint's staged rows of a batch out of this server in
        binary form, as a copy to standard output streams them (only where another database
        :meth:`pipes_from` this one)."""
        raise NotImplementedError

    # -- a target's ledger: one row per batch written, committed with the batch -------------------

    def create_ledger(self, conn: Any) -> None:
        self.execute(conn, self.query("create_ledger"))

    def ledger_entry(self, conn: Any, run_id: str, batch: int) -> tuple[int, list[str]] | None:
        """What the batch's write did (rows in, ids the target held), if it committed."""
        row = self.execute(conn, self.query("ledger_row"), [run_id, batch]).fetchone()
        return None if row is None else (int(row[0]), [str(i) for i in json.loads(row[1])])

    def keep_ledger_entry(
        self, conn: Any, run_id: str, batch: int, inserted: int, conflicts: Sequence[str]
    ) -> None:
        self.execute(
            conn, self.query("insert_ledger_row"), [run_id, batch, inserted, json.dumps(list(conflicts))]
        )

    def forget_ledger(self, conn: Any, run_id: str) -> None:
        self.execute(conn, self.query("forget_run"), [run_id])

    # -- reading a source table by a selection ---------------------------------------------------

    def where(self, selection: Selection) -> tuple[str, list[Any]]:
        """The condition (and its parameters) picking ``selection``'s rows."""
        clauses, params = ["1=1"], []
        due = self.quote(selection.due)
        if selection.due_from is not None:
            clauses, params = [f"{due} >= %s"], [selection.due_from]
        if selection.due_before is not None:
            clauses, params = [*clauses, f"{due} < %s"], [*params, selection.due_before]
        if selection.unclaimed_at is not None:
            claimed = self.quote("claimed_until")
            clauses, params = (
                [*clauses, f"({claimed} IS NULL OR {claimed} < %s)"],
                [*params, selection.unclaimed_at],
            )
        blocks = None if selection.blocks is None else self.block_range(*selection.blocks)
        if blocks is not None:
            clauses, params = [*clauses, blocks[0]], [*params, *blocks[1]]
        key = self.quote(selection.key) if selection.key else ""
        if blocks is None and selection.lower is not None:
            clauses, params = [*clauses, f"{key} >= %s"], [*params, selection.lower]
        if blocks is None and selection.upper is not None:
            clauses, params = [*clauses, f"{key} < %s"], [*params, selection.upper]
        return " AND ".join(clauses), params

    def _columns(self, columns: Sequence[str], as_stored: Collection[str] = ()) -> str:
        return ", ".join(self.as_text(c) if c in as_stored else self.quote(c) for c in columns)

    def has_columns(self, conn: Any, table: str, columns: Sequence[str]) -> bool:
        """``table`` has every one of ``columns`` (asked of the server; a failed look is rolled back)."""
        try:
            self.execute(
                conn, f"SELECT {self._columns(columns)} FROM {self.qualified(table)} WHERE 1=0"
            ).fetchall()
        except Exception:
            conn.rollback()
            return False
        return True

    def count_rows(self, conn: Any, table: str, selection: Selection) -> int:
        where, params = self.where(selection)
        return int(
            self.execute(
                conn, f"SELECT COUNT(*) FROM {self.qualified(table)} WHERE {where}", params
            ).fetchone()[0]
        )

    def latest_due_by(
        self, conn: Any, table: str, column: str, selection: Selection
    ) -> list[tuple[Any, Any]]:
        """Each value of ``column`` among the selected rows, with the latest due time."""
        where, params = self.where(selection)
        group, due = self.quote(column), self.quote(selection.due)
        text = f"SELECT {group}, MAX({due}) FROM {self.qualified(table)} WHERE {where} GROUP BY {group}"
        return [(r[0], r[1]) for r in self.execute(conn, text, params).fetchall()]

    def key_bounds(
        self, conn: Any, table: str, selection: Selection, every: int
    ) -> list[tuple[Any, int, int]]:
        """Every ``every``-th key of the selected rows in key order, with its place and the
        total: each batch is then one range of the primary key, read by an index range scan (a
        hash bucket would scan the table per batch)."""
        where, params = self.where(selection)
        key = self.quote(selection.key)
        text = (
            f"SELECT k, rn, total FROM (SELECT {key} AS k, ROW_NUMBER() OVER (ORDER BY {key}) AS rn, "
            f"COUNT(*) OVER () AS total FROM {self.qualified(table)} WHERE {where}) x "
            "WHERE MOD(rn - 1, %s) = 0 ORDER BY rn"
        )
        return [(r[0], int(r[1]), int(r[2])) for r in self.execute(conn, text, [*params, every]).fetchall()]

    def read_rows(
        self,
        conn: Any,
        table: str,
        columns: Sequence[str],
        selection: Selection,
        *,
        size: int = 5000,
        as_stored: Collection[str] = (),
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The selected rows' ``columns`` in lists of at most ``size`` (:meth:`stream`);
        ``as_stored``: columns read as their stored text, byte for byte."""
        where, params = self.where(selection)
        text = f"SELECT {self._columns(columns, as_stored)} FROM {self.qualified(table)} WHERE {where}"
        return self.stream(conn, text, params, size)

    def keys_of(self, conn: Any, table: str, selection: Selection) -> list[Any]:
        where, params = self.where(selection)
        key = self.quote(selection.key)
        return [
            r[0]
            for r in self.execute(
                conn, f"SELECT {key} FROM {self.qualified(table)} WHERE {where}", params
            ).fetchall()
        ]

    def rows_with_keys(
        self,
        conn: Any,
        table: str,
        columns: Sequence[str],
        selection: Selection,
        keys: Sequence[Any],
        *,
        as_stored: Collection[str] = (),
    ) -> list[tuple[Any, ...]]:
        """The selected rows among ``keys``, locked for the transaction (:attr:`row_lock`)."""
        where, params = self.where(selection)
        text = (
            f"SELECT {self._columns(columns, as_stored)} FROM {self.qualified(table)} "
            f"WHERE {self.quote(selection.key)} IN ({self.in_list(len(keys))}) AND {where}{self.row_lock}"
        )
        return [tuple(r) for r in self.execute(conn, text, [*keys, *params]).fetchall()]

    def chunks(self, items: Sequence[Any], size: int = 1000) -> Iterator[Sequence[Any]]:
        for start in range(0, len(items), size):
            yield items[start : start + size]

    def in_list(self, count: int) -> str:
        return ", ".join(["%s"] * count)


def _is_deadlock(error: Exception) -> bool:
    code = getattr(error, "sqlstate", None)
    if code in ("40P01", "40001"):  # PostgreSQL: deadlock detected, serialization failure
        return True
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    return len(args) > 0 and args[0] in (1213, 1205)  # MariaDB: deadlock, lock wait timeout


def _answers_for_bulk(db: Database) -> SqlDatabase:
    """Never called: mypy holds here that every database is what the bulk jobs ask of one (the
    registry hands them out cast, so nothing else would)."""
    return db
