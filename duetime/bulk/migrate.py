"""``duetime bulk migrate``: move stored timeouts between stores, resumably, nothing lost or doubled.

A run (named by its source, target, endpoint and cutoff, plus a generation) plans key-range
batches into ``duetime_bulk_batches`` (*pending*), and Spark runs one task per batch:

1. **stage**: in one source transaction the batch's rows move into ``duetime_bulk_staged``, hidden
   from the source's live dispatchers (*staged*);
2. **write**: valid rows go to the target in one target transaction together with a ledger entry;
   ids the target already holds are conflicts, never overwritten;
3. **complete**: in one source transaction, invalid and conflicting rows go back to their table, the
   rest leave the staging table (*completed*). Counts are checked at every step.

A run killed anywhere is resumed by the same command: a pending batch is staged, a staged one is
written unless the ledger says it was, then completed. ``abort`` puts every batch the target has not
committed back where it came from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from duetime.bulk.filetarget import FileTarget, rows_in
from duetime.bulk.frames import (
    Checked,
    check_batch_rows,
    checked_files,
    checked_of,
    file_endpoints,
    file_kind,
    file_rows,
    partitions_for,
    per_partition_batches,
    record_frame,
)
from duetime.bulk.hadoopfs import Listed, input_files
from duetime.bulk.progress import Progress, RowCounter, watched
from duetime.bulk.records import (
    Record,
    problem,
    store_ready,
)
from duetime.bulk.sources import Batch, DbSource, batch_of, spec_json
from duetime.bulk.targets import RedisStoreTarget, StoreTarget, Target, open_target
from duetime.bulk_interfaces import Selection
from duetime.clock import SYSTEM, to_micros
from duetime.errors import ConfigurationError
from duetime.inputs.identifiers import check_name
from duetime.registry import open_sql_database


@dataclass(frozen=True)
class MigrationSpec:
    source: str = field(repr=False)
    target: str = field(repr=False)
    endpoint: str | None = None
    cutoff: datetime | None = None
    batch_rows: int = 100_000
    #: (found, real): store a source endpoint's messages under another endpoint name (--rename).
    renames: tuple[tuple[str, str], ...] = ()
    #: The key id the driver's keyring seals with (set by :func:`migrate`): each task's must hold it.
    sealed_with: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.cutoff is not None and self.cutoff.tzinfo is None:
            raise ConfigurationError("--cutoff needs a UTC offset, e.g. 2030-01-01T00:00:00+00:00.")
        check_batch_rows(self.batch_rows)

    @property
    def cutoff_us(self) -> int | None:
        return None if self.cutoff is None else to_micros(self.cutoff)

    @property
    def job(self) -> str:
        key = f"{self.source}|{self.target}|{self.endpoint}|{self.cutoff_us}"
        if self.renames:
            key += "|" + ",".join(f"{a}={b}" for a, b in sorted(self.renames))
        return "m" + hashlib.sha1(key.encode()).hexdigest()[:16]


@dataclass
class MigrationResult:
    run_id: str
    planned: int = 0
    staged: int = 0
    inserted: int = 0
    put_back: int = 0
    remaining: int = 0
    batches: int = 0
    notes: list[str] = field(default_factory=list)
    status: str = "completed"


def check_urls(source: str, target: str | None) -> None:
    """A job's source and target URLs as far as they can be checked without Spark or a
    connection (the CLI asks before Spark takes seconds to start): a database URL is parsed, a
    ``parquet:``/``jsonl:`` path is left to Spark, a target is opened (no I/O)."""
    if file_kind(source) is None:
        open_sql_database(source)
    if target is not None:
        open_target(target)


def reach_source(url: str, endpoint: str | None, renames: dict[str, str] | None = None) -> None:
    """Connect to a database source and find the tables a job would read, as the job's first
    step does: the CLI asks before Spark starts, so a database, table or file that is not there
    is said in a second, not after Spark's start-up. Files are left to Spark."""
    if file_kind(url) is None:
        DbSource(open_sql_database(url), renames=renames).tables(endpoint)


def reach_target(url: str) -> None:
    """Connect to a store on a database server before Spark starts, as :func:`reach_source` looks
    at a source: a server or database that is not there is said at once. A SQLite target is a file
    the job makes if it is not there (its folder must be), and one that is there is opened (a file
    that is not SQLite's is said now, not by a Spark task); folders and RabbitMQ are checked by
    the job."""
    target = open_target(url)
    if isinstance(target, RedisStoreTarget):
        target.reach()
    if not isinstance(target, StoreTarget):
        return
    if not target.db.check_writable():
        return  # a file the job makes
    with target.db.session():
        pass


