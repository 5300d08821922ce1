"""Parquet and JSON Lines folders as a bulk job's output, written by Spark for the whole cluster.

Records become a DataFrame through Arrow, one bounded chunk at a time (``mapInArrow``), and
Spark's writer commits the folder atomically. A migration writes each run into its own
``run=<id>`` folder under the target, so reading the target folder back reads every run, and a
crashed run is written again from scratch without touching the runs before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime.bulk.hadoopfs import Folder, check_writable, quiet
from duetime.bulk.records import Destination
from duetime.errors import ConfigurationError

FORMATS = ("parquet", "jsonl")


class FileTarget:
    """A folder of Parquet or JSON Lines files on any filesystem the cluster has."""

    def __init__(self, path: str, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ConfigurationError(f"Unknown file format {fmt!r}; use parquet or jsonl.")
        self.path = path
        self.format = fmt
        self.display = f"{fmt}:{path}"

    def check(self, spark: Any) -> Folder:
        """Refuse a folder the cluster cannot really write, before any message moves."""
        return check_writable(spark, self.path)

    def run_folder(self, spark: Any, run_id: str) -> Folder:
        return Folder(spark, self.path).child(f"run={run_id}")

    def write(self, spark: Any, frame: Any, folder: Folder) -> int:
        """Write a DataFrame of :func:`~duetime.bulk.frames.record_frame` rows, replacing whatever a crashed attempt
        left; returns the rows the committed folder holds, counted from the files."""
        write_frame(frame, self.format, folder)
        return rows_in(spark, folder, self.format)

    def problems(self, destinations: Sequence[Destination], now_us: int) -> list[str]:
        """A folder takes any valid message."""
        return []

    def forget(self, run_id: str) -> None:
        """Nothing to drop: a run's folder is the data it moved."""

    def rows(self, spark: Any, run_id: str) -> int | None:
        """Rows a run's committed folder holds; None when it never committed."""
        folder = self.run_folder(spark, run_id)
        return rows_in(spark, folder, self.format) if folder.committed() else None


def write_frame(frame: Any, fmt: str, folder: Folder, *, reasons: bool = False) -> None:
    """Records as Parquet (typed columns) or JSON Lines (the due time as ISO 8601 to the
    microsecond, the body in base64, and with ``reasons`` why each could not be used), committed."""
    from pyspark.sql import functions as F

    if fmt == "parquet":
        out = frame.select(
            "endpoint",
            "message_id",
            "destination",
            F.timestamp_micros("due_us").alias("due_at"),
            "headers",
            "body",
            "failure_count",
            "group",
        )
        # due_at as TIMESTAMP(MICROS, UTC): spark_session's spark.sql.parquet.outputTimestampType
        folder.written_by(out).write.mode("overwrite").parquet(folder.uri)
        return
    lines = frame.select(
        F.to_json(
            F.struct(
                "endpoint",
                "message_id",
                "destination",
                _iso_utc("due_us").alias("due_at"),
                "headers",
                F.base64("body").alias("body_base64"),
                "failure_count",
                "group",
                *([F.col("problem").alias("reason")] if reasons else []),
            ),
            {"ignoreNullFields": "false"},
        ).alias("value")
    )
    folder.written_by(lines).write.mode("overwrite").text(folder.uri)
    folder.rename_suffix(".txt", ".jsonl")  # JSON Lines, named so


def _iso_utc(column: str) -> Any:
    """µs since 1970 as ISO 8601 with microseconds and a +00:00 offset, computed by Spark."""
    from pyspark.sql import functions as F

    return F.date_format(F.timestamp_micros(column), "yyyy-MM-dd'T'HH:mm:ss.SSSSSSxxx")


def rows_in(spark: Any, folder: Folder, fmt: str) -> int:
    """Rows in a committed folder, read through Spark (Parquet counts from the file footers)."""
    if not folder.files():
        return 0
    with quiet(spark):
        reader = spark.read.parquet if fmt == "parquet" else spark.read.text
        return int(reader(folder.uri).count())
