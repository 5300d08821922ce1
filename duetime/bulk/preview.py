"""``duetime bulk migrate --mode preview``: what a migration would move, and every problem, changing nothing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duetime.bulk.frames import checked_rdd, file_kind
from duetime.bulk.sources import Batch, DbSource
from duetime.clock import SYSTEM, from_micros, to_micros
from duetime.sqldb import Database


@dataclass(frozen=True)
class Group:
    endpoint: str
    destination: str
    count: int
    earliest: datetime | None
    latest: datetime | None


@dataclass
class Preview:
    total: int = 0
    groups: list[Group] = field(default_factory=list)
    #: (endpoint, message id, what is wrong), at most ``limit`` of them
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    problem_counts: dict[str, int] = field(default_factory=dict)

    @property
    def problem_total(self) -> int:
        return sum(self.problem_counts.values())


def source_rdd(
    spark: Any,
    source_url: str,
    endpoint: str | None,
    cutoff_us: int | None,
    batch_rows: int = 100_000,
    *,
    in_flight: bool = False,
) -> Any:
    """Every selected source row as a checked record, read in parallel partitions."""
    kind = file_kind(source_url)
    if kind is not None:
        rdd = checked_rdd(spark, kind[1], kind[0], endpoint)
        return (
            rdd
            if cutoff_us is None
            else rdd.filter(lambda p: p[0].due_us is None or p[0].due_us >= cutoff_us)
        )
    source = DbSource(Database.from_url(source_url), in_flight=in_flight)
    now_us = to_micros(SYSTEM.now())
    batches = source.plan(endpoint, cutoff_us, now_us, batch_rows)
    url = source_url

    def read(batch: Batch) -> Any:
        from duetime.bulk.records import problem

        reader = DbSource(Database.from_url(url), in_flight=in_flight)
        for record in reader.read(batch, cutoff_us, now_us):
            yield record, problem(record)

    return spark.sparkContext.parallelize(batches, max(1, len(batches))).flatMap(read)


def preview(
    spark: Any, source_url: str, endpoint: str | None = None, cutoff: datetime | None = None, limit: int = 200
) -> Preview:
    cutoff_us = None if cutoff is None else to_micros(cutoff)
    rdd = source_rdd(spark, source_url, endpoint, cutoff_us).cache()
    try:
        groups = (
            rdd.map(lambda p: ((p[0].endpoint, p[0].destination or ""), (1, p[0].due_us, p[0].due_us)))
            .reduceByKey(_merge)
            .collect()
        )
        problems = rdd.filter(lambda p: p[1] is not None).map(
            lambda p: (p[0].endpoint, p[0].message_id, str(p[1]))
        )
        dupes = (
            rdd.map(lambda p: ((p[0].endpoint, p[0].message_id), 1))
            .reduceByKey(lambda a, b: a + b)
            .filter(lambda kv: kv[1] > 1)
            .map(lambda kv: (kv[0][0], kv[0][1], f"duplicate id: {kv[1]} rows share it"))
        )
        found = problems.union(dupes)
        counts = Counter(
            dict(found.map(lambda p: (_kind(p[2]), 1)).reduceByKey(lambda a, b: a + b).collect())
        )
        sample = found.take(limit)
    finally:
        rdd.unpersist()
    result = Preview(problem_counts=dict(counts), problems=sorted(sample))
    for (name, destination), (count, lo, hi) in sorted(groups):
        result.total += count
        result.groups.append(Group(name, destination, count, _moment(lo), _moment(hi)))
    return result


def _merge(
    a: tuple[int, int | None, int | None], b: tuple[int, int | None, int | None]
) -> tuple[int, int | None, int | None]:
    lows = [x for x in (a[1], b[1]) if x is not None]
    highs = [x for x in (a[2], b[2]) if x is not None]
    return a[0] + b[0], min(lows, default=None), max(highs, default=None)


def _moment(micros: int | None) -> datetime | None:
    if micros is None:
        return None
    try:
        return from_micros(micros)
    except (OverflowError, ValueError):
        return None


def _kind(reason: str) -> str:
    """A short name for a problem, to count them by kind."""
    text = reason.lower()
    for needle, name in (
        ("destination", "invalid or missing destination"),
        ("due time", "due time missing or out of range"),
        ("due_at", "due time missing or out of range"),
        ("duplicate", "duplicate id"),
        ("header", "unreadable headers"),
        ("message_id", "invalid id"),
        ("endpoint", "no endpoint"),
    ):
        if needle in text:
            return name
    return "other"