def migrate(spark: Any, spec: MigrationSpec, progress: Progress | None = None) -> MigrationResult:
    if file_kind(spec.source):
        return _migrate_files(spark, spec, progress)
    source = DbSource(open_sql_database(spec.source), renames=dict(spec.renames))
    target = open_target(spec.target)
    if isinstance(target, StoreTarget | RedisStoreTarget):
        spec = replace(spec, sealed_with=target.sealed_with)
    now_us = to_micros(SYSTEM.now())
    tables = source.tables(spec.endpoint)
    _refuse_moving_into_itself(source, target, tables)
    refused = target.problems(source.destinations(tables, spec.cutoff_us, now_us), now_us)
    if refused:  # as the timeout migration tool: any target problem stops the run before it starts
        raise ConfigurationError(
            f"{target.display} cannot take every message, so nothing was moved: "
            + "; ".join(refused[:10])
            + (f" (and {len(refused) - 10} more)" if len(refused) > 10 else "")
        )
    if isinstance(target, FileTarget):
        target.check(spark)  # a folder the cluster cannot really write is refused before any move
    source.ensure_state_tables()
    run_id, fresh = _current_run(source, spec, now_us)
    if run_id is None:
        return MigrationResult(
            "", notes=["nothing to migrate: an earlier run completed and nothing is left."]
        )
    rows = source.batches(run_id)
    if isinstance(target, FileTarget):
        _to_files(spark, spec, source, target, run_id, rows, progress)
    else:
        target.prepare(sorted({r["endpoint"] for r in rows}))
        todo = [int(r["batch"]) for r in rows if r["status"] in ("pending", "staged")]
        if todo:
            planned = _planned(rows)
            _run_tasks(
                spark,
                todo,
                lambda n: process_batch(spec, run_id, n),
                None
                if progress is None
                else lambda: progress(
                    "migrating", _rows_past(source, run_id, "completed", "aborted"), planned
                ),
            )
    rows = source.batches(run_id)
    result = _summarize(run_id, rows)
    unfinished = [r["batch"] for r in rows if r["status"] != "completed"]
    if unfinished:
        raise RuntimeError(
            f"run {run_id}: batches {unfinished[:10]} did not complete; run the same command again."
        )
    for r in rows:  # the counts must add up, batch by batch
        if int(r["staged"] or 0) != int(r["inserted"] or 0) + int(r["put_back"] or 0):
            raise RuntimeError(
                f"run {run_id} batch {r['batch']}: staged {r['staged']} != inserted + put back"
            )
    _set_run(source, run_id, "completed")
    target.forget(run_id)
    tables = sorted({(r["endpoint"], r["source_table"]) for r in rows})
    result.remaining = source.remaining(tables, spec.cutoff_us, to_micros(SYSTEM.now()))
    if result.remaining:
        result.notes.append(
            f"{result.remaining} selected messages are still in the source (in flight, put back, or "
            "stored during the run); run the same command again to move what can be moved."
        )
    if not fresh:
        result.notes.insert(0, f"resumed run {run_id}.")
    return result


def abort(spec: MigrationSpec, spark: Any = None) -> MigrationResult:
    """Put every message of the current run that the target has not committed back in the source.
    A folder target needs ``spark`` to look at what the run wrote."""
    if file_kind(spec.source):
        return MigrationResult(
            "", status="aborted", notes=["a file source is never changed: nothing to put back."]
        )
    source = DbSource(open_sql_database(spec.source))
    target = open_target(spec.target)
    source.ensure_state_tables()
    latest = _latest_run(source, spec.job)
    if latest is None or latest[2] != "running":
        return MigrationResult(
            "", status="aborted", notes=["no unfinished run of this migration: nothing to abort."]
        )
    run_id = latest[0]
    if isinstance(target, FileTarget):
        restored, notes = _abort_files(spark, spec.source, source, target, run_id)
    else:
        restored, notes = _abort_store(source, target, run_id), []
    _set_run(source, run_id, "aborted")
    target.forget(run_id)
    result = _summarize(run_id, source.batches(run_id))
    result.status = "aborted"
    result.put_back = restored
    result.notes.extend(notes)
    return result


