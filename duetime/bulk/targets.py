"""Where bulk jobs write: a duetime store (SQLite, PostgreSQL, MariaDB, Redis), Parquet / JSON
Lines files, or RabbitMQ's native delays.

Every write of a batch is idempotent and leaves a ledger entry in the same commit (a row in the
target database; on Redis, each part of a batch with its own), so a re-run never writes a batch
twice, even when the target's own dispatcher has meanwhile delivered and removed its messages.
The rows go into a store only through its bulk writer (:mod:`duetime.bulk_interfaces`).
Files are written by Spark for the whole cluster (:mod:`duetime.bulk.filetarget`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from duetime.bulk.arrowrows import store_rows
from duetime.bulk.copybinary import HEADER, TRAILER, copy_rows
from duetime.bulk.filetarget import FileTarget
from duetime.bulk.frames import CHUNK_ROWS, chunked
from duetime.bulk.layouts import DuetimeLayout
from duetime.bulk.records import Destination, Record, bulk_row
from duetime.bulk.sealing import seal_record, sealed_records, task_sealer
from duetime.bulk_interfaces import KeyedBulkRows, MovingBulkRows, NativeDelayTopology, SqlDatabase
from duetime.encryption import Sealer, sealer_from_environment
from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact, split_options
from duetime.registry import (
    is_keyed_store,
    is_sql_database,
    open_keyed_bulk_rows,
    open_native_delays,
    open_sql_database,
)


class _IdTaken(Exception):
    """An id a piped batch carried is in the store already."""


@dataclass(frozen=True)
class Written:
    """What one batch write did: how many rows went in, and which ids the target already held."""

    inserted: int
    conflicts: tuple[str, ...] = ()


class Target(Protocol):
    """A place records can be written to in idempotent, ledgered batches."""

    display: str

    def prepare(self, endpoints: Sequence[str]) -> None:
        """Create what the endpoints need (tables, folders); run once, on the driver."""

    def ledger(self, run_id: str, batch: int) -> Written | None:
        """What an earlier write of this batch did, or None if it never committed."""

    def write(self, run_id: str, batch: int, records: Iterable[Record]) -> Written:
        """Write valid records; ids already present are conflicts, not overwritten."""

    def forget(self, run_id: str) -> None:
        """Drop the ledger of a run (after it completed or was aborted)."""

    def problems(self, destinations: Sequence[Destination], now_us: int) -> list[str]:
        """What would make this target refuse some of the messages, per endpoint and destination;
        a migration with any does not start (the preview lists them)."""


class _TakesAll:
    """A target that can hold any valid message (stores and files)."""

    def problems(self, destinations: Sequence[Destination], now_us: int) -> list[str]:
        return []


class _Seals:
    """A duetime store target: with a keyring, every row is sealed before it is written (the
    store's own rule for every way in: :mod:`duetime.bulk.sealing`)."""

    #: This process's keyring's sealer (``DUETIME_ENCRYPTION_KEYS``), or None: rows go as they are.
    sealer: Sealer | None

    @property
    def sealed_with(self) -> str | None:
        """The primary key id rows are sealed with, None when they are written as they are."""
        return None if self.sealer is None else self.sealer.keyring.primary

    def __getstate__(self) -> dict[str, Any]:
        """Sent to Spark's tasks with the key id it seals with, never the keys: each task seals
        with its own keyring, which must hold that key (:meth:`expect_key`)."""
        state = dict(self.__dict__)
        state["sealer"] = self.sealed_with
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.expect_key(state["sealer"])

    def expect_key(self, expected: str | None) -> None:
        """In a Spark task: seal with the driver's keyring (``expected``: its primary key id), or
        stop before a row is written (:func:`task_sealer`)."""
        self.sealer = task_sealer(expected)

    def sealed(self, records: Sequence[Record] | Any) -> Sequence[Record] | Any:
        """The rows as they are written: sealed records with a keyring, else as given."""
        return records if self.sealer is None else sealed_records(self.sealer, records)


class StoreTarget(_TakesAll, _Seals):
    """A duetime store in a SQL database, written through the store's bulk writer
    (:class:`~duetime.bulk_interfaces.StoreBulkRows`: COPY where the store copies, multi-row
    inserts elsewhere), each batch in one transaction with its ledger row."""

    def __init__(self, db: SqlDatabase) -> None:
        if db.layout != "duetime":
            raise ConfigurationError(
                f"{db.display}: bulk jobs write duetime stores only; drop layout={db.layout}."
            )
        self.db = db
        self.layout = DuetimeLayout(db)
        self.display = db.display
        #: COPY straight into the store table (where it copies) until an id is found there already.
        self._straight = True
        self.sealer = sealer_from_environment(now=True)

    def prepare(self, endpoints: Sequence[str]) -> None:
        from duetime.registry import open_sync_store

        for endpoint in sorted(set(endpoints)):
            store = open_sync_store(self.db.store_url(self.db.table))
            try:
                store.setup_infrastructure(endpoint)
            finally:
                store.close()
        for endpoint in sorted(set(endpoints)):
            self._check_table(self.layout.table_for(endpoint))
        # Created here, on the driver, before any task starts: tasks creating them at once race in
        # PostgreSQL's catalog (a unique violation on pg_type) even with IF NOT EXISTS.
        with self.db.session() as conn:
            self.db.create_ledger(conn)
            self.db.execute(conn, self.db.query("create_scheduled"))

    def _check_table(self, table: str) -> None:
        with self.db.session() as conn:
            ours = self.db.is_store_table(conn, table)
        if not ours:
            raise ConfigurationError(
                f"Table {table!r} in {self.display} exists but is not a duetime store (a legacy table of "
                "the same name?); give the target another table with ?table=…."
            )

    def ledger(self, run_id: str, batch: int) -> Written | None:
        with self.db.session(write=False) as conn:
            return self._ledger(conn, run_id, batch)

    def _ledger(self, conn: Any, run_id: str, batch: int) -> Written | None:
        found = self.db.ledger_entry(conn, run_id, batch)
        return None if found is None else Written(found[0], tuple(found[1]))

    def write(self, run_id: str, batch: int, records: Iterable[Record]) -> Written:
        """One transaction, fed in bounded chunks. Records streamed from elsewhere cannot be read
        twice, so a deadlock (MariaDB) retries only a list."""
        if isinstance(records, Sequence):
            rows = records
            return self.db.retrying(lambda: self._write(run_id, batch, chunked(rows, CHUNK_ROWS)))
        return self._write(run_id, batch, chunked(records, CHUNK_ROWS))

    def write_batches(self, run_id: str, batch: int, batches: Iterable[Any]) -> Written:
        """:meth:`write` for a record frame's Arrow batches of valid rows, never a :class:`Record`
        per row: PostgreSQL COPYs them as Arrow encodes them (:func:`copy_rows`), SQLite and
        MariaDB insert the rows zipped from their columns (:func:`store_rows`)."""
        return self._write(run_id, batch, batches)

    def _write(self, run_id: str, batch: int, chunks: Iterable[list[Record] | Any]) -> Written:
        """Chunks of records, or Arrow batches of them, in one transaction with the ledger row."""
        with self.db.session() as conn:
            self.db.lock_ledger_row(conn, run_id, batch)
            done = self._ledger(conn, run_id, batch)
            if done is not None:
                return done
            conflicts: list[str] = []
            inserted = 0
            earliest: dict[str, int | None] = {}
            added: dict[str, int] = {}
            for chunk in chunks:
                for table, rows, first_us in self._by_table(self.sealed(chunk)):
                    got, clash = self.insert_rows(conn, table, rows)
                    inserted += got
                    added[table] = added.get(table, 0) + got
                    conflicts += clash
                    earliest[table] = _earliest(earliest.get(table), first_us)
            written = Written(inserted, tuple(conflicts))
            self.db.keep_ledger_entry(conn, run_id, batch, inserted, conflicts)
            self.written(conn, earliest, added)
            return written

    def shares_database(self, other: SqlDatabase) -> bool:
        """Both in one database as one user, where its server moves rows between tables, so the
        source's connection can copy staged rows inside the server (never with a keyring: each
        row is sealed in Python)."""
        return self.sealer is None and self.db.same_database(other)

    def moving_rows(self, table: str) -> MovingBulkRows:
        """The store's writer for one endpoint's ``table`` that takes rows from statements run
        in its server (only where :meth:`shares_database` or :meth:`pipes_from` said so)."""
        return self.db.moving_rows(table)

    def write_from_staging(
        self, run_id: str, batch: int, source: SqlDatabase, records: Sequence[Record], skip: set[str]
    ) -> Written:
        """Like :meth:`write`, reading the rows from the source's staging table in the same database."""
        return self.db.retrying(lambda: self._write_from_staging(run_id, batch, source, records, skip))

    def _write_from_staging(
        self, run_id: str, batch: int, source: SqlDatabase, records: Sequence[Record], skip: set[str]
    ) -> Written:
        staged_rows = self.db.staged_store_rows(source)
        with self.db.session() as conn:
            done = self._ledger(conn, run_id, batch)
            if done is not None:
                return done
            by_table: dict[str, list[Record]] = {}
            for record in records:
                if record.message_id not in skip:
                    by_table.setdefault(self.layout.table_for(record.endpoint), []).append(record)
            new: set[str] = set()
            added: dict[str, int] = {}
            earliest: dict[str, int | None] = {}
            for table, rows in by_table.items():
                ids = self.moving_rows(table).insert_selected(
                    conn, staged_rows, [run_id, batch, rows[0].endpoint, list(skip)]
                )
                new |= ids
                added[table] = len(ids)
                earliest[table] = min((r.due_us for r in rows if r.due_us is not None), default=None)
            wanted = [r.message_id for rows in by_table.values() for r in rows]
            written = Written(len(new), tuple(_not_written(wanted, new)))
            self.db.keep_ledger_entry(conn, run_id, batch, written.inserted, written.conflicts)
            self.written(conn, earliest, added)
            return written

    def pipes_from(self, source: SqlDatabase) -> bool:
        """Staged rows can stream from the source server's COPY into this one's without being
        decoded here (two PostgreSQL databases), while no id of this task has clashed (never
        with a keyring: each row is sealed in Python)."""
        return self.sealer is None and self._straight and self.db.pipes_from(source)

    def write_piped(
        self,
        run_id: str,
        batch: int,
        source: SqlDatabase,
        endpoints: Mapping[str, tuple[int, int | None]],
        skip: set[str],
    ) -> Written | None:
        """Like :meth:`write_from_staging`, from the staging table of another PostgreSQL database:
        the rows pass from the source's COPY to this one's in binary, chunk by chunk (bounded
        memory, no Python work per row: the one process's decode-check-encode is what held a
        cross-database move to one core). ``endpoints``: how many rows each endpoint's table
        gets and the earliest due; ``skip``: ids left out (their problems). None, with nothing
        written, if an id is in the store already: the caller then writes through Python, which
        tells conflicts apart."""
        try:
            return self.db.retrying(lambda: self._write_piped(run_id, batch, source, endpoints, skip))
        except _IdTaken:
            self._straight = False
            return None

    def _write_piped(
        self,
        run_id: str,
        batch: int,
        source: SqlDatabase,
        endpoints: Mapping[str, tuple[int, int | None]],
        skip: set[str],
    ) -> Written:
        # {staged}: the source's own staging table
        out = source.copy_staged_out()
        with self.db.session() as conn:
            done = self._ledger(conn, run_id, batch)
            if done is not None:
                return done
            added: dict[str, int] = {}
            earliest: dict[str, int | None] = {}
            with source.session(write=False) as reading:
                for endpoint, (count, first_us) in endpoints.items():
                    table = self.layout.table_for(endpoint)
                    with (
                        reading.cursor() as src,
                        src.copy(out, [run_id, batch, endpoint, list(skip)]) as rows_out,
                    ):
                        copied = self.moving_rows(table).copy_encoded(conn, rows_out)
                    if copied is None:
                        raise _IdTaken()  # the session rolls back every table's rows
                    if copied != count:
                        raise RuntimeError(f"batch {batch}: {copied} rows piped into {table}, {count} staged")
                    added[table] = count
                    earliest[table] = first_us
            written = Written(sum(added.values()))
            self.db.keep_ledger_entry(conn, run_id, batch, written.inserted, [])
            self.written(conn, earliest, added)
            return written

    def _by_table(self, chunk: list[Record] | Any) -> list[tuple[str, list[Record] | Any, int | None]]:
        """A chunk's rows by store table (a table may take several endpoints' rows), each part
        with its earliest due time (µs)."""
        if isinstance(chunk, list):
            by_table: dict[str, list[Record]] = {}
            for record in chunk:
                by_table.setdefault(self.layout.table_for(record.endpoint), []).append(record)
            return [
                (table, rows, min((r.due_us for r in rows if r.due_us is not None), default=None))
                for table, rows in by_table.items()
            ]
        import pyarrow.compute as pc

        parts = []
        for endpoint in pc.unique(chunk.column("endpoint")).to_pylist():
            rows = chunk.filter(pc.equal(chunk.column("endpoint"), endpoint))
            parts.append((self.layout.table_for(endpoint), rows, pc.min(rows.column("due_us")).as_py()))
        return parts

    def insert_rows(self, conn: Any, table: str, rows: Sequence[Record] | Any) -> tuple[int, list[str]]:
        """Rows (records, or an Arrow batch of them) into ``table`` through the store's bulk
        writer: how many went in, and the ids that were there already (or given twice: the
        first wins). A store that copies COPYs them straight in; an id already in the table
        makes this task insert from then on (which tells them apart)."""
        writer = self.db.store_rows(table)
        arrow = not isinstance(rows, Sequence)
        if writer.copies and self._straight:
            copied = (
                writer.copy_encoded(conn, [HEADER, copy_rows(rows, writer.copy_types), TRAILER])
                if arrow
                else writer.copy(conn, [bulk_row(r) for r in rows])
            )
            if copied is not None:
                return copied, []
            self._straight = False  # ids clash here: the rest of this task sorts them out
        given = store_rows(rows) if arrow else [bulk_row(r) for r in rows]
        new = writer.insert_new(conn, given)
        return len(new), _not_written([r[0] for r in given], new)

    def written(self, conn: Any, earliest: Mapping[str, int | None], added: Mapping[str, int]) -> None:
        """In the transaction that wrote ``added`` rows per table, the earliest due (µs) of each,
        told to the store (PostgreSQL wakes its dispatchers and refreshes a filled table's
        statistics; SQLite's and MariaDB's dispatchers notice new rows themselves)."""
        for table, count in added.items():
            self.db.store_rows(table).written(conn, earliest.get(table), count)

    def write_once(self, job: str, records: Sequence[Record], *, keep_held: bool = True) -> Written:
        return self.db.retrying(lambda: self._write_once(job, records, keep_held))

    def _write_once(self, job: str, records: Sequence[Record], keep_held: bool) -> Written:
        """Store each id at most once per job, ever: ids the job stored before (even ones since
        delivered and removed) are skipped. The ids and the messages commit together. An id the
        store holds already is the job's too, unless not ``keep_held``: then the caller replaces
        it and says so after (:meth:`settled`), so a crash in between replaces it on a re-run."""
        with self.db.session() as conn:
            d = self.db
            d.become_only_writer(conn)  # the ids are looked up, then inserted
            given = list({r.message_id: r for r in records}.values())
            claimed = d.claim_ids(conn, job, [r.message_id for r in given])
            unique: Sequence[Record] = self.sealed([r for r in given if r.message_id in claimed])
            by_table: dict[str, list[Record]] = {}
            for record in unique:
                by_table.setdefault(self.layout.table_for(record.endpoint), []).append(record)
            inserted, conflicts = 0, []
            added: dict[str, int] = {}
            earliest: dict[str, int | None] = {}
            for table, rows_ in by_table.items():
                got, clash = self.insert_rows(conn, table, rows_)
                inserted += got
                added[table] = got
                conflicts += clash
                earliest[table] = min((r.due_us for r in rows_ if r.due_us is not None), default=None)
            if not keep_held:
                d.release_scheduled(conn, job, conflicts)
            self.written(conn, earliest, added)
            return Written(inserted, tuple(conflicts))

    def settled(self, job: str, ids: Sequence[str]) -> None:
        """``ids`` (found waiting by :meth:`write_once`) are the job's now: a re-run skips them."""
        with self.db.session() as conn:
            self.db.become_only_writer(conn)
            self.db.claim_ids(conn, job, ids)

    def forget(self, run_id: str) -> None:
        with self.db.session() as conn:
            self.db.forget_ledger(conn, run_id)


class RedisStoreTarget(_TakesAll, _Seals):
    """A duetime store of keys (Redis: ``redis://…``, ``redis+sentinel://…``), written through its
    bulk writer (:class:`~duetime.bulk_interfaces.KeyedBulkRows`): each chunk of a batch once,
    its answer in the run's ledger beside the store's keys, so a re-run never writes a batch
    twice."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.display = redact(url)
        self._rows = open_keyed_bulk_rows(url)  # checks the URL; connects when first used
        self.sealer = sealer_from_environment(now=True)

    def __getstate__(self) -> dict[str, Any]:
        """Sent to Spark's tasks as its URL and the key id it seals with: each task connects on
        its own, and seals with its own keyring."""
        return {"url": self.url, "sealer": self.sealed_with}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"])  # type: ignore[misc]
        self.expect_key(state["sealer"])

    def _writer(self) -> KeyedBulkRows:
        return self._rows

    def prepare(self, endpoints: Sequence[str]) -> None:
        for endpoint in sorted(set(endpoints)):
            self._rows.prepare(endpoint)

    def ledger(self, run_id: str, batch: int) -> Written | None:
        found = self._writer().answer(run_id, str(batch))
        return None if found is None else Written(found[0], tuple(found[1]))

    def write(self, run_id: str, batch: int, records: Iterable[Record]) -> Written:
        """Each endpoint's rows of the batch in chunks, each once (``batch.endpoint.chunk`` in the
        ledger); then the batch's whole answer, which a re-run reads instead.

        A chunk is known by its number, so a re-run must cut the batch into the same chunks:
        the rows go in order of their ids, not as they came (a migration's staged rows come
        back in any order; a chunk found done would otherwise skip rows never written)."""
        done = self.ledger(run_id, batch)
        if done is not None:
            return done
        by_endpoint: dict[str, list[tuple[Any, ...]]] = {}
        for record in records:
            if self.sealer is not None:
                record = seal_record(self.sealer, record)
            by_endpoint.setdefault(record.endpoint, []).append(bulk_row(record))
        stored, held = 0, []
        for endpoint, rows in sorted(by_endpoint.items()):
            rows.sort(key=lambda row: row[0])  # stable: of an id given twice, the first still wins
            got, there = self._writer().write(endpoint, rows, run_id=run_id, field=f"{batch}.{endpoint}")
            stored += got
            held += there
        self._writer().keep(run_id, str(batch), stored, held)
        return Written(stored, tuple(held))

    def write_once(self, job: str, records: Sequence[Record], *, keep_held: bool = True) -> Written:
        """Each id at most once per job, ever (the job's set of ids beside the store's keys); an
        id the store holds is the job's too unless not ``keep_held`` (as :class:`StoreTarget`)."""
        by_endpoint: dict[str, list[tuple[Any, ...]]] = {}
        for record in self.sealed(list({r.message_id: r for r in records}.values())):
            by_endpoint.setdefault(record.endpoint, []).append(bulk_row(record))
        stored, held = 0, []
        for endpoint, rows in by_endpoint.items():
            got, there = self._writer().write(endpoint, rows, job=job, keep_held=keep_held)
            stored += got
            held += there
        return Written(stored, tuple(held))

    def settled(self, job: str, ids: Sequence[str]) -> None:
        """As :meth:`StoreTarget.settled`."""
        self._writer().settled(job, ids)

    def forget(self, run_id: str) -> None:
        self._writer().forget(run_id)

    def reach(self) -> None:
        """Ask the server now (before Spark starts): one line if it does not answer, or if it
        may evict what the store keeps."""
        self._rows.reach()


