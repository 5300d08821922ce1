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
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from duetime.bulk.frames import checked_rdd, file_kind
from duetime.bulk.records import Record, group_sql, problem, store_ready
from duetime.bulk.sources import STAGED, Batch, DbSource, batch_of, spec_json
from duetime.bulk.targets import StoreTarget, Target, open_target
from duetime.clock import SYSTEM, to_micros
from duetime.errors import ConfigurationError
from duetime.sqldb import Database

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class MigrationSpec:
    source: str = field(repr=False)
    target: str = field(repr=False)
    endpoint: str | None = None
    cutoff: datetime | None = None
    batch_rows: int = 100_000
    #: (found, real): store a source endpoint's messages under another endpoint name (--rename).
    renames: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.cutoff is not None and self.cutoff.tzinfo is None:
            raise ConfigurationError("--cutoff needs a UTC offset, e.g. 2030-01-01T00:00:00+00:00.")
        if not 100 <= self.batch_rows <= 5_000_000:
            raise ConfigurationError("--batch-rows must be between 100 and 5,000,000.")

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


def migrate(spark: Any, spec: MigrationSpec, progress: Progress | None = None) -> MigrationResult:
    if file_kind(spec.source):
        return _migrate_files(spark, spec, progress)
    source = DbSource(Database.from_url(spec.source), renames=dict(spec.renames))
    target = open_target(spec.target)
    now_us = to_micros(SYSTEM.now())
    refused = target.problems(
        source.destinations(source.tables(spec.endpoint), spec.cutoff_us, now_us), now_us
    )
    if refused:  # as the timeout migration tool: any target problem stops the run before it starts
        raise ConfigurationError(
            f"{target.display} cannot take every message, so nothing was moved: "
            + "; ".join(refused[:10])
            + (f" (and {len(refused) - 10} more)" if len(refused) > 10 else "")
        )
    source.ensure_state_tables()
    run_id, fresh = _current_run(source, spec, now_us)
    if run_id is None:
        return MigrationResult(
            "", notes=["nothing to migrate: an earlier run completed and nothing is left."]
        )
    rows = source.batches(run_id)
    endpoints = sorted({r["endpoint"] for r in rows})
    target.prepare(endpoints)
    todo = [int(r["batch"]) for r in rows if r["status"] in ("pending", "staged")]
    if todo:
        _run_tasks(spark, spec, run_id, todo, lambda: _done(source, run_id), len(rows), progress)
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


def abort(spec: MigrationSpec) -> MigrationResult:
    """Put every message of the current run that the target has not committed back in the source."""
    if file_kind(spec.source):
        return MigrationResult(
            "", status="aborted", notes=["a file source is never changed: nothing to put back."]
        )
    source = DbSource(Database.from_url(spec.source))
    target = open_target(spec.target)
    source.ensure_state_tables()
    latest = _latest_run(source, spec.job)
    if latest is None or latest[2] != "running":
        return MigrationResult(
            "", status="aborted", notes=["no unfinished run of this migration: nothing to abort."]
        )
    run_id = latest[0]
    restored = 0
    for row in source.batches(run_id):
        batch = batch_of(row)
        if row["status"] == "staged":
            written = target.ledger(run_id, batch.number)
            if written is not None:  # committed in the target: it is there, finish the bookkeeping
                _complete(
                    source,
                    run_id,
                    batch,
                    source.staged(run_id, batch.number),
                    written.inserted,
                    written.conflicts,
                )
            else:
                restored += source.restore(run_id, batch)
        elif row["status"] == "pending":
            with source.db.session() as conn:
                source.db.execute(conn, source.db.query("set_batch_aborted"), [None, run_id, batch.number])
    _set_run(source, run_id, "aborted")
    target.forget(run_id)
    result = _summarize(run_id, source.batches(run_id))
    result.status = "aborted"
    result.put_back = restored
    return result