def _abort_store(source: DbSource, target: Target, run_id: str) -> int:
    restored = 0
    for row in source.batches(run_id):
        batch = batch_of(row)
        if row["status"] == "staged":
            written = target.ledger(run_id, batch.number)
            if written is not None:  # committed in the target: it is there, finish the bookkeeping
                _complete(source, run_id, batch, int(row["staged"]), written.inserted, written.conflicts)
            else:
                restored += source.restore(run_id, batch)
        elif row["status"] == "pending":
            _set_aborted(source, run_id, batch.number)
    return restored


def _set_aborted(source: DbSource, run_id: str, number: int) -> None:
    with source.db.session() as conn:
        source.db.execute(conn, source.db.query("set_batch_aborted"), [None, run_id, number])


def process_batch(spec: MigrationSpec, run_id: str, number: int) -> int:
    """One batch, start to finish; safe to run again after a crash at any point. Runs in a Spark task."""
    source = DbSource(open_sql_database(spec.source))
    target = open_target(spec.target)
    if isinstance(target, FileTarget):
        raise TypeError("folders are written by the whole run (_to_files), not batch by batch")
    if isinstance(target, StoreTarget | RedisStoreTarget):
        target.expect_key(spec.sealed_with)
    rows = {r["batch"]: r for r in source.batches(run_id)}
    row = rows[number]
    batch = batch_of(row)
    local = isinstance(target, StoreTarget) and target.shares_database(source.db)
    if row["status"] == "pending" and local and source.computes_records:
        assert isinstance(target, StoreTarget)
        moved = source.db.retrying(lambda: _move_in_place(source, target, run_id, batch, spec))
        if moved is not None:
            return moved
    if row["status"] == "pending":
        staged = source.stage(run_id, batch, spec.cutoff_us, to_micros(SYSTEM.now()))
        row = {r["batch"]: r for r in source.batches(run_id)}[number]
        if staged >= 0 and int(row["staged"]) != staged:
            raise RuntimeError(f"batch {number}: staged count {row['staged']} != {staged}")
    if row["status"] != "staged":
        return 0
    staged = int(row["staged"])
    if (found := source.staged_count(run_id, number)) != staged:
        raise RuntimeError(f"batch {number}: {found} rows staged, the state table says {staged}")
    problems: dict[str, str] | None = None  # None until the batch's rows were checked
    written = target.ledger(run_id, number)
    piped = isinstance(target, StoreTarget) and not local and target.pipes_from(source.db)
    if written is None and (local or piped):  # the rows never pass through Python
        # Piped, only the rows the server cannot vouch for are read here (usually none); in one
        # database, every row's id and headers (their table is chosen row by row)
        light = (
            source.staged_to_check(run_id, number) if piped else source.staged(run_id, number, bodies=False)
        )
        if all(store_ready(r.headers) for r in light):
            problems = {r.message_id: why for r in light if (why := problem(r)) is not None}
            assert isinstance(target, StoreTarget)
            if local:
                written = target.write_from_staging(run_id, number, source.db, light, set(problems))
            else:
                tables = source.staged_per_endpoint(run_id, number, list(problems))
                written = target.write_piped(run_id, number, source.db, tables, set(problems))
        # else: headers a store cannot keep as they are (XML, nulls) are rewritten in Python below,
        # as are the rows of a piped batch whose ids the store holds already (conflicts)
    if written is None:
        problems = {}
        with source.db.session(write=False) as conn:
            stream = _checked(source.iter_staged(conn, run_id, number), problems)
            written = target.write(run_id, number, stream)
    _complete(source, run_id, batch, staged, written.inserted, written.conflicts, problems)
    return staged


def _checked(records: Iterable[Record], problems: dict[str, str]) -> Iterator[Record]:
    """The records a store can take, as they stream by; why the others cannot goes in ``problems``."""
    for record in records:
        why = problem(record)
        if why is None:
            yield record
        else:
            problems[record.message_id] = why


def _move_in_place(
    source: DbSource, target: StoreTarget, run_id: str, batch: Batch, spec: MigrationSpec
) -> int | None:
    """Source and target in one PostgreSQL database: the batch moves in one transaction, pending to
    completed, with nothing staged in between (a crash rolls all of it back). None if the batch
    must take the staged path (an id reached the target meanwhile)."""
    now_us = to_micros(SYSTEM.now())
    try:
        return _move_batch(source, target, run_id, batch, source.bucket(batch, spec.cutoff_us, now_us))
    except _Clash:
        return None
    except Exception as error:
        if getattr(error, "sqlstate", None) != "23505":
            raise
        return None


