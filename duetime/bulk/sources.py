"""Reading a database source in parallel partitions, and staging what a migration takes.

A partition (a *batch*) is one range of primary keys in one endpoint's table. Staging moves a
batch's rows from the source table into ``duetime_bulk_staged`` in one source transaction, so they
are hidden from the source's live dispatchers and are never in two places; ``complete`` and
``restore`` end a batch the same way, each in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from duetime.bulk.layouts import Layout, layout_for
from duetime.bulk.records import Destination, Record, due_us_of
from duetime.bulk_interfaces import STATE_TABLES, Selection, SqlDatabase
from duetime.errors import ConfigurationError

RUNS = STATE_TABLES["runs"]
BATCHES = STATE_TABLES["batches"]
STAGED = STATE_TABLES["staged"]


@dataclass(frozen=True)
class Batch:
    number: int
    endpoint: str
    table: str
    #: The batch is the key range [lower, upper), or on PostgreSQL the block range (bounds
    #: ``@block N``, see :func:`block_of`); None is unbounded (the first and last batch).
    lower: str | None
    upper: str | None
    planned: int


class DbSource:
    """A table layout in a database, read by key range; its state tables live beside it."""

    def __init__(
        self, db: SqlDatabase, *, in_flight: bool = False, renames: Mapping[str, str] | None = None
    ) -> None:
        self.db = db
        #: The endpoint a source table's messages are stored under, where its name does not say
        #: (TimeoutData tables replace '.' with '_': ``Shipping_Policy`` may be ``Shipping.Policy``).
        self.renames = dict(renames or {})
        self.layout: Layout = layout_for(db)
        #: Read rows a live dispatcher has claimed too (export and report; never a migration).
        self.layout.in_flight = in_flight
        self.display = db.display

    # -- reading --------------------------------------------------------------------------------

    def tables(self, endpoint: str | None) -> list[tuple[str, str]]:
        self.db.check_readable()
        with self.db.session(write=False) as conn:
            if endpoint is not None:
                table = self.layout.table_for(endpoint)
                if not self.db.table_exists(conn, table):
                    raise ConfigurationError(
                        f"{self.display} has no table {table!r} for endpoint {endpoint!r}; "
                        "check --endpoint, or name the table with ?table=…."
                    )
                found = [(endpoint, table)]  # renamed below as a found one is (it was ignored)
            else:
                found = self.layout.discover(conn)
                named = self.db.table
                if named and not self.db.table_exists(conn, named):
                    raise ConfigurationError(f"{self.display} has no table {named!r}; check ?table=….")
        if not found:
            raise ConfigurationError(
                f"{self.display} holds no {self.layout.name} tables; name one with --endpoint or ?table=…."
            )
        unknown = sorted(set(self.renames) - {name for name, _ in found})
        if unknown:
            raise ConfigurationError(
                f"--rename names {unknown}, but the source's endpoints are {sorted(n for n, _ in found)}; "
                "write --rename FOUND=REAL with a name from that list."
            )
        return [(self.renames.get(name, name), table) for name, table in found]

    def destinations(
        self, tables: Sequence[tuple[str, str]], cutoff_us: int | None, now_us: int
    ) -> list[Destination]:
        """Each endpoint's destinations among the selected rows, with the latest due time."""
        chosen = self.layout.selection(cutoff_us, now_us)
        found: list[Destination] = []
        with self.db.session(write=False) as conn:
            for endpoint, table in tables:
                rows = self.db.latest_due_by(conn, table, self.layout.columns[1], chosen)
                found += [Destination(endpoint, r[0], due_us_of(r[1])) for r in rows]
        return found

    def plan(self, endpoint: str | None, cutoff_us: int | None, now_us: int, batch_rows: int) -> list[Batch]:
        """Split the selected rows into batches of about ``batch_rows``, counting each."""
        batches: list[Batch] = []
        tables = self.tables(endpoint)
        with self.db.session() as conn:
            by_blocks = self.db.reads_by_blocks(conn)
            for name, table in tables:
                chosen = self.layout.selection(cutoff_us, now_us)
                if by_blocks:
                    batches += self._plan_blocks(conn, name, table, chosen, batch_rows, len(batches))
                    continue
                rows = self.db.key_bounds(conn, table, chosen, batch_rows)
                if not rows:
                    batches.append(Batch(len(batches), name, table, None, None, 0))
                    continue
                total = int(rows[0][2])
                bounds = [str(r[0]) for r in rows]
                for i, lower in enumerate(bounds):
                    upper = bounds[i + 1] if i + 1 < len(bounds) else None
                    planned = batch_rows if upper is not None else total - batch_rows * i
                    batches.append(
                        Batch(len(batches), name, table, None if i == 0 else lower, upper, planned)
                    )
        return batches

    def _plan_blocks(
        self, conn: Any, name: str, table: str, chosen: Selection, batch_rows: int, first: int
    ) -> list[Batch]:
        """PostgreSQL: batches as ranges of the table's blocks, about ``batch_rows`` rows each.

        Rows sit in the heap in the order they were written, not in key order: a key range of
        random ids (NServiceBus's uuids) touches nearly every block, so each batch read and dirtied
        most of the table (a 100,000-row batch of 1,000,000: 42,448 of 47,620 blocks, 855 ms for
        its delete, against 4,762 blocks and 118 ms for a block range). A block range is read by a
        TID range scan and each block is written once in the whole run. A row moved to another
        block while the run goes on (an UPDATE) is left for the next run, like a new row.

        The rows are counted in slices of the table's blocks (:func:`block_slices`), each by its
        own TID range scan, all in one round trip: one pass that never turns a row's address
        into text (grouping rows by their block number that way took 0.34-0.9 s per million
        rows; counting the slices 0.2 s). A batch starts at the slice where the rows before it
        reach the next multiple of ``batch_rows``, so a batch is ``batch_rows`` give or take a
        slice (exact to the block when the table has few blocks)."""
        blocks, tuples = self.db.table_blocks(conn, table)
        starts = block_slices(blocks, tuples, batch_rows)
        batches: list[list[int]] = []  # [first block, rows, rows before it // batch_rows]
        before = 0
        for start, n in zip(starts, self.db.count_block_slices(conn, table, chosen, starts), strict=True):
            if n and (not batches or before // batch_rows != batches[-1][2]):
                batches.append([start, 0, before // batch_rows])
            if n:
                batches[-1][1] += n
                before += n
        if not batches:
            return [Batch(first, name, table, None, None, 0)]
        bounds = [f"{BLOCK}{b[0]}" for b in batches]
        return [
            Batch(
                first + i,
                name,
                table,
                None if i == 0 else bounds[i],
                bounds[i + 1] if i + 1 < len(bounds) else None,
                rows,
            )
            for i, (_, rows, _) in enumerate(batches)
        ]

    def bucket(self, batch: Batch, cutoff_us: int | None, now_us: int) -> Selection:
        """The batch's rows: a range of blocks (a plan by blocks) or of keys."""
        chosen = self.layout.selection(cutoff_us, now_us)
        lower, upper = block_of(batch.lower), block_of(batch.upper)
        if lower is not None or upper is not None:
            return replace(chosen, blocks=(lower, upper))
        return replace(chosen, lower=batch.lower, upper=batch.upper)

    def read(self, batch: Batch, cutoff_us: int | None, now_us: int) -> Iterator[Record]:
        """The batch's rows, untouched (preview, export, report)."""
        chosen = self.bucket(batch, cutoff_us, now_us)
        with self.db.session(write=False) as conn:
            lay = self.layout
            for rows in self.db.read_rows(conn, batch.table, lay.columns, chosen, as_stored=lay.as_stored):
                for row in rows:
                    yield self.layout.to_record(batch.endpoint, row)

    @property
    def computes_records(self) -> bool:
        """The source's server can compute this layout's records (it may still not be exact:
        :meth:`server_records`)."""
        return self.db.record_columns(self.layout.name) is not None

    def server_records(self, conn: Any) -> bool:
        """This server computes the layout's records exactly, so they need not come through
        Python (PostgreSQL 14 or later: ``extract(epoch …)`` is numeric there; before, double
        precision, which can miss a microsecond of a due time in this century)."""
        return self.computes_records and self.db.exact_in_server(conn)

    def read_batches(self, batch: Batch, cutoff_us: int | None, now_us: int) -> Iterator[Any]:
        """The batch's rows, untouched and unchecked, as Arrow record batches (export). On
        PostgreSQL 14 or later (``extract`` exact to the microsecond) the server computes each
        record column and the rows go straight into Arrow; elsewhere, and for layouts only Python
        can convert, from :meth:`read`'s records."""
        from duetime.bulk.frames import CHUNK_ROWS, arrow_chunks, unchecked_batch

        if self.computes_records:
            chosen = self.bucket(batch, cutoff_us, now_us)
            with self.db.session(write=False) as conn:
                if self.server_records(conn):
                    read = self.db.read_records(conn, batch.table, self.layout.name, chosen, CHUNK_ROWS)
                    for rows in read:
                        yield unchecked_batch(batch.endpoint, rows)
                    return
        yield from arrow_chunks((r, None) for r in self.read(batch, cutoff_us, now_us))

    # -- migration state ------------------------------------------------------------------------

    def ensure_state_tables(self) -> None:
        d = self.db
        with d.session() as conn:
            d.ensure_schema(conn)
            for name in ("create_runs", "create_batches", "create_staged"):
                d.execute(conn, d.query(name))
            if d.execute(conn, d.query("staged_index_exists"), d.schema_params()).fetchone() is None:
                d.execute(conn, d.query("create_staged_index"))

    def stage(self, run_id: str, batch: Batch, cutoff_us: int | None, now_us: int) -> int:
        return self.db.retrying(lambda: self._stage(run_id, batch, cutoff_us, now_us))

    def _stage(self, run_id: str, batch: Batch, cutoff_us: int | None, now_us: int) -> int:
        """Move the batch's rows into the staging table; mark it staged. One transaction."""
        d, lay = self.db, self.layout
        chosen = self.bucket(batch, cutoff_us, now_us)
        with d.session() as conn:
            if not self.claim_status(conn, run_id, batch.number, "pending"):
                return -1  # someone else took it: the caller reads the state again
            if self.server_records(conn):  # one statement, the rows never leaving the server
                staged = d.stage_records(
                    conn, batch.table, lay.name, chosen, run_id, batch.number, batch.endpoint
                )
                self._set_staged(conn, run_id, batch.number, staged)
                return staged
            # Keys first, then the rows a chunk of keys at a time: a batch of any size is staged
            # in bounded memory. MariaDB locks by primary key only (a locking scan of the whole
            # table deadlocks with its twins); SQLite's BEGIN IMMEDIATE already excludes writers.
            keys = d.keys_of(conn, batch.table, chosen)
            staged = removed = 0
            for chunk in d.chunks(keys, 1000):
                rows = d.rows_with_keys(
                    conn, batch.table, lay.columns, chosen, chunk, as_stored=lay.as_stored
                )
                records = [lay.to_record(batch.endpoint, r) for r in rows]
                self._insert_staged(conn, run_id, batch.number, records)
                removed += d.take_rows(conn, batch.table, lay.key, [lay.to_row(r)[0] for r in records])
                staged += len(records)
            if removed != staged:
                raise RuntimeError(
                    f"batch {batch.number}: staged {staged} rows but removed {removed}; rolled back"
                )
            self._set_staged(conn, run_id, batch.number, staged)
            return staged

    def _insert_staged(self, conn: Any, run_id: str, batch: int, records: Sequence[Record]) -> None:
        self.db.write_staged(conn, [(run_id, batch, *r) for r in records])

    def staged_count(self, run_id: str, batch: int) -> int:
        with self.db.session(write=False) as conn:
            return int(self.db.execute(conn, self.db.query("staged_count"), [run_id, batch]).fetchone()[0])

    def iter_staged(self, conn: Any, run_id: str, batch: int, *, bodies: bool = True) -> Iterator[Record]:
        """The batch's staged records, streamed in bounded chunks on ``conn``."""
        name = "staged_rows" if bodies else "staged_rows_without_bodies"
        for rows in self.db.stream(conn, self.db.query(name), [run_id, batch]):
            for r in rows:
                yield Record(r[0], r[1], r[2], r[3], r[4], bytes(r[5] or b""), int(r[6]), r[7])

    def staged_to_check(self, run_id: str, batch: int) -> list[Record]:
        """The batch's staged records (without bodies) the server cannot vouch for (where it
        computes records); the rest need no look from Python."""
        with self.db.session(write=False) as conn:
            rows = self.db.staged_to_check(conn, run_id, batch)
        return [Record(r[0], r[1], r[2], r[3], r[4], b"", int(r[6]), r[7]) for r in rows]

    def staged_per_endpoint(
        self, run_id: str, batch: int, leave_out: Sequence[str]
    ) -> dict[str, tuple[int, int | None]]:
        """Per endpoint, how many of the batch's staged rows (but ``leave_out``) and the earliest due."""
        with self.db.session(write=False) as conn:
            rows = self.db.execute(
                conn, self.db.query("staged_per_endpoint"), [run_id, batch, list(leave_out)]
            )
            return {r[0]: (int(r[1]), None if r[2] is None else int(r[2])) for r in rows.fetchall()}

    def staged(self, run_id: str, batch: int, *, bodies: bool = True) -> list[Record]:
        """The batch's staged records; without ``bodies`` (enough to validate) they read as b""."""
        name = "staged_rows" if bodies else "staged_rows_without_bodies"
        with self.db.session(write=False) as conn:
            rows = self.db.execute(conn, self.db.query(name), [run_id, batch]).fetchall()
        return [Record(r[0], r[1], r[2], r[3], r[4], bytes(r[5] or b""), int(r[6]), r[7]) for r in rows]

    def complete(self, run_id: str, batch: Batch, put_back: Sequence[str], inserted: int, note: str) -> None:
        return self.db.retrying(lambda: self._complete(run_id, batch, put_back, inserted, note))

    def _complete(self, run_id: str, batch: Batch, put_back: Sequence[str], inserted: int, note: str) -> None:
        """Return the rows the target did not take to the source, drop the rest; mark completed."""
        with self.db.session() as conn:
            if not self.claim_status(conn, run_id, batch.number, "staged"):
                return
            back = self._put_back(conn, run_id, batch, set(put_back))
            self.db.execute(conn, self.db.query("delete_staged"), [run_id, batch.number])
            self.db.execute(
                conn, self.db.query("set_batch_completed"), [inserted, back, note, run_id, batch.number]
            )

    def restore(self, run_id: str, batch: Batch) -> int:
        return self.db.retrying(lambda: self._restore(run_id, batch))

    def _restore(self, run_id: str, batch: Batch) -> int:
        """Abort: every staged row of the batch goes back to its table. One transaction."""
        with self.db.session() as conn:
            if not self.claim_status(conn, run_id, batch.number, "staged"):
                return 0
            back = self._put_back(conn, run_id, batch, None)
            self.db.execute(conn, self.db.query("delete_staged"), [run_id, batch.number])
            self.db.execute(conn, self.db.query("set_batch_aborted"), [back, run_id, batch.number])
            return back

    def _put_back(self, conn: Any, run_id: str, batch: Batch, only: set[str] | None) -> int:
        if only is not None and not only:
            return 0
        records = [
            r for r in self._staged_in(conn, run_id, batch.number) if only is None or r.message_id in only
        ]
        self.db.put_back(conn, batch.table, self.layout.columns, [self.layout.to_row(r) for r in records])
        return len(records)

    def _staged_in(self, conn: Any, run_id: str, batch: int) -> list[Record]:
        rows = self.db.execute(conn, self.db.query("staged_rows"), [run_id, batch]).fetchall()
        return [Record(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), int(r[6]), r[7]) for r in rows]

    def claim_status(self, conn: Any, run_id: str, batch: int, expected: str) -> bool:
        row = self.db.execute(conn, self.db.query("batch_status"), [run_id, batch]).fetchone()
        return row is not None and row[0] == expected

    def _set_staged(self, conn: Any, run_id: str, batch: int, staged: int) -> None:
        self.db.execute(conn, self.db.query("set_batch_staged"), [staged, run_id, batch])

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        with self.db.session(write=False) as conn:
            cur = self.db.execute(conn, self.db.query("batches_of_run"), [run_id])
            names = [c[0] for c in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def remaining(self, endpoints: Sequence[tuple[str, str]], cutoff_us: int | None, now_us: int) -> int:
        """Selected rows still in the source tables (in flight, or stored during the run)."""
        in_flight, self.layout.in_flight = self.layout.in_flight, True
        try:
            chosen = self.layout.selection(cutoff_us, now_us)
        finally:
            self.layout.in_flight = in_flight
        with self.db.session(write=False) as conn:
            return sum(self.db.count_rows(conn, table, chosen) for _, table in endpoints)


def left_before(source: DbSource, endpoints: Sequence[tuple[str, str]], before_us: int) -> int:
    """Rows of the source tables due before ``before_us``: what a cutoff leaves where it is."""
    layout = source.layout
    chosen = Selection(layout.due, due_before=layout.due_param(before_us))
    with source.db.session(write=False) as conn:
        return sum(source.db.count_rows(conn, table, chosen) for _, table in endpoints)


#: How a block bound is written in the batches table (a run planned by key ranges, before block
#: ranges, resumes by its key ranges).
BLOCK = "@block "


#: Slices of a table's blocks a plan counts at least, and per batch it expects (when the table
#: has more blocks): a batch is then ``batch_rows`` give or take a slice, about 1 % of it
#: (1,000,000 rows in batches of 100,000: 99,584-100,605), counted in 0.19 s.
MIN_SLICES, SLICES_PER_BATCH, MAX_SLICES = 1024, 64, 16_384


def block_slices(blocks: int, tuples: int, batch_rows: int) -> list[int]:
    """The first block of each slice a plan counts: every block when the table has few, else
    evenly spaced, more of them the more batches the statistics expect (``tuples`` is -1 or 0
    before the first ANALYZE)."""
    expected = max(1, -(-max(tuples, 0) // batch_rows))
    slices = max(1, min(blocks, max(MIN_SLICES, SLICES_PER_BATCH * expected), MAX_SLICES))
    return sorted({blocks * i // slices for i in range(slices)})


def block_of(bound: str | None) -> int | None:
    """The block number of a block bound; None for a key bound or no bound."""
    if bound is None or not bound.startswith(BLOCK) or not bound[len(BLOCK) :].isdigit():
        return None
    return int(bound[len(BLOCK) :])


def batch_of(row: dict[str, Any]) -> Batch:
    return Batch(
        int(row["batch"]),
        row["endpoint"],
        row["source_table"],
        row["lower_key"],
        row["upper_key"],
        int(row["planned"]),
    )


def spec_json(**spec: Any) -> str:
    return json.dumps(spec, sort_keys=True, default=str)