def process_batch(spec: MigrationSpec, run_id: str, number: int) -> int:
    """One batch, start to finish; safe to run again after a crash at any point. Runs in a Spark task."""
    source = DbSource(Database.from_url(spec.source))
    target = open_target(spec.target)
    rows = {r["batch"]: r for r in source.batches(run_id)}
    row = rows[number]
    batch = batch_of(row)
    local = isinstance(target, StoreTarget) and target.shares_database(source.db)
    if row["status"] == "pending" and local and source.layout.record_sql() is not None:
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
    records = source.staged(run_id, number, bodies=not local)
    if len(records) != int(row["staged"]):
        raise RuntimeError(
            f"batch {number}: {len(records)} rows staged, the state table says {row['staged']}"
        )
    problems = {r.message_id: why for r in records if (why := problem(r)) is not None}
    written = target.ledger(run_id, number)
    if written is None and local and not all(store_ready(r.headers) for r in records):
        local = False  # headers a store cannot keep as they are (XML, nulls): rewritten in Python
        records = source.staged(run_id, number, bodies=True)
    if written is None and local:  # the rows never leave the server: only their ids are checked here
        assert isinstance(target, StoreTarget)
        written = target.write_from_staging(
            run_id, number, source.db.qualified(STAGED), records, set(problems)
        )
    elif written is None:
        written = target.write(run_id, number, [r for r in records if r.message_id not in problems])
    _complete(source, run_id, batch, records, written.inserted, written.conflicts, problems)
    return len(records)


def _move_in_place(
    source: DbSource, target: StoreTarget, run_id: str, batch: Batch, spec: MigrationSpec
) -> int | None:
    """Source and target in one PostgreSQL database: the batch moves in one transaction, pending to
    completed, with nothing staged in between (a crash rolls all of it back). Rows are checked in
    Python first and only the checked ids move; None if the batch must take the staged path."""
    d, lay = source.db, source.layout
    exprs = lay.record_sql()
    assert exprs is not None
    now_us = to_micros(SYSTEM.now())
    where, params = source._bucket_where(batch, spec.cutoff_us, now_us)
    table = d.qualified(batch.table)
    light = ", ".join(exprs[:4]) + f", {exprs[5]}"
    with d.session(write=False) as conn:
        rows = d.execute(conn, f"SELECT {light} FROM {table} WHERE {where}", params).fetchall()
    records = [Record(batch.endpoint, r[0], r[1], r[2], r[3], b"", int(r[4])) for r in rows]
    problems = {r.message_id: why for r in records if (why := problem(r)) is not None}
    if not all(store_ready(r.headers) for r in records):
        return None  # headers the store cannot keep as they are: the staged path rewrites them
    wanted = [r.message_id for r in records if r.message_id not in problems]
    target_table = target.db.qualified(target.layout.table_for(batch.endpoint))
    try:
        return _move_checked(
            source, target, run_id, batch, records, problems, wanted, target_table, where, params
        )
    except Exception as error:
        if getattr(error, "sqlstate", None) != "23505":
            raise
        return None  # an id reached the target between the check and the move: take the staged path


def _move_checked(
    source: DbSource,
    target: StoreTarget,
    run_id: str,
    batch: Batch,
    records: list[Record],
    problems: dict[str, str],
    wanted: list[str],
    target_table: str,
    where: str,
    params: list[Any],
) -> int | None:
    d, lay = source.db, source.layout
    exprs = lay.record_sql()
    assert exprs is not None
    table = d.qualified(batch.table)
    with d.session() as conn:
        present = {
            r[0] for r in d.execute(conn, d.query("existing_ids", table=target_table), [wanted]).fetchall()
        }
        movable = [i for i in wanted if i not in present]
        if not source._claim_status(conn, run_id, batch.number, "pending"):
            return None
        cols = ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
        key = d.quote(lay.key)
        counts = d.execute(
            conn,
            f"WITH moved AS (DELETE FROM {table} WHERE {key} = ANY(%s::{lay.key_type}[]) AND {where} RETURNING {cols}), "
            f"ins AS (INSERT INTO {target_table} "
            "(message_id, destination, due_at, headers, body, failure_count, group_key) "
            "SELECT c0, c1, timestamptz 'epoch' + c2 * interval '1 microsecond', c3::json, c4, c5, "
            f"{group_sql('c6')} FROM moved "
            "RETURNING 1) "
            "SELECT (SELECT COUNT(*) FROM moved), (SELECT COUNT(*) FROM ins)",
            [movable, *params],
        ).fetchone()
        if counts[0] != counts[1]:
            raise RuntimeError(f"batch {batch.number}: moved {counts[0]} rows but inserted {counts[1]}")
        left = len(problems) + len(present) + (len(movable) - int(counts[0]))
        notes = [f"{i}: {why}" for i, why in list(problems.items())[:20]] + [
            f"{i}: already in the target" for i in list(present)[:20]
        ]
        d.execute(
            conn,
            d.query("set_batch_moved"),
            [int(counts[0]) + left, int(counts[1]), left, "\n".join(notes), run_id, batch.number],
        )
        if counts[1]:
            target._notify(conn, {target.layout.table_for(batch.endpoint): records})
    return int(counts[0])


