"""``duetime bulk export`` and ``import``: a store to Parquet (or JSON Lines) and back, byte for byte.

Export reads every stored message, in flight or not, in parallel partitions and writes the ids,
due times (to the microsecond), headers (the JSON text as stored), bodies and failure counts.
Import writes them back through idempotent, ledgered batches: importing twice changes nothing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from duetime.bulk.frames import file_kind
from duetime.bulk.migrate import MigrationResult, MigrationSpec, Progress, migrate
from duetime.bulk.preview import source_rdd
from duetime.bulk.records import group_of
from duetime.bulk.targets import record_to_json
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
    rdd = source_rdd(
        spark, source_url, endpoint, None if cutoff is None else to_micros(cutoff), in_flight=True
    )
    records = rdd.map(lambda pair: pair[0]).cache()
    try:
        if Path(path).exists():
            shutil.rmtree(path)
        if fmt == "parquet":
            from pyspark.sql import functions as F
            from pyspark.sql.types import (
                BinaryType,
                IntegerType,
                LongType,
                StringType,
                StructField,
                StructType,
            )

            schema = StructType(
                [
                    StructField("endpoint", StringType()),
                    StructField("message_id", StringType()),
                    StructField("destination", StringType()),
                    StructField("due_us", LongType()),
                    StructField("headers", StringType()),
                    StructField("body", BinaryType()),
                    StructField("failure_count", IntegerType()),
                    StructField("group", StringType()),
                ]
            )
            frame = spark.createDataFrame(records.map(lambda r: (*r[:7], group_of(r))), schema)
            frame = frame.select(
                "endpoint",
                "message_id",
                "destination",
                F.timestamp_micros("due_us").alias("due_at"),
                "headers",
                "body",
                "failure_count",
                "group",
            )
            frame.write.parquet(path)
        else:
            records.map(lambda r: json.dumps(record_to_json(r), ensure_ascii=False)).saveAsTextFile(path)
        count = int(records.count())
    finally:
        records.unpersist()
    return Exported(count, path)


def import_(
    spark: Any, source: str, store_url: str, endpoint: str | None = None, progress: Progress | None = None
) -> MigrationResult:
    """Files written by :func:`export` (or any rows with the accepted columns) into a store."""
    if file_kind(source) is None:
        raise ConfigurationError(
            f"Import reads files: --from parquet:/folder or jsonl:/folder, not {source.split('@')[-1]!r}."
        )
    return migrate(spark, MigrationSpec(source, store_url, endpoint), progress)
