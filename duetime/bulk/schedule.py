"""``duetime bulk schedule``: a delayed message for every row of a DataFrame or file.

Valid rows are stored exactly once per job, even when the job is re-run after some of its messages
were already delivered (the ids a job scheduled are kept beside the store). Rows that fail
validation are written, with the reason, to a rejects folder of JSON Lines.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duetime.bulk.frames import Checked, checked_frame, checked_rdd, file_kind
from duetime.bulk.targets import StoreTarget, record_to_json
from duetime.errors import ConfigurationError
from duetime.sqldb import Database


@dataclass(frozen=True)
class Scheduled:
    rows: int
    stored: int
    #: valid rows this job had stored before (a re-run), or whose id the store already held
    skipped: int
    rejected: int
    rejects_path: str | None


def schedule(
    spark: Any,
    rows: Any,
    store_url: str,
    *,
    endpoint: str | None = None,
    job: str,
    rejects: str | None = None,
) -> Scheduled:
    """Schedule ``rows``: a DataFrame, or a ``parquet:``/``jsonl:`` path."""
    if not job or len(job) > 64:
        raise ConfigurationError(
            "Name the job (--job, at most 64 characters): a re-run with the same name never doubles a message."
        )
    if isinstance(rows, str):
        kind = file_kind(rows)
        if kind is None:
            raise ConfigurationError(f"{rows!r} is not a parquet: or jsonl: path.")
        checked = checked_rdd(spark, kind[1], kind[0], endpoint)
    else:
        checked = checked_frame(rows, endpoint)
    checked = checked.cache()
    try:
        target = StoreTarget(Database.from_url(store_url))
        endpoints = sorted(
            set(checked.filter(lambda p: p[1] is None).map(lambda p: p[0].endpoint).distinct().collect())
        )
        target.prepare(endpoints)
        url = store_url

        def write(pairs: Any) -> list[tuple[int, int, int]]:
            part = list(pairs)
            valid = [r for r, why in part if why is None]
            written = StoreTarget(Database.from_url(url)).write_once(job, valid) if valid else None
            stored = 0 if written is None else written.inserted
            return [(len(part), stored, len(valid) - stored)]

        counts = checked.mapPartitions(write).collect()
        rejected_rows = checked.filter(lambda p: p[1] is not None)
        rejected = int(rejected_rows.count())
        path = None
        if rejected:
            path = rejects or f"rejects-{job}"
            if Path(path).exists():
                shutil.rmtree(path)
            rejected_rows.map(_reject_line).coalesce(1).saveAsTextFile(path)
    finally:
        checked.unpersist()
    total = sum(c[0] for c in counts)
    return Scheduled(total, sum(c[1] for c in counts), sum(c[2] for c in counts), rejected, path)


def _reject_line(pair: Checked) -> str:
    record, reason = pair
    data = record_to_json(record)
    data["reason"] = reason
    return json.dumps(data, ensure_ascii=False)
