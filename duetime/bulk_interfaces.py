"""What the bulk jobs (and the delivery log) ask of the backends, as Protocols: the bulk path's
side of the boundary that :mod:`duetime.interfaces` draws for the online path.

``duetime.bulk`` imports no backend: it opens these through :mod:`duetime.registry` by a URL's
scheme, and asks each one what it can do (``reads_by_blocks``, ``record_columns``,
``pipes_from``) instead of which database it is. A new SQL store implements :class:`SqlDatabase`
(subclassing ``duetime.backends.sqldb.Database``) and :class:`StoreBulkRows` in its own folder;
a store of keys (Redis) implements :class:`KeyedBulkRows`.

::

    bulk job ──registry──▶ SqlDatabase      one database: its statements for a Selection, abilities
                   │         └─ StoreBulkRows     a store table's writer (COPY, INSERT … ignore)
                   │         └─ MovingBulkRows    PostgreSQL: rows moved inside the server
                   ├──────▶ KeyedBulkRows    a Redis store's writer, ledgered in its keys
                   └──────▶ NativeDelayTopology  RabbitMQ's native delays
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from duetime.message import DelayedMessage

T = TypeVar("T")
#: The tables bulk jobs keep beside the stores they read and write (and the delivery log), by
#: the name the statements use for them: a migration's runs, batches and staged rows in the
#: source database, a target's ledger, and the ids each ``bulk schedule`` job stored.
STATE_TABLES = {
    "runs": "duetime_bulk_runs",
    "batches": "duetime_bulk_batches",
    "staged": "duetime_bulk_staged",
    "ledger": "duetime_bulk_ledger",
    "scheduled": "duetime_bulk_scheduled",
    "log": "duetime_delivery_log",
}
#: A store row for a bulk write: id, destination, due (µs), headers JSON, body, failures, group.
BulkRow = tuple[Any, ...]


@dataclass(frozen=True)
class Selection:
    """Which rows of a source table a bulk job reads, as values: the database writes the
    statement (:class:`SqlDatabase`), so the bulk jobs write no SQL. Times are given as the
    table keeps them (the layout's ``due_param``)."""

    #: The due-time column.
    due: str
    #: Rows due at or after this; None: any.
    due_from: Any = None
    #: Rows due before this; None: any.
    due_before: Any = None
    #: A duetime store's rows no dispatcher holds now: never claimed, or their claim lapsed
    #: before this time; None: in flight too.
    unclaimed_at: Any = None
    #: The key column and a range of it, [lower, upper) (None: open).
    key: str = ""
    lower: Any = None
    upper: Any = None
    #: A range of the table's physical blocks instead, [first, end) (``reads_by_blocks``).
    blocks: tuple[int | None, int | None] | None = None


class StoreBulkRows(Protocol):
    """One endpoint's table of a duetime store, written a batch at a time inside the caller's
    transaction (so a bulk job's ledger row commits with the rows)."""

    #: COPYs rows straight into the table (:meth:`copy`); else only :meth:`insert_new` writes.
    copies: bool
    #: Where it copies: the database type each column of a store row is sent as in its binary
    #: COPY (:meth:`copy_encoded`).
    copy_types: tuple[str, ...]

    def copy(self, conn: Any, rows: Iterable[BulkRow]) -> int | None:
        """How many rows went in; None, none of them written, if an id was there already."""

    def copy_encoded(self, conn: Any, chunks: Iterable[bytes | memoryview]) -> int | None:
        """:meth:`copy` for rows already in the database's own binary COPY format."""

    def insert_new(self, conn: Any, rows: Sequence[BulkRow]) -> set[str]:
        """The rows whose ids the table does not hold (the first of an id given twice): the ids
        that went in."""

    def written(self, conn: Any, earliest_us: int | None, added: int) -> None:
        """In the transaction that wrote ``added`` rows: tell the store's dispatchers of the
        earliest due time, where they wait to be told."""


class MovingBulkRows(StoreBulkRows, Protocol):
    """A store table that takes rows from statements run in its own server (no round trip)."""

    def insert_selected(self, conn: Any, rows: str, params: Sequence[Any]) -> set[str]:
        """The rows the statement ``rows`` gives whose ids the table does not hold."""

    def move(self, conn: Any, taken: str, params: Sequence[Any]) -> tuple[int, int, int | None]:
        """Rows ``taken`` (a statement deleting and returning them) moved in: taken, stored,
        the earliest due (µs)."""

    def ids_present(self, conn: Any, ids: str, params: Sequence[Any]) -> list[str]:
        """Which of the ids the statement ``ids`` gives the table holds."""


class SqlDatabase(Protocol):
    """One SQL database a bulk job reads or writes (``duetime.backends.sqldb.Database``'s
    subclasses): picklable, so Spark's tasks each open their own connection."""

    @property
    def url(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def table(self) -> str | None: ...
    @property
    def schema(self) -> str | None: ...
    @property
    def display(self) -> str: ...

    row_lock: ClassVar[str]
    keeps_other_layouts: ClassVar[bool]

    def place(self) -> tuple[str, ...]:
        """Where its tables are, as the server says (two spellings of one server are one)."""

    def store_url(self, table: str | None = None) -> str:
        """The URL a duetime store for one table would be opened with."""

    def quote(self, name: str) -> str: ...
    def qualified(self, table: str) -> str: ...
    def kept_name(self, table: str) -> str: ...
    def schema_params(self) -> list[str]: ...
    def as_text(self, column: str) -> str: ...
    def store_due(self, due_us: int) -> Any: ...
    def uuid_param(self, text: str) -> Any: ...
    def block_range(self, lower: int | None, upper: int | None) -> tuple[str, list[Any]] | None: ...
    def query(self, name: str, **names: object) -> str: ...
    def store_rows(self, table: str) -> StoreBulkRows: ...
    def moving_rows(self, table: str) -> MovingBulkRows: ...

    def has_columns(self, conn: Any, table: str, columns: Sequence[str]) -> bool: ...
    def count_rows(self, conn: Any, table: str, selection: Selection) -> int: ...
    def latest_due_by(
        self, conn: Any, table: str, column: str, selection: Selection
    ) -> list[tuple[Any, Any]]: ...
    def key_bounds(
        self, conn: Any, table: str, selection: Selection, every: int
    ) -> list[tuple[Any, int, int]]: ...
    def read_rows(
        self,
        conn: Any,
        table: str,
        columns: Sequence[str],
        selection: Selection,
        *,
        size: int = 5000,
        as_stored: Collection[str] = (),
    ) -> Iterator[list[tuple[Any, ...]]]: ...
    def keys_of(self, conn: Any, table: str, selection: Selection) -> list[Any]: ...
    def rows_with_keys(
        self,
        conn: Any,
        table: str,
        columns: Sequence[str],
        selection: Selection,
        keys: Sequence[Any],
        *,
        as_stored: Collection[str] = (),
    ) -> list[tuple[Any, ...]]: ...
    def take_rows(self, conn: Any, table: str, key: str, keys: Sequence[Any]) -> int: ...
    def put_back(
        self, conn: Any, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None: ...
    def rows_in_states(self, conn: Any, run_id: str, statuses: Sequence[str]) -> int: ...
    def release_scheduled(self, conn: Any, job: str, ids: Sequence[str]) -> None: ...
    def is_store_table(self, conn: Any, table: str) -> bool: ...
    def staged_store_rows(self, source: Any) -> str: ...
    def copy_staged_out(self) -> str: ...
    def create_ledger(self, conn: Any) -> None: ...
    def ledger_entry(self, conn: Any, run_id: str, batch: int) -> tuple[int, list[str]] | None: ...
    def keep_ledger_entry(
        self, conn: Any, run_id: str, batch: int, inserted: int, conflicts: Sequence[str]
    ) -> None: ...
    def forget_ledger(self, conn: Any, run_id: str) -> None: ...
    def table_blocks(self, conn: Any, table: str) -> tuple[int, int]: ...
    def count_block_slices(
        self, conn: Any, table: str, selection: Selection, starts: Sequence[int]
    ) -> list[int]: ...

    def check_readable(self) -> None: ...
    def check_writable(self) -> bool: ...
    def reads_by_blocks(self, conn: Any) -> bool: ...
    def exact_in_server(self, conn: Any) -> bool: ...
    def record_columns(self, layout: str) -> list[str] | None: ...
    def read_records(
        self, conn: Any, table: str, layout: str, selection: Selection, size: int
    ) -> Iterator[list[tuple[Any, ...]]]: ...
    def stage_records(
        self, conn: Any, table: str, layout: str, selection: Selection, run_id: str, batch: int, endpoint: str
    ) -> int: ...
    def staged_to_check(self, conn: Any, run_id: str, batch: int) -> list[tuple[Any, ...]]: ...
    def ids_held(
        self, conn: Any, table: str, layout: str, selection: Selection, rows: MovingBulkRows
    ) -> list[str]: ...
    def move_plainly_fine(
        self,
        conn: Any,
        table: str,
        layout: str,
        selection: Selection,
        held: Sequence[str],
        rows: MovingBulkRows,
    ) -> tuple[int, int, int | None]: ...
    def records_left(
        self, conn: Any, table: str, layout: str, selection: Selection, held: Sequence[str]
    ) -> list[tuple[Any, ...]]: ...
    def take_ids(
        self, conn: Any, table: str, layout: str, selection: Selection, ids: Sequence[str]
    ) -> set[str]: ...
    def figures(
        self,
        conn: Any,
        table: str,
        layout: str,
        selection: Selection,
        now_us: int,
        horizons: Sequence[tuple[str, float | None]],
        top: int,
    ) -> list[tuple[Any, ...]]: ...
    def same_database(self, other: Any) -> bool: ...
    def pipes_from(self, other: Any) -> bool: ...
    def write_staged(self, conn: Any, rows: Sequence[Sequence[Any]]) -> None: ...
    def lock_ledger_row(self, conn: Any, run_id: str, batch: int) -> None: ...
    def claim_ids(self, conn: Any, job: str, ids: Sequence[str]) -> set[str]: ...
    def become_only_writer(self, conn: Any) -> None: ...
    def begin_writing(self, conn: Any) -> None: ...

    def connect(self, write: bool = True) -> Any: ...
    def session(self, write: bool = True) -> AbstractContextManager[Any]: ...
    def ensure_schema(self, conn: Any) -> None: ...
    def retrying(self, action: Callable[[], T], attempts: int = 8) -> T: ...
    def execute(self, conn: Any, text: str, params: Sequence[Any] = ()) -> Any: ...
    def stream(
        self, conn: Any, text: str, params: Sequence[Any] = (), size: int = 5000
    ) -> Iterator[list[tuple[Any, ...]]]: ...
    def executemany(self, conn: Any, text: str, rows: Sequence[Sequence[Any]]) -> None: ...
    def table_exists(self, conn: Any, table: str) -> bool: ...
    def tables(self, conn: Any) -> list[str]: ...
    def store_tables(self, conn: Any) -> list[str]: ...
    def chunks(self, items: Sequence[Any], size: int = 1000) -> Iterator[Sequence[Any]]: ...
    def in_list(self, count: int) -> str: ...


class KeyedBulkRows(Protocol):
    """A store of keys (Redis) written by a bulk job: each chunk of a batch once, its answer in
    a ledger beside the store's keys."""

    def prepare(self, endpoint: str) -> None:
        """What an endpoint needs before rows go in."""

    def reach(self) -> None:
        """Ask the server now: one line if it does not answer, or may evict what it keeps."""

    def answer(self, run_id: str, field: str) -> tuple[int, list[str]] | None:
        """What the ledger kept for ``field`` of the run, if it was written."""

    def keep(self, run_id: str, field: str, stored: int, held: Sequence[str]) -> None:
        """Keep a whole batch's answer."""

    def settled(self, job: str, ids: Sequence[str]) -> None:
        """``ids`` are the job's: a re-run skips them."""

    def forget(self, run_id: str) -> None:
        """Drop a run's ledger."""

    def write(
        self,
        endpoint: str,
        rows: Sequence[BulkRow],
        *,
        run_id: str = "",
        field: str = "",
        job: str = "",
        keep_held: bool = True,
    ) -> tuple[int, list[str]]:
        """``rows`` of ``endpoint``, each chunk once: how many stored, and the ids held already."""


class NativeDelayTopology(Protocol):
    """RabbitMQ's native delays, started: a bulk job publishes stored timeouts into them."""

    @property
    def longest_delay(self) -> int:
        """The longest delay its levels hold, in seconds."""

    async def verify(self) -> list[str]:
        """Problems with the topology (empty: ready)."""

    async def has_queue(self, queue: str) -> bool:
        """The destination's queue is on the broker."""

    async def send_batch(
        self, messages: Sequence[DelayedMessage], *, dispatching: bool = True
    ) -> list[Exception | None]:
        """Publish each with the delay left until its due time; a result per message."""

    async def close(self) -> None:
        """Close its connection."""
