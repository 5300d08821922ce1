"""``duetime bulk schedule``: a delayed message for every row of a DataFrame or file.

Valid rows are stored exactly once per job, even when the job is re-run after some of its messages
were already delivered (the ids a job scheduled are kept beside the store). Rows that fail
validation are written, with the reason, to a rejects folder of JSON Lines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duetime.bulk.filetarget import write_frame
from duetime.bulk.frames import (
    CHUNK_ROWS,
    Checked,
    check_batch_rows,
    checked_files,
    checked_frame,
    chunked,
    file_kind,
    file_rows,
    kept,
    partitions_for,
    per_partition,
)
from duetime.bulk.hadoopfs import Folder, check_writable, input_files
from duetime.bulk.progress import Progress, RowCounter, watched
from duetime.bulk.records import Record, to_message
from duetime.bulk.targets import open_store_target
from duetime.errors import ConfigurationError, MessageInFlight
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact
from duetime.interfaces import IfExists, SyncReplacingStore
from duetime.limits import spread_offset
from duetime.registry import open_sync_store
from duetime.settings import TransactionMode


@dataclass(frozen=True)
class Scheduled:
    rows: int
    stored: int
    #: valid rows this job had stored before (a re-run), or whose id the store already held (kept)
    skipped: int
    rejected: int
    rejects_path: str | None
    #: with ``if_exists="replace"``: waiting messages replaced by a row with their id
    replaced: int = 0
    #: with ``if_exists="replace"``: rows whose id a dispatcher was delivering, so not replaced
    in_flight: int = 0


def bulk_if_exists(value: object) -> IfExists:
    """What a bulk schedule does with a row whose id is waiting in the store: ``keep`` (the
    default: the stored message stays, the row is counted as skipped) or ``replace``."""
    try:
        how = IfExists(value if isinstance(value, str) else "")
    except ValueError:
        raise ConfigurationError(
            f"--if-exists is keep or replace for a bulk schedule, not {value!r}."
        ) from None
    if how is IfExists.REFUSE:
        raise ConfigurationError(
            "--if-exists refuse: a bulk schedule does not stop for one row; keep (the default) "
            "leaves a waiting message and counts the row as skipped, replace replaces it."
        )
    if how is IfExists.DEBOUNCE:
        raise ConfigurationError(
            "--if-exists debounce: each row gives its own due time, so it replaces; use replace "
            "(a debounce counts a delay from now, which `duetime schedule --in` has)."
        )
    return how


def schedule(
    spark: Any,
    rows: Any,
    store_url: str,
    *,
    endpoint: str | None = None,
    job: str,
    rejects: str | None = None,
    batch_rows: int = 100_000,
    progress: Progress | None = None,
    spread: timedelta = timedelta(0),
    if_exists: IfExists | str = IfExists.KEEP,
) -> Scheduled:
    """Schedule ``rows``: a DataFrame, or a ``parquet:``/``jsonl:`` path. Files are spread over
    about one task per ``batch_rows`` rows (a DataFrame keeps the partitions it has).
    ``progress`` is told the rows done of the rows the files hold (of a DataFrame: unknown).
    ``spread``: each message goes a moment of its own (by its id) up to that after its time.
    ``if_exists``: what a row whose id is waiting does (:func:`bulk_if_exists`)."""

    how = bulk_if_exists(if_exists)
    check_schedule(rows, store_url, job=job, endpoint=endpoint, batch_rows=batch_rows)
    if isinstance(rows, str):
        kind = file_kind(rows)
        assert kind is not None  # checked
        input_files(spark, kind[1])
        total: int | None = file_rows(spark, kind[1], kind[0])
        partitions = partitions_for(total or 0, batch_rows)
        frame = checked_files(spark, kind[1], kind[0], endpoint, partitions)
    elif hasattr(rows, "schema") and hasattr(rows, "mapInArrow"):
        frame, total = checked_frame(rows, endpoint), None
    else:
        raise ConfigurationError(
            f"schedule takes a Spark DataFrame or a 'parquet:'/'jsonl:' path, not {type(rows).__name__}; "
            "for Python rows, spark.createDataFrame(rows) first."
        )
    # Where the rejects go is checked before anything is stored: a folder the cluster cannot
    # really write would otherwise lose the reasons after the valid rows were in.
    rejects = _rejects_folder(rejects) or f"rejects-{job}"
    there = Folder(spark, rejects).exists()
    folder = check_writable(spark, rejects)
    with kept(frame) as checked:  # checked once: endpoints, writes and rejects read it again
        return _schedule(checked, store_url, job, folder, there, total, progress, spread, how)


def _spread(record: Record, window: timedelta) -> int | None:
    """The record's due time moved its own moment into ``window`` (the one rule: spread_offset)."""
    if record.due_us is None:
        return None
    return record.due_us + spread_offset(record.message_id, window) // timedelta(microseconds=1)


