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
from duetime.bulk.migrate import MigrationResult, MigrationSpec, Progress, migrate
from duetime.bulk.preview import source_frame
from duetime.clock import to_micros
from duetime.errors import ConfigurationError


@dataclass(frozen=True)
class Exported:
    rows: int
    path: str


def export(
    spark: Any, source_url: str, to: str, endpoint: str | None = None, cutoff: datetime | None = None
) -> Exported:
    kind = file_kind(to)
    if kind is None:
        raise ConfigurationError(
            f"Export writes files: --to parquet:/folder or jsonl:/folder, not {to.split('@')[-1]!r}."
        )
    fmt, path = kind
    target = FileTarget(path, fmt)
    folder = target.check(spark)  # before a row is read
    frame = source_frame(
        spark,
        source_url,
        endpoint,
        None if cutoff is None else to_micros(cutoff),
        in_flight=True,
        check=False,
    )
    # The count comes from the committed files, not from what was sent their way.
    return Exported(target.write(spark, frame, folder), folder.uri)


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
    if file_kind(source) is None:
        raise ConfigurationError(
            f"Import reads files: --from parquet:/folder or jsonl:/folder, not {source.split('@')[-1]!r}."
        )
    return migrate(spark, MigrationSpec(source, store_url, endpoint, batch_rows=batch_rows), progress)