class NativeDelayTarget:
    """RabbitMQ's native delay topology (``amqp://…?native=duetime``): each record is published
    with the delay left until its due time, rounded up to the second. A broker cannot share a
    transaction, so this target is at-least-once: the ledger (a SQLite file, ``&ledger=path``) is
    written after the broker confirmed the batch, and a crash in between publishes it again."""

    def __init__(self, url: str) -> None:
        self.amqp, options = split_options(url, ("native", "ledger", "levels"))
        self.names = options.get("native", "duetime")
        self.levels = int(options.get("levels", "28"))
        self.ledger_path = Path(options.get("ledger", "duetime-native-ledger.db"))
        #: The ledger: a SQLite file's ledger table, as a store target keeps its own.
        self.ledger_db = open_sql_database("sqlite:///" + quote(str(self.ledger_path)))
        self.display = f"RabbitMQ native delays ({self.names}) at {redact(self.amqp)}"

    def prepare(self, endpoints: Sequence[str]) -> None:
        import asyncio

        async def check() -> None:
            native = await self._open()
            try:
                problems = await native.verify()
                if problems:
                    raise ConfigurationError("The native delay topology is not ready: " + "; ".join(problems))
            finally:
                await native.close()

        asyncio.run(check())
        with self.ledger_db.session() as conn:
            self.ledger_db.create_ledger(conn)

    async def _open(self) -> NativeDelayTopology:
        return await open_native_delays(self.amqp, self.names, levels=self.levels)

    def problems(self, destinations: Sequence[Destination], now_us: int) -> list[str]:
        """The timeout migration tool's checks (T4): every destination has a queue, and no delay
        is longer than the levels hold."""
        import asyncio

        async def check() -> list[str]:
            native = await self._open()
            limit = native.longest_delay
            found: list[str] = []
            try:
                queues: dict[str, bool] = {}
                for d in destinations:
                    if d.destination and d.destination not in queues:
                        queues[d.destination] = await native.has_queue(d.destination)
                    if d.destination and not queues[d.destination]:
                        found.append(
                            f"endpoint {d.endpoint}: destination {d.destination!r} has no queue on the broker; "
                            "declare it (its endpoint's installers, or duetime queues declare) first."
                        )
                    if d.latest_us is not None and (d.latest_us - now_us) / 1e6 > limit:
                        found.append(
                            f"endpoint {d.endpoint}: a timeout for {d.destination!r} is due in "
                            f"{(d.latest_us - now_us) / 1e6:,.0f} s, longer than the native delays hold "
                            f"({limit:,} s); keep such timeouts in a duetime store."
                        )
            finally:
                await native.close()
            return found

        return asyncio.run(check())

    def ledger(self, run_id: str, batch: int) -> Written | None:
        with self.ledger_db.session(write=False) as conn:
            found = self.ledger_db.ledger_entry(conn, run_id, batch)
        return None if found is None else Written(found[0], tuple(found[1]))

    def write(self, run_id: str, batch: int, records: Iterable[Record]) -> Written:
        import asyncio

        from duetime.bulk.records import to_message
        from duetime.errors import DestinationNotFound, InvalidMessage

        async def publish() -> Written:
            native = await self._open()
            try:
                messages = [to_message(r) for r in records]
                sent, conflicts = 0, []
                for start in range(0, len(messages), 1000):
                    chunk = messages[start : start + 1000]
                    results = await native.send_batch(chunk, dispatching=False)  # as the tool does
                    for message, result in zip(chunk, results, strict=True):
                        if result is None:
                            sent += 1
                        elif isinstance(result, DestinationNotFound | InvalidMessage):
                            conflicts.append(message.message_id)  # stays in the source, with the reason noted
                        else:
                            raise result
                return Written(sent, tuple(conflicts))
            finally:
                await native.close()

        written = asyncio.run(publish())
        with self.ledger_db.session() as conn:  # the only writer from its start: looks, then keeps
            if self.ledger_db.ledger_entry(conn, run_id, batch) is None:  # a twin's publish kept it
                self.ledger_db.keep_ledger_entry(conn, run_id, batch, written.inserted, written.conflicts)
        return written

    def forget(self, run_id: str) -> None:
        with self.ledger_db.session() as conn:
            self.ledger_db.forget_ledger(conn, run_id)