def _rejects_folder(given: str | None) -> str | None:
    """Rejects are always JSON Lines: ``jsonl:PATH`` is PATH, as the inputs are written."""
    kind = file_kind(given) if given else None
    if kind is None:
        return given
    if kind[0] != "jsonl":
        raise ConfigurationError(
            f"--rejects is a folder of JSON Lines: give PATH or jsonl:PATH, not {given!r}."
        )
    return kind[1]


def check_schedule(
    rows: Any, store_url: str, *, job: str, endpoint: str | None = None, batch_rows: int = 100_000
) -> None:
    """What a schedule job is told, as far as it can be checked without Spark or a connection (the
    CLI asks before Spark takes seconds to start): wrong for every row, so said before one is read."""
    if not job or len(job) > 64:
        raise ConfigurationError(
            "Name the job (--job, at most 64 characters): a re-run with the same name never doubles a message."
        )
    check_batch_rows(batch_rows)
    if endpoint:
        check_name("endpoint", endpoint)
    if isinstance(rows, str) and file_kind(rows) is None:
        raise ConfigurationError(f"{rows!r} is not a parquet: or jsonl: path.")
    open_store_target(store_url)


def _schedule(
    frame: Any,
    store_url: str,
    job: str,
    folder: Folder,
    there: bool,
    total: int | None,
    progress: Progress | None,
    spread: timedelta = timedelta(0),
    how: IfExists = IfExists.KEEP,
) -> Scheduled:
    from pyspark.sql import functions as F

    target = open_store_target(store_url)
    valid = frame.where(F.col("problem").isNull())
    target.prepare([r[0] for r in valid.select("endpoint").distinct().collect()])
    url, sealed_with = store_url, target.sealed_with
    counter = RowCounter(frame.sparkSession)

    def write(_: int, pairs: Iterator[Checked]) -> list[tuple[int, int, int, int, int, int]]:
        store = open_store_target(url)
        store.expect_key(sealed_with)  # the driver's keyring seals, or nothing is written
        seen = good = 0
        done = _Replaced()
        for chunk in chunked(pairs, CHUNK_ROWS):  # a partition of any size, in bounded memory
            seen += len(chunk)
            counter.add(len(chunk))
            records = [r for r, why in chunk if why is None]
            if spread:
                records = [r._replace(due_us=_spread(r, spread)) for r in records]
            good += len(records)
            if records:
                written = store.write_once(job, records, keep_held=how is IfExists.KEEP)
                done.stored += written.inserted
                if how is IfExists.REPLACE and written.conflicts:
                    by_id = {r.message_id: r for r in records}
                    _replace(url, [by_id[i] for i in written.conflicts], done)
                    store.settled(job, written.conflicts)
        settled = done.stored + done.replaced + done.in_flight
        return [(seen, done.stored, good - settled, seen - good, done.replaced, done.in_flight)]

    counts = watched(
        lambda: per_partition(
            frame,
            write,
            "rows long, stored long, skipped long, rejected long, replaced long, in_flight long",
        ),
        None if progress is None else lambda: progress("scheduling", counter.done, total),
    )
    rejected = sum(c[3] for c in counts)
    path = None
    if rejected:
        write_frame(frame.where(F.col("problem").isNotNull()).coalesce(1), "jsonl", folder, reasons=True)
        path = folder.uri
    elif not there:
        folder.delete()  # the probe's folder: no rejects, nothing left behind
    return Scheduled(
        sum(c[0] for c in counts),
        sum(c[1] for c in counts),
        sum(c[2] for c in counts),
        rejected,
        path,
        sum(c[4] for c in counts),
        sum(c[5] for c in counts),
    )


@dataclass
class _Replaced:
    """A task's counts: rows stored new, waiting messages replaced, rows left (being delivered)."""

    stored: int = 0
    replaced: int = 0
    in_flight: int = 0


def _replace(url: str, records: Sequence[Record], done: _Replaced) -> None:
    """Put each of ``records`` in place of the waiting message with its id, through the store's
    own replace (:class:`~duetime.interfaces.SyncReplacingStore`: atomic, sealed as it stores,
    never a message a dispatcher holds). Only the rows whose id was found waiting come here."""
    by_endpoint: dict[str, list[Record]] = {}
    for record in records:
        by_endpoint.setdefault(record.endpoint, []).append(record)
    for endpoint, rows in by_endpoint.items():
        store = open_sync_store(url)
        try:
            store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
            if not isinstance(store, SyncReplacingStore):
                raise ConfigurationError(
                    f"{redact(url)} cannot replace a waiting message; use --if-exists keep."
                )
            for record in rows:
                try:
                    outcome = store.put(to_message(record), IfExists.REPLACE).outcome
                except MessageInFlight:
                    done.in_flight += 1
                    continue
                if outcome == "replaced":
                    done.replaced += 1
                else:  # forwarded or cancelled since the look: stored new
                    done.stored += 1
        finally:
            store.close()