class _Clash(Exception):
    """An id the move was about to write reached the target after the batch looked."""


def _move_batch(
    source: DbSource, target: StoreTarget, run_id: str, batch: Batch, chosen: Selection
) -> int | None:
    """The rows the server vouches for move in one statement and never leave it;
    the few left are read, checked in Python by :func:`problem`, and the good ones written from
    here (their headers rewritten where a store cannot keep them as they are). Ids the target
    holds already stay in the source as conflicts; rows with a problem stay for their problem."""
    d, layout = source.db, source.layout.name
    store_table = target.layout.table_for(batch.endpoint)
    with d.session() as conn:
        if not source.server_records(conn):  # a server that cannot convert exactly: the staged path
            return None
        if not source.claim_status(conn, run_id, batch.number, "pending"):
            return None
        store = target.moving_rows(store_table)
        present = d.ids_held(conn, batch.table, layout, chosen, store)
        moved, stored, first_us = d.move_plainly_fine(conn, batch.table, layout, chosen, present, store)
        if moved != stored:
            raise RuntimeError(f"batch {batch.number}: moved {moved} rows but inserted {stored}")
        earliest = [first_us] if first_us is not None else []
        # What is left (the server could not vouch for it) is checked here, usually nothing.
        rest = [
            Record(batch.endpoint, r[0], r[1], r[2], r[3], bytes(r[4]), int(r[5]), r[6])
            for r in d.records_left(conn, batch.table, layout, chosen, present)
        ]
        problems = {r.message_id: why for r in rest if (why := problem(r)) is not None}
        good = [r for r in rest if r.message_id not in problems]
        if good:
            taken = d.take_ids(conn, batch.table, layout, chosen, [r.message_id for r in good])
            good = [r for r in good if r.message_id in taken]
            got, clash = target.insert_rows(conn, store_table, good)
            if clash:
                raise _Clash(clash[0])
            moved += got
            earliest += [r.due_us for r in good if r.due_us is not None]
        left = len(problems) + len(present)
        notes = [f"{i}: {why}" for i, why in list(problems.items())[:20]] + [
            f"{i}: already in the target" for i in present[:20]
        ]
        d.execute(
            conn,
            d.query("set_batch_moved"),
            [moved + left, moved, left, "\n".join(notes), run_id, batch.number],
        )
        if moved:
            target.written(conn, {store_table: min(earliest)}, {store_table: moved})
    return moved


def _complete(
    source: DbSource,
    run_id: str,
    batch: Batch,
    staged: int,
    inserted: int,
    conflicts: Sequence[str],
    bad: dict[str, str] | None = None,
) -> None:
    """End a batch whose rows the target committed: what it did not take goes back."""
    if bad is None:
        with source.db.session(write=False) as conn:
            bad = {}
            for _ in _checked(source.iter_staged(conn, run_id, batch.number, bodies=False), bad):
                pass
    invalid = list(bad)
    back = sorted(set(invalid) | set(conflicts))
    if inserted + len(back) != staged:
        raise RuntimeError(
            f"batch {batch.number}: {staged} staged, {inserted} written, {len(back)} to put back; counts differ"
        )
    notes = [f"{i}: {bad[i]}" for i in invalid[:20]] + [
        f"{i}: already in the target" for i in list(conflicts)[:20]
    ]
    source.complete(run_id, batch, back, inserted, "\n".join(notes))


def _run_tasks(
    spark: Any, todo: list[int], task: Callable[[int], Any], report: Callable[[], None] | None
) -> list[Any]:
    """Run ``task`` for each batch as a Spark task, ``report`` telling how far it has come meanwhile."""
    sc = spark.sparkContext
    return watched(lambda: sc.parallelize(todo, len(todo)).map(task).collect(), report)


def _planned(rows: Sequence[dict[str, Any]]) -> int:
    """The rows a run's batches hold (planned when the run was)."""
    return sum(int(r["planned"] or 0) for r in rows)


