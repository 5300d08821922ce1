"""``duetime bulk export`` and ``import``: a store to Parquet (or JSON Lines) and back, byte for byte.

Export reads every stored message, in flight or not, in parallel partitions and writes the ids,
due times (to the microsecond), headers (the JSON text as stored), bodies and failure counts.
Import writes them back through idempotent, ledgered batches: importing twice changes nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duetime.bulk.filetarget import FileTarget
from duetime.bulk.frames import file_kind
from duetime.bulk.hadoopfs import Folder
from duetime.bulk.migrate import MigrationResult, MigrationSpec, check_urls, migrate
from duetime.bulk.preview import source_frame
from duetime.bulk.progress import Progress, RowCounter, watched
from duetime.bulk.sealing import opened_frame
from duetime.clock import to_micros
from duetime.encryption import sealer_from_environment
from duetime.errors import ConfigurationError


@dataclass(frozen=True)
class Exported:
    rows: int
    path: str
    #: with ``decrypt``: rows written still sealed (their key is not in the keyring)
    still_sealed: int = 0


def export(
    spark: Any,
    source_url: str,
    to: str,
    endpoint: str | None = None,
    cutoff: datetime | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    decrypt: bool = False,
) -> Exported:
    """Every stored message of ``source_url`` into files at ``to``; ``progress`` is told the rows
    read of the rows the store held when the export was planned. ``to`` is replaced only if it is
    empty or holds an earlier export, unless ``overwrite`` (never the current folder or a home).

    Sealed rows are written as they are stored (a backup stays sealed), or opened with
    ``decrypt`` by the keyring ``DUETIME_ENCRYPTION_KEYS`` names (those it cannot open stay
    sealed, and are counted)."""
    fmt, path = check_export(source_url, to)
    expected = decrypting_key() if decrypt else None
    check_replaceable(Folder(spark, path), to, overwrite)
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
    unreadable = spark.sparkContext.accumulator(0)
    if expected is not None:
        frame = opened_frame(frame, expected, unreadable)
    # The count comes from the committed files, not from what was sent their way.
    rows = watched(lambda: target.write(spark, frame, folder), counter.reporter("exporting", progress))
    if progress is not None:
        progress("exporting", rows, rows)
    return Exported(rows, folder.uri, int(unreadable.value))


def decrypting_key() -> str:
    """The driver's primary key id, for ``decrypt``; one line when there is no keyring."""
    sealer = sealer_from_environment(now=True)
    if sealer is None:
        raise ConfigurationError(
            "--decrypt opens sealed rows with the keyring: set DUETIME_ENCRYPTION_KEYS to its file."
        )
    return sealer.keyring.primary


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


#: What an export leaves in its folder: Spark's part files and commit marker, Hadoop's checksums.
EXPORT_FILES = re.compile(r"^\.?(part-.*|_SUCCESS)(\.crc)?$")


def check_replaceable(folder: Folder, given: str, overwrite: bool) -> None:
    """An export replaces its folder whole: refused, in one line, where that would destroy what
    duetime did not write (``--to jsonl:.`` wiped the current folder). A folder that is not there,
    is empty or holds an earlier export is fine; anything else needs ``overwrite``, and the
    current folder, a home folder and the root never are."""
    local = folder.on_this_disk
    if local is not None:
        here = os.path.realpath(local)
        homes = {os.path.realpath(os.path.expanduser("~")), "/root", "/home"}
        if here in {os.path.realpath(os.getcwd()), "/", *homes} or os.path.dirname(here) == "/home":
            raise ConfigurationError(
                f"{given}: an export replaces its folder whole, so it never writes into the current "
                "folder, a home folder or /; give it a folder of its own, e.g. --to jsonl:exports/duetime."
            )
    names = folder.names()
    strangers = [name for name in names if not EXPORT_FILES.match(name)]
    if strangers and not overwrite:
        shown = ", ".join(repr(n) for n in strangers[:3]) + (" ..." if len(strangers) > 3 else "")
        raise ConfigurationError(
            f"{given}: the folder holds files an export did not write ({shown}), and an export "
            "replaces its folder whole; give it a new or empty folder, or --overwrite to replace it."
        )


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
