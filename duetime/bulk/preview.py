"""``duetime bulk migrate --mode preview``: what a migration would move, and every problem, changing nothing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from duetime.bulk.frames import checked_rdd, file_kind
from duetime.bulk.sources import Batch, DbSource
from duetime.bulk.targets import open_target
from duetime.clock import SYSTEM, from_micros, to_micros
from duetime.sqldb import Database


@dataclass(frozen=True)
class Group:
    endpoint: str
    destination: str
    count: int
    earliest: datetime | None
    latest: datetime | None


#: The timeout migration tool's warning window: a timeout due this soon may fire on the old
#: endpoint while the migration runs.
SOON = timedelta(hours=4)


@dataclass
class Preview:
    total: int = 0
    groups: list[Group] = field(default_factory=list)
    #: (source table, the endpoint its messages are stored under), for database sources
    tables: list[tuple[str, str]] = field(default_factory=list)
    #: Things to know before migrating (timeouts due soon, endpoint names a table cannot tell)
    warnings: list[str] = field(default_factory=list)
    #: Why the target would refuse the migration (it would not start)
    target_problems: list[str] = field(default_factory=list)
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
    renames: dict[str, str] | None = None,
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
    source = DbSource(Database.from_url(source_url), in_flight=in_flight, renames=renames)
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
    spark: Any,
    source_url: str,
    endpoint: str | None = None,
    cutoff: datetime | None = None,
    limit: int = 200,
    *,
    target_url: str | None = None,
    renames: dict[str, str] | None = None,
) -> Preview:
    cutoff_us = None if cutoff is None else to_micros(cutoff)
    now_us = to_micros(SYSTEM.now())
    soon_us = to_micros(SYSTEM.now() + SOON)
    rdd = source_rdd(spark, source_url, endpoint, cutoff_us, renames=renames).cache()
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
        due_soon = dict(
            rdd.filter(lambda p: p[0].due_us is not None and p[0].due_us < soon_us)
            .map(lambda p: (p[0].endpoint, 1))
            .reduceByKey(lambda a, b: a + b)
            .collect()
        )
    finally:
        rdd.unpersist()
    result = Preview(problem_counts=dict(counts), problems=sorted(sample))
    for name, count in sorted(due_soon.items()):
        result.warnings.append(
            f"{count:,} timeouts of {name} are due within {SOON.total_seconds() / 3600:g} hours: they may "
            "fire on the old endpoint while the migration runs; migrate them later (a --cutoff) or accept it."
        )
    if file_kind(source_url) is None:
        _describe_tables(result, DbSource(Database.from_url(source_url), renames=renames), endpoint)
        if target_url is not None:
            source = DbSource(Database.from_url(source_url), renames=renames)
            wanted = source.destinations(source.tables(endpoint), cutoff_us, now_us)
            result.target_problems = open_target(target_url).problems(wanted, now_us)
    for (name, destination), (count, lo, hi) in sorted(groups):
        result.total += count
        result.groups.append(Group(name, destination, count, _moment(lo), _moment(hi)))
    return result


def _describe_tables(result: Preview, source: DbSource, endpoint: str | None) -> None:
    """Which endpoint each table's messages go to; a TimeoutData table name cannot tell
    ``Shipping.Policy`` from ``Shipping_Policy`` (both make ``Shipping_Policy_TimeoutData``)."""
    for name, table in source.tables(endpoint):
        result.tables.append((table, name))
        renamed = name != source.layout.endpoint_of(table) or endpoint is not None
        if source.layout.name == "timeoutdata" and "_" in name and not renamed:
            dotted = name.replace("_", ".")
            result.warnings.append(
                f"table {table}: stored under endpoint {name!r}; NServiceBus writes '.' as '_' in table "
                f"names, so if the endpoint is {dotted!r} (or another spelling) add --rename {name}={dotted}."
            )


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