def _rows_past(source: DbSource, run_id: str, *statuses: str) -> int:
    """The rows of the run's batches whose status is one of ``statuses`` (asked twice a second
    while a job runs: one sum, not every batch's row)."""
    db = source.db
    with db.session(write=False) as conn:
        return db.rows_in_states(conn, run_id, statuses)


def _latest_run(source: DbSource, job: str) -> tuple[str, int, str] | None:
    with source.db.session(write=False) as conn:
        row = source.db.execute(conn, source.db.query("latest_run"), [job]).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), str(row[2]))


def _current_run(source: DbSource, spec: MigrationSpec, now_us: int) -> tuple[str | None, bool]:
    """The unfinished run to resume, or a new one planned now; (None, _) if nothing is left."""
    latest = _latest_run(source, spec.job)
    if latest is not None and latest[2] == "running":
        return latest[0], False
    generation = 1 if latest is None else latest[1] + 1
    batches = source.plan(spec.endpoint, spec.cutoff_us, now_us, spec.batch_rows)
    if latest is not None and latest[2] == "completed" and sum(b.planned for b in batches) == 0:
        return None, False
    run_id = f"{spec.job}-{generation}"
    d = source.db
    with d.session() as conn:
        d.execute(
            conn,
            d.query("insert_run"),
            [
                run_id,
                spec.job,
                generation,
                spec_json(
                    endpoint=spec.endpoint, cutoff=spec.cutoff, target=open_target(spec.target).display
                ),
            ],
        )
        d.executemany(
            conn,
            d.query("insert_batch"),
            [(run_id, b.number, b.endpoint, b.table, b.lower, b.upper, b.planned) for b in batches],
        )
    return run_id, True


def _set_run(source: DbSource, run_id: str, status: str) -> None:
    with source.db.session() as conn:
        source.db.execute(conn, source.db.query("set_run_status"), [status, run_id])


def _summarize(run_id: str, rows: list[dict[str, Any]]) -> MigrationResult:
    result = MigrationResult(run_id, batches=len(rows))
    for r in rows:
        result.planned += int(r["planned"] or 0)
        result.staged += int(r["staged"] or 0)
        result.inserted += int(r["inserted"] or 0)
        result.put_back += int(r["put_back"] or 0)
        if r["note"]:
            result.notes.extend(str(r["note"]).splitlines()[:5])
    return result


# -- folder targets: the batches are staged, Spark writes the run's folder, then the batches end --


def _to_files(
    spark: Any,
    spec: MigrationSpec,
    source: DbSource,
    target: FileTarget,
    run_id: str,
    rows: list[dict[str, Any]],
    progress: Progress | None,
) -> None:
    """A folder cannot share a transaction with the source, so the order keeps every message:
    stage every batch (hidden from the source's dispatchers); write the run's folder (Spark
    commits it whole, or not at all); count what the committed files hold against what was
    staged; only then let the batches go. A crash anywhere is resumed by the same command."""
    planned = _planned(rows)

    def report(what: str, *statuses: str) -> Callable[[], None] | None:
        if progress is None:
            return None
        return lambda: progress(what, _rows_past(source, run_id, *statuses), planned)

    pending = [int(r["batch"]) for r in rows if r["status"] == "pending"]
    if pending:
        url, cutoff = spec.source, spec.cutoff_us
        _run_tasks(
            spark,
            pending,
            lambda n: _stage_only(url, run_id, n, cutoff),
            report("taking", "staged", "completed", "aborted"),
        )
    rows = source.batches(run_id)
    staged = [batch_of(r) for r in rows if r["status"] == "staged"]
    if not staged:
        return
    folder = target.run_folder(spark, run_id)
    url = spec.source
    if not folder.committed():  # a crashed attempt's partial output is replaced, never appended to

        def valid(batch: Batch) -> Iterator[Checked]:
            reader = DbSource(open_sql_database(url))
            with reader.db.session(write=False) as conn:
                for record in reader.iter_staged(conn, run_id, batch.number):
                    if problem(record) is None:
                        yield record, None

        holds = target.write(spark, record_frame(spark, staged, valid), folder)
    else:  # committed before a crash: what it holds is read from the files
        holds = rows_in(spark, folder, target.format)
    numbers = [b.number for b in staged]
    valid_counts = dict(
        spark.sparkContext.parallelize(numbers, len(numbers))
        .map(lambda n: (n, _valid_staged(url, run_id, n)))
        .collect()
    )
    expected = sum(int(r["inserted"] or 0) for r in rows if r["status"] == "completed") + sum(
        valid_counts.values()
    )
    if holds != expected:
        raise ConfigurationError(
            f"run {run_id}: {folder.uri} holds {holds:,} messages but {expected:,} were taken from the "
            "source, so none was let go; run with --mode abort to put them back, then migrate again."
        )
    _run_tasks(
        spark,
        numbers,
        lambda n: _complete_written(url, run_id, n, valid_counts[n]),
        report("letting go", "completed", "aborted"),
    )