def _complete(
    source: DbSource,
    run_id: str,
    batch: Batch,
    records: Sequence[Record],
    inserted: int,
    conflicts: Sequence[str],
    bad: dict[str, str] | None = None,
) -> None:
    if bad is None:
        bad = {r.message_id: why for r in records if (why := problem(r)) is not None}
    invalid = list(bad)
    back = sorted(set(invalid) | set(conflicts))
    if inserted + len(back) != len(records):
        raise RuntimeError(
            f"batch {batch.number}: {len(records)} staged, {inserted} written, {len(back)} to put back; counts differ"
        )
    notes = [f"{i}: {bad[i]}" for i in invalid[:20]] + [
        f"{i}: already in the target" for i in list(conflicts)[:20]
    ]
    source.complete(run_id, batch, back, inserted, "\n".join(notes))


def _run_tasks(
    spark: Any,
    spec: MigrationSpec,
    run_id: str,
    todo: list[int],
    done: Callable[[], int],
    total: int,
    progress: Progress | None,
) -> None:
    """Run the batches as Spark tasks; report progress from the state table meanwhile."""
    sc = spark.sparkContext
    failure: list[BaseException] = []

    def job() -> None:
        try:
            sc.parallelize(todo, len(todo)).map(lambda n: process_batch(spec, run_id, n)).collect()
        except BaseException as error:  # re-raised on the driver's thread below
            failure.append(error)

    worker = threading.Thread(target=job, name="duetime-bulk", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
        if progress is not None:
            progress(done(), total)
    if progress is not None:
        progress(done(), total)
    if failure:
        raise failure[0]


def _done(source: DbSource, run_id: str) -> int:
    with source.db.session(write=False) as conn:
        return int(source.db.execute(conn, source.db.query("finished_batches"), [run_id]).fetchone()[0])


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


# -- file sources: nothing to hide or put back; each Spark partition is a ledgered batch -----------


def _migrate_files(spark: Any, spec: MigrationSpec, progress: Progress | None) -> MigrationResult:
    kind = file_kind(spec.source)
    assert kind is not None
    target = open_target(spec.target)
    rdd = checked_rdd(spark, kind[1], kind[0], spec.endpoint)
    cutoff = spec.cutoff_us
    if cutoff is not None:
        rdd = rdd.filter(lambda pair: pair[0].due_us is None or pair[0].due_us >= cutoff)
    rdd = rdd.cache()
    endpoints = sorted(set(rdd.map(lambda pair: pair[0].endpoint).distinct().collect()) - {""})
    target.prepare(endpoints)
    run_id = f"{spec.job}-{_fingerprint(kind[1])}"
    counted = rdd.mapPartitionsWithIndex(
        lambda index, pairs: [_write_partition(target, run_id, index, list(pairs))]
    ).collect()
    rdd.unpersist()
    result = MigrationResult(run_id, batches=len(counted))
    for seen, inserted, conflicts, rejected, before in counted:
        result.planned += seen
        if before:
            continue
        result.staged += seen
        result.inserted += inserted
        result.put_back += conflicts + len(rejected)
        result.notes.extend(rejected[:5])
    skipped = sum(1 for c in counted if c[4])
    if skipped:
        result.notes.append(
            f"{skipped} of {len(counted)} partitions of these files were written before: skipped."
        )
    if progress is not None:
        progress(len(counted), len(counted))
    return result


def _write_partition(
    target: Target, run_id: str, index: int, pairs: list[tuple[Record, str | None]]
) -> tuple[int, int, int, list[str], bool]:
    valid = [r for r, why in pairs if why is None]
    rejected = [f"{r.message_id or '?'}: {why}" for r, why in pairs if why is not None]
    if target.ledger(run_id, index) is not None:  # written by an earlier run of the same files
        return len(pairs), 0, 0, [], True
    written = target.write(run_id, index, valid)
    return len(pairs), written.inserted, len(written.conflicts), rejected, False


def _fingerprint(path: str) -> str:
    """Changes when the files change, so importing a re-written folder is a new run."""
    import os

    digest = hashlib.sha1()
    root = Path(path)
    files = sorted(root.rglob("*")) if root.is_dir() else [root]
    for item in files:
        if item.is_file():
            stat = os.stat(item)
            digest.update(f"{item}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:10]
