"""``duetime bulk migrate --mode preview``: what a migration would move, and every problem, changing nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from duetime.bulk.frames import Checked, batch_frame, checked_files, file_kind, record_frame
from duetime.bulk.layouts import TOOL_CUTOFF, TOOL_CUTOFF_US, TimeoutDataLayout
from duetime.bulk.progress import RowCounter
from duetime.bulk.sources import Batch, DbSource, left_before
from duetime.bulk.targets import open_target
from duetime.clock import SYSTEM, from_micros, to_micros
from duetime.registry import open_sql_database


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


def source_frame(
    spark: Any,
    source_url: str,
    endpoint: str | None,
    cutoff_us: int | None,
    batch_rows: int = 100_000,
    *,
    in_flight: bool = False,
    renames: dict[str, str] | None = None,
    check: bool = True,
    counter: RowCounter | None = None,
) -> Any:
    """Every selected source row as a record frame (:data:`~duetime.bulk.frames.RECORD_SCHEMA`),
    read in parallel partitions: key ranges of a database, or Spark's splits of files. Without
    ``check`` the rows of a database are not checked (half the cost of an export), and a
    ``counter`` counts them as they are read, expecting the rows the batches were planned with."""
    from pyspark.sql import functions as F

    kind = file_kind(source_url)
    if kind is not None:
        frame = checked_files(spark, kind[1], kind[0], endpoint)
        return (
            frame
            if cutoff_us is None
            else frame.where(F.col("due_us").isNull() | (F.col("due_us") >= cutoff_us))
        )
    source = DbSource(open_sql_database(source_url), in_flight=in_flight, renames=renames)
    now_us = to_micros(SYSTEM.now())
    batches = source.plan(endpoint, cutoff_us, now_us, batch_rows)
    url = source_url

    if not check:
        if counter is not None:
            counter.total = sum(batch.planned for batch in batches)

        def chunks(batch: Batch) -> Iterator[Any]:
            read = DbSource(open_sql_database(url), in_flight=in_flight).read_batches(
                batch, cutoff_us, now_us
            )
            return read if counter is None else counter.counted(read)

        return batch_frame(spark, batches, chunks)

    def read(batch: Batch) -> Iterator[Checked]:
        from duetime.bulk.records import problem

        reader = DbSource(open_sql_database(url), in_flight=in_flight)
        for record in reader.read(batch, cutoff_us, now_us):
            yield record, problem(record)

    return record_frame(spark, batches, read)


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
    from pyspark.sql import functions as F

    # One read of the source: the columns the preview needs (never the bodies) are cached.
    frame = (
        source_frame(spark, source_url, endpoint, cutoff_us, renames=renames)
        .select(
            "endpoint",
            "message_id",
            F.coalesce("destination", F.lit("")).alias("destination"),
            "due_us",
            "problem",
        )
        .cache()
    )
    try:
        groups = [
            ((r[0], r[1]), (int(r[2]), r[3], r[4]))
            for r in frame.groupBy("endpoint", "destination")
            .agg(F.count(F.lit(1)), F.min("due_us"), F.max("due_us"))
            .collect()
        ]
        problems = frame.where(F.col("problem").isNotNull()).select("endpoint", "message_id", "problem")
        dupes = (
            frame.groupBy("endpoint", "message_id")
            .count()
            .where(F.col("count") > 1)
            .select(
                "endpoint",
                "message_id",
                F.concat(F.lit("duplicate id: "), F.col("count").cast("string"), F.lit(" rows share it")),
            )
        )
        found = problems.union(dupes)
        counts = Counter({r[0]: int(r[1]) for r in found.groupBy(_kind_column("problem")).count().collect()})
        sample = [tuple(r) for r in found.limit(limit).collect()]
        due_soon = {
            r[0]: int(r[1])
            for r in frame.where(F.col("due_us") < soon_us).groupBy("endpoint").count().collect()
        }
    finally:
        frame.unpersist()
    result = Preview(problem_counts=dict(counts), problems=sorted(sample))
    for name, count in sorted(due_soon.items()):
        result.warnings.append(
            f"{count:,} timeouts of {name} are due within {SOON.total_seconds() / 3600:g} hours: they may "
            "fire on the old endpoint while the migration runs; migrate them later (a --cutoff) or accept it."
        )
    if file_kind(source_url) is None:
        described = DbSource(open_sql_database(source_url), renames=renames)
        _describe_tables(result, described, endpoint)
        if cutoff_us is None and isinstance(described.layout, TimeoutDataLayout):
            older = left_before(described, described.tables(endpoint), TOOL_CUTOFF_US)
            if older:
                result.warnings.append(
                    f"{older:,} timeouts are due before {TOOL_CUTOFF.date()} and stay where they are: "
                    "without --cutoff that is the timeout migration tool's cutoff, and NServiceBus "
                    "never sends them either. Give --cutoff to choose another."
                )
        if target_url is not None:
            source = DbSource(open_sql_database(source_url), renames=renames)
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


def _moment(micros: int | None) -> datetime | None:
    if micros is None:
        return None
    try:
        return from_micros(micros)
    except (OverflowError, ValueError):
        return None


#: A short name for a problem, to count them by kind: the first needle its text contains.
KINDS = (
    ("destination", "invalid or missing destination"),
    ("due time", "due time missing or out of range"),
    ("due_at", "due time missing or out of range"),
    ("duplicate", "duplicate id"),
    ("header", "unreadable headers"),
    ("message_id", "invalid id"),
    ("endpoint", "no endpoint"),
)


def _kind_column(name: str) -> Any:
    from pyspark.sql import functions as F

    text = F.lower(F.col(name))
    kind = F.lit("other")
    for needle, label in reversed(KINDS):
        kind = F.when(text.contains(needle), F.lit(label)).otherwise(kind)
    return kind.alias("kind")