def _stage_only(url: str, run_id: str, number: int, cutoff_us: int | None) -> int:
    source = DbSource(open_sql_database(url))
    row = {r["batch"]: r for r in source.batches(run_id)}[number]
    if row["status"] != "pending":
        return 0
    return source.stage(run_id, batch_of(row), cutoff_us, to_micros(SYSTEM.now()))


def _valid_staged(url: str, run_id: str, number: int) -> int:
    source = DbSource(open_sql_database(url))
    with source.db.session(write=False) as conn:
        return sum(1 for _ in _checked(source.iter_staged(conn, run_id, number, bodies=False), {}))


def _complete_written(url: str, run_id: str, number: int, valid: int) -> None:
    source = DbSource(open_sql_database(url))
    row = {r["batch"]: r for r in source.batches(run_id)}[number]
    if row["status"] == "staged":
        _complete(source, run_id, batch_of(row), int(row["staged"]), valid, ())


def _abort_files(
    spark: Any, url: str, source: DbSource, target: FileTarget, run_id: str
) -> tuple[int, list[str]]:
    """The run's folder holds exactly what was staged (it committed and the counts agree): the
    batches end as a migration would. Otherwise every staged message goes back to the source."""
    if spark is None:
        raise ConfigurationError("Aborting a migration into files needs Spark to read the folder.")
    rows = source.batches(run_id)
    staged = [(batch_of(r), int(r["staged"])) for r in rows if r["status"] == "staged"]
    valid = {b.number: _valid_staged(url, run_id, b.number) for b, _ in staged}
    completed = sum(int(r["inserted"] or 0) for r in rows if r["status"] == "completed")
    holds = target.rows(spark, run_id)
    restored, notes = 0, []
    if holds is not None and holds == completed + sum(valid.values()):
        for batch, count in staged:
            _complete(source, run_id, batch, count, valid[batch.number], ())
        notes.append(f"the run's folder already held every message it took; {len(staged)} batches ended.")
    else:
        for batch, _ in staged:
            restored += source.restore(run_id, batch)
        if not completed:
            target.run_folder(spark, run_id).delete()  # a partial write of what is back in the source
        elif holds is not None:
            notes.append(
                f"the run's folder holds {holds:,} messages, not the {completed:,} it should; check it."
            )
    for row in rows:
        if row["status"] == "pending":
            _set_aborted(source, run_id, int(row["batch"]))
    return restored, notes


# -- file sources: nothing to hide or put back; each Spark partition is a ledgered batch -----------


def _refuse_moving_into_itself(source: DbSource, target: object, tables: Sequence[tuple[str, str]]) -> None:
    """A store's table as its own target: every row would be taken out and put back, the run
    would say it moved them and that they are still there, and a second run the same."""
    if (
        not isinstance(target, StoreTarget)
        or source.layout.name != "duetime"
        or source.db.place() != target.db.place()
    ):
        return
    same = [table for endpoint, table in tables if target.layout.table_for(endpoint) == table]
    if same:
        raise ConfigurationError(
            f"--from and --to are the same store table ({', '.join(same)}), so nothing would move; "
            "give another --to, or --rename FOUND=REAL to move an endpoint's messages under another name."
        )


