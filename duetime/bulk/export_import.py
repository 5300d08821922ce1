"""``duetime bulk export`` and ``import``: a store to Parquet (or JSON Lines) and back, byte for byte.

Export reads every stored message, in flight or not, in parallel partitions and writes the ids,
due times (to the microsecond), headers (the JSON text as stored), bodies and failure counts.
Import writes them back through idempotent, ledgered batches: importing twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duetime.bulk.filetarget import FileTarget
from duetime.bulk.frames import file_kind
from duetime.bulk.migrate import MigrationResult, MigrationSpec, check_urls, migrate
from duetime.bulk.preview import source_frame
from duetime.bulk.progress import Progress, RowCounter, watched
from duetime.clock import to_micros
from duetime.errors import ConfigurationError


@dataclass(frozen=True)
class Exported:
    rows: int
    path: str


def export(
    spark: Any,
    source_url: str,
    to: str,
    endpoint: str | None = None,
    cutoff: datetime | None = None,
    progress: Progress | None = None,
) -> Exported:
    """Every stored message of ``source_url`` into files at ``to``; ``progress`` is told the rows
    read of the rows the store held when the export was planned."""
    fmt, path = check_export(source_url, to)
    target = FileTarget(path, fmt)
    folder = target.check(spark)  # before a row is read
    counter = RowCounter(spark)
    frame = source_frame(
        spark,
        source_url,
        endpoint,
        None if cutoff is None else to_micros(cutoff),
        in_flight=True,
        check=False,
        counter=counter,
    )
    # The count comes from the committed files, not from what was sent their way.
    rows = watched(lambda: target.write(spark, frame, folder), counter.reporter("exporting", progress))
    if progress is not None:
        progress("exporting", rows, rows)
    return Exported(rows, folder.uri)


def import_(
    spark: Any,
    source: str,
    store_url: str,
    endpoint: str | None = None,
    progress: Progress | None = None,
    batch_rows: int = 100_000,
) -> MigrationResult:
    """Files written by :func:`export` (or any rows with the accepted columns) into a store, in
    ledgered batches of about ``batch_rows`` rows (one Spark task each)."""
    check_import(source, store_url)
    return migrate(spark, MigrationSpec(source, store_url, endpoint, batch_rows=batch_rows), progress)


def check_export(source_url: str, to: str) -> tuple[str, str]:
    """An export's ``--from`` and ``--to`` as far as they can be checked without Spark or a
    connection (the CLI asks before Spark takes seconds to start): the files' format and path."""
    kind = file_kind(to)
    if kind is None:
        raise ConfigurationError(
            f"Export writes files: --to parquet:/folder or jsonl:/folder, not {to.split('@')[-1]!r}."
        )
    check_urls(source_url, None)
    return kind


def check_import(source: str, store_url: str) -> None:
    """An import's ``--from`` and ``--to``, checked as :func:`check_export` checks an export's."""
    if file_kind(source) is None:
        raise ConfigurationError(
            f"Import reads files: --from parquet:/folder or jsonl:/folder, not {source.split('@')[-1]!r}."
        )
    check_urls(source, store_url)