def open_target(url: str) -> Target | FileTarget | NativeDelayTarget:
    """``postgresql://…``, ``mysql://…``, ``sqlite:///…``, ``redis://…`` (a duetime store) or
    ``parquet:DIR`` / ``jsonl:DIR``, or RabbitMQ's native delays."""
    scheme, _, rest = url.partition(":")
    if is_keyed_store(url):
        return RedisStoreTarget(url)
    _check_writable(url, "a parquet:/ or jsonl:/ folder, or amqp://…?native=duetime")
    if scheme in ("parquet", "jsonl"):
        return FileTarget(_file_path(rest), scheme)
    if scheme in ("amqp", "amqps"):
        if "native=" not in url:
            raise ConfigurationError(
                "A RabbitMQ target is the native delay topology: add ?native=duetime (or nsb-v2, nsb-v1)."
            )
        return NativeDelayTarget(url)
    return StoreTarget(open_sql_database(url))


def open_store_target(url: str) -> StoreTarget | RedisStoreTarget:
    """A duetime store for ``bulk schedule``: one line for anything else."""
    if is_keyed_store(url):
        return RedisStoreTarget(url)
    _check_writable(url, "")
    return StoreTarget(open_sql_database(url))


def _check_writable(url: str, or_else: str) -> None:
    """One line for a URL bulk jobs cannot write into: a store without a bulk writer (the memory
    store, a store of one's own), or not a store at all."""
    scheme = url.partition(":")[0].lower()
    if is_sql_database(url) or (or_else and scheme in ("parquet", "jsonl", "amqp", "amqps")):
        return
    stores = "postgresql://, mysql://, sqlite:/// or redis://"
    raise ConfigurationError(
        f"{redact(url)} is not a store bulk jobs can write into; give --to {stores}"
        + (f", {or_else}." if or_else else ".")
    )


def _file_path(rest: str) -> str:
    path = rest[2:] if rest.startswith("//") else rest
    if not path:
        raise ConfigurationError("Name a folder: parquet:/data/export or jsonl:./out.")
    return path


def _not_written(ids: Sequence[str], new: set[str]) -> list[str]:
    """The ids of ``ids`` that were not written: those already there, and an id given twice
    (each time after the first), so written and conflicts always add up to what was given."""
    left = set(new)
    clashes = []
    for message_id in ids:
        if message_id in left:
            left.discard(message_id)
        else:
            clashes.append(message_id)
    return clashes


def _earliest(known: int | None, found: int | None) -> int | None:
    return found if known is None else known if found is None else min(known, found)