def _migrate_files(spark: Any, spec: MigrationSpec, progress: Progress | None) -> MigrationResult:
    from pyspark.sql import functions as F

    kind = file_kind(spec.source)
    assert kind is not None
    if spec.endpoint:
        check_name("endpoint", spec.endpoint)  # wrong for every row: say so before Spark reads one
    target = open_target(spec.target)
    if isinstance(target, FileTarget):
        target.check(spark)
    # The partition count is part of the run's name: a partition's number names the same rows in
    # every run of the same files and batch size (its ledger entry says it was written).
    listed = input_files(spark, kind[1])  # listed once: refused if empty, then the run's identity
    rows = file_rows(spark, kind[1], kind[0])
    partitions = partitions_for(rows, spec.batch_rows)
    frame = checked_files(spark, kind[1], kind[0], spec.endpoint, partitions)
    cutoff = spec.cutoff_us
    if cutoff is not None:
        frame = frame.where(F.col("due_us").isNull() | (F.col("due_us") >= cutoff))
    run_id = f"{spec.job}-{_fingerprint(listed)}-{partitions}"
    bad = frame.where(F.col("problem").isNotNull())
    if isinstance(target, FileTarget):
        result = MigrationResult(run_id, batches=1)
        folder = target.run_folder(spark, run_id)
        if folder.committed():
            result.notes.append("these files were written to the target before: skipped.")
            return result
        result.inserted = target.write(spark, frame.where(F.col("problem").isNull()), folder)
        # Without a cutoff every row read is written or rejected: the files' own count (their
        # footers, for Parquet) says how many were rejected, with no second pass over the rows.
        result.put_back = rows - result.inserted if cutoff is None else int(bad.count())
        rejected = bad.select("message_id", "problem").limit(5).collect() if result.put_back else []
        result.staged = result.planned = result.inserted + result.put_back
        result.notes.extend(f"{r[0] or '?'}: {r[1]}" for r in rejected)
    else:
        # The store tables first, on the driver (tasks creating them at once would race); then
        # one pass: each row is read, checked and written once.
        target.prepare(file_endpoints(spark, kind[1], kind[0], spec.endpoint))
        counter = RowCounter(spark)
        counted = watched(
            lambda: per_partition_batches(
                frame,
                lambda index, batches: [_write_partition(target, run_id, index, batches, counter)],
                "seen long, inserted long, conflicts long, rejected long, notes string, before boolean",
            ),
            None if progress is None else lambda: progress("importing", counter.done, rows),
        )
        result = MigrationResult(run_id, batches=len(counted))
        for seen, inserted, conflicts, rejected_count, notes, before in counted:
            result.planned += seen
            if before:
                continue
            result.staged += seen
            result.inserted += inserted
            result.put_back += conflicts + rejected_count
            result.notes.extend(n for n in notes.split("\n") if n)
        skipped = sum(1 for c in counted if c[5])
        if skipped:
            result.notes.append(
                f"{skipped} of {len(counted)} partitions of these files were written before: skipped."
            )
    if progress is not None:
        progress("importing", rows, rows)
    return result


def _write_partition(
    target: Target, run_id: str, index: int, batches: Iterator[Any], counter: RowCounter
) -> tuple[int, int, int, int, str, bool]:
    """A partition of checked file rows into ``target``: its valid rows, as Arrow batches where
    the target takes them (a PostgreSQL store COPYs them without a record per row)."""
    import pyarrow.compute as pc

    if target.ledger(run_id, index) is not None:  # written by an earlier run of the same files
        seen = sum(b.num_rows for b in batches)
        counter.add(seen)
        return seen, 0, 0, 0, "", True
    seen = rejected = 0
    shown: list[str] = []

    def valid() -> Iterator[Any]:
        nonlocal seen, rejected
        for batch in batches:
            seen += batch.num_rows
            counter.add(batch.num_rows)
            wrong = pc.is_valid(batch.column("problem"))
            bad = batch.filter(wrong)
            rejected += bad.num_rows
            first = bad.slice(0, max(0, 5 - len(shown)))  # the first five reasons are shown
            ids, reasons = first.column("message_id").to_pylist(), first.column("problem").to_pylist()
            shown.extend(f"{ident or '?'}: {why}" for ident, why in zip(ids, reasons, strict=True))
            yield batch.filter(pc.invert(wrong)) if bad.num_rows else batch

    if isinstance(target, StoreTarget):
        written = target.write_batches(run_id, index, valid())
    else:
        written = target.write(run_id, index, (record for record, _ in checked_of(valid())))
    return seen, written.inserted, len(written.conflicts), rejected, "\n".join(shown), False


def _fingerprint(files: Sequence[Listed]) -> str:
    """What the run reads: every file's full path, size and modification time, listed through
    the cluster's filesystem. Different files under the same path are a new run."""
    digest = hashlib.sha1()
    for item in files:
        digest.update(f"{item.path}|{item.size}|{item.modified_ms}\n".encode())
    return digest.hexdigest()[:10]
