"""``duetime bulk report``: a store's backlog and the dispatcher's lateness, as numbers, CSV and HTML.

The backlog is read from the store in parallel partitions (in-flight messages included), and
counted by the server itself where it can (:mod:`duetime.bulk.server_backlog`); lateness comes
from the dispatcher's delivery log (``duetime run --delivery-log …``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from duetime.bulk.hadoopfs import Folder, input_files
from duetime.bulk.preview import source_frame
from duetime.bulk.progress import Progress, RowCounter, watched
from duetime.bulk.server_backlog import count_in_server, planned
from duetime.bulk_interfaces import STATE_TABLES, SqlDatabase
from duetime.clock import SYSTEM, from_micros, to_micros
from duetime.errors import ConfigurationError
from duetime.interfaces import HELD_OUTCOME
from duetime.registry import open_sql_database

#: Due-time buckets, from now: (name, upper bound in seconds from now; None = no bound)
HORIZONS: tuple[tuple[str, float | None], ...] = (
    ("overdue", 0.0),
    ("next minute", 60.0),
    ("next hour", 3600.0),
    ("next day", 86400.0),
    ("next week", 7 * 86400.0),
    ("later", None),
)


#: The lateness periods a report may group by, and their length.
PERIOD_LENGTHS = {
    "second": timedelta(seconds=1),
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}


@dataclass(frozen=True)
class Lateness:
    period_start: datetime
    deliveries: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    dead_lettered: int


@dataclass
class Report:
    generated_at: datetime
    total: int = 0
    by_destination: list[tuple[str, int]] = field(default_factory=list)
    horizons: list[tuple[str, int]] = field(default_factory=list)
    failures: list[tuple[int, int]] = field(default_factory=list)
    #: (size in bytes, endpoint, message id, destination)
    largest: list[tuple[int, str, str, str]] = field(default_factory=list)
    lateness: list[Lateness] = field(default_factory=list)
    lateness_period: str = "minute"

    @classmethod
    def counted(
        cls,
        moment: datetime,
        by_destination: Mapping[str, int],
        horizons: Mapping[str, int],
        failures: Mapping[int, int],
        largest: list[tuple[int, str, str, str]],
    ) -> Report:
        """The report of counts however they were made (by Spark from the rows, or by the server):
        the largest destinations first, the due-time buckets in their order."""
        return cls(
            moment,
            total=sum(by_destination.values()),
            by_destination=sorted(by_destination.items(), key=lambda kv: (-kv[1], kv[0])),
            horizons=[(name, horizons.get(name, 0)) for name, _ in HORIZONS],
            failures=sorted(failures.items()),
            largest=largest,
        )

    @property
    def lateness_step(self) -> timedelta:
        """How long one lateness period is."""
        return PERIOD_LENGTHS[self.lateness_period]


def backlog(
    spark: Any,
    store_url: str,
    endpoint: str | None = None,
    now: datetime | None = None,
    top: int = 10,
    progress: Progress | None = None,
) -> Report:
    """What the store holds, counted by destination, due time, failures and size; ``progress`` is
    told the rows read of the rows the store held when the report was planned."""
    moment = now or SYSTEM.now()
    now_us = to_micros(moment)
    batches = planned(store_url, endpoint, now_us)
    if batches is not None:  # the server counts: only the figures cross the network
        f = count_in_server(spark, store_url, batches, now_us, HORIZONS, top, progress)
        return Report.counted(moment, f.by_destination, f.horizons, f.failures, f.largest)
    from pyspark.sql import functions as F

    counter = RowCounter(spark)
    frame = source_frame(spark, store_url, endpoint, None, in_flight=True, check=False, counter=counter)
    ahead = (F.col("due_us") - F.lit(now_us)) / 1e6
    horizon = F.lit("later")
    for name, bound in reversed(HORIZONS):
        if bound is not None:
            horizon = F.when(F.col("due_us").isNotNull() & (ahead <= bound), F.lit(name)).otherwise(horizon)
    # One read of the store: the few columns the report needs (never the bodies) are cached.
    slim = frame.select(
        F.coalesce("destination", F.lit("")).alias("destination"),
        horizon.alias("horizon"),
        "failure_count",
        # body bytes, as `list`, `show` and the dashboard count a message's size
        F.coalesce(F.length("body"), F.lit(0)).alias("size"),
        "endpoint",
        "message_id",
    ).cache()
    try:
        # the first action reads the store (and fills the cache): the one worth watching
        by_destination = watched(
            lambda: slim.groupBy("destination").count().collect(), counter.reporter("reading", progress)
        )
        return Report.counted(
            moment,
            {r[0]: int(r[1]) for r in by_destination},
            {r[0]: int(r[1]) for r in slim.groupBy("horizon").count().collect()},
            {int(r[0]): int(r[1]) for r in slim.groupBy("failure_count").count().collect()},
            [
                (int(r[0]), r[1], r[2], r[3])
                for r in slim.orderBy(F.col("size").desc(), "message_id")
                .select("size", "endpoint", "message_id", "destination")
                .limit(top)
                .collect()
            ],
        )
    finally:
        slim.unpersist()


def lateness(spark: Any, log: str, period: str = "minute") -> list[Lateness]:
    """Per period of dispatch time: deliveries and lateness percentiles, from the delivery log."""
    from pyspark.sql import functions as F

    frame = _log_frame(spark, log)
    unit = int(PERIOD_LENGTHS[period].total_seconds() * 1_000_000)
    rows = (
        frame.withColumn("period", (F.col("dispatched_us") / unit).cast("long") * unit)
        # a limit's wait is not lateness: left out of the percentiles, counted in n
        .withColumn(
            "late_ms",
            F.when(F.col("outcome") == HELD_OUTCOME, F.lit(None)).otherwise(
                (F.col("dispatched_us") - F.col("due_us")) / 1000.0
            ),
        )
        .groupBy("period")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.percentile_approx("late_ms", 0.5, 10000).alias("p50"),
            F.percentile_approx("late_ms", 0.99, 10000).alias("p99"),
            F.max("late_ms").alias("mx"),
            F.sum(F.when(F.col("outcome") == "dead-lettered", 1).otherwise(0)).alias("dead"),
        )
        .orderBy("period")
        .collect()
    )
    return [
        Lateness(
            from_micros(int(r["period"])),
            int(r["n"]),
            float(r["p50"] or 0.0),  # a period of held deliveries only has no lateness: 0
            float(r["p99"] or 0.0),
            float(r["mx"] or 0.0),
            int(r["dead"]),
        )
        for r in rows
    ]


def check_log(log: str) -> SqlDatabase | None:
    """The ``--delivery-log`` URL as far as it can be checked without Spark or a connection (the
    CLI asks before Spark starts): a ``jsonl:`` folder is left to Spark (None), else the database."""
    if log.partition(":")[0] == "jsonl":
        return None
    try:
        return open_sql_database(log)
    except ConfigurationError:
        raise ConfigurationError(
            f"--delivery-log takes jsonl:/folder (the dispatcher's JSON Lines files) or a database "
            f"URL, not {log!r}."
        ) from None


def _log_frame(spark: Any, log: str) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("due_us", LongType()),
            StructField("dispatched_us", LongType()),
            StructField("outcome", StringType()),
        ]
    )
    db = check_log(log)
    if db is None:  # jsonl:
        rest = log.partition(":")[2]
        # a Hadoop path (jsonl:hdfs://nn/logs), never pathlib's, which folds the "//" of a URI
        files = f"{rest.rstrip('/')}/*.jsonl"
        if not Folder(spark, rest).exists():
            input_files(spark, rest)  # one line, "does not exist", not Spark's missing-path error
        if not Folder(spark, files).files():
            # the folder a dispatcher made at its start, before its first delivery: none yet
            return spark.createDataFrame([], schema)
        raw = spark.read.json(files)
        held = (
            F.when(F.col("held_ms").isNotNull(), F.lit(HELD_OUTCOME)).otherwise(F.col("outcome"))
            if "held_ms" in raw.columns
            else F.col("outcome")
        )
        return raw.select(
            F.unix_micros(F.to_timestamp("due_at")).alias("due_us"),
            F.unix_micros(F.to_timestamp("dispatched_at")).alias("dispatched_us"),
            held.alias("outcome"),
        )
    with db.session(write=False) as conn:  # unreachable or without a log: one line, on the driver
        if not db.table_exists(conn, STATE_TABLES["log"]):
            raise ConfigurationError(
                f"{db.display} has no delivery log ({STATE_TABLES['log']}); run the dispatcher with "
                "--delivery-log pointing there first."
            )
    url = log

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for _ in batches:  # one task, one scan of the table, streamed in bounded chunks
            d = open_sql_database(url)
            with d.session(write=False) as conn:
                for rows in d.stream(conn, d.query("log_rows"), (), size=50_000):
                    columns = list(zip(*rows, strict=True))
                    yield pa.RecordBatch.from_arrays(
                        [
                            pa.array(columns[0], pa.int64()),
                            pa.array(columns[1], pa.int64()),
                            pa.array(columns[2], pa.string()),
                        ],
                        names=["due_us", "dispatched_us", "outcome"],
                    )

    return spark.range(0, 1, 1, 1).mapInArrow(read, schema)


# -- output ------------------------------------------------------------------------------------------


def write_csv(report: Report, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    tables: dict[str, tuple[Sequence[str], Sequence[Sequence[Any]]]] = {
        "destinations.csv": (("destination", "messages"), report.by_destination),
        "due_histogram.csv": (("due", "messages"), report.horizons),
        "failures.csv": (("failure_count", "messages"), report.failures),
        "largest.csv": (("body_bytes", "endpoint", "message_id", "destination"), report.largest),
        "lateness.csv": (
            ("period_start", "deliveries", "p50_ms", "p99_ms", "max_ms", "dead_lettered"),
            [
                (x.period_start.isoformat(), x.deliveries, x.p50_ms, x.p99_ms, x.max_ms, x.dead_lettered)
                for x in report.lateness
            ],
        ),
    }
    written = []
    for name, (header, rows) in tables.items():
        path = folder / name
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            writer.writerows(rows)
        written.append(path)
    return written


def charts(report: Report) -> dict[str, bytes]:
    """PNG charts: the backlog by due time, the top destinations, lateness over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pictures: dict[str, bytes] = {}

    def save(name: str, fig: Any) -> None:
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=96)
        plt.close(fig)
        pictures[name] = buffer.getvalue()

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar([n for n, _ in report.horizons], [c for _, c in report.horizons], color="#3b7dd8")
    ax.set_title("Backlog by due time")
    ax.set_ylabel("messages")
    save("backlog.png", fig)

    top = report.by_destination[:10][::-1]
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.35 * len(top) + 1)))
    ax.barh([d for d, _ in top], [c for _, c in top], color="#4caf50")
    ax.set_title("Messages by destination (top 10)")
    save("destinations.png", fig)

    fig, ax = plt.subplots(figsize=(7, 3))
    draw_lateness(fig, ax, report)
    save("lateness.png", fig)
    return pictures


def draw_lateness(fig: Any, ax: Any, report: Report) -> None:
    """The lateness chart: p50, p99 and max per period, on a log scale past 1 ms."""
    if report.lateness:
        xs: list[Any] = [x.period_start for x in report.lateness]
        # markers: one period is a point, which a line alone does not draw
        ax.plot(xs, [x.p50_ms for x in report.lateness], label="p50", marker="o", markersize=3)
        ax.plot(xs, [x.p99_ms for x in report.lateness], label="p99", marker="o", markersize=3)
        ax.plot(xs, [x.max_ms for x in report.lateness], label="max", linestyle=":", marker=".")
        if len(xs) == 1:  # the axis around that one period, not matplotlib's default of years
            ax.set_xlim(xs[0] - report.lateness_step / 2, xs[0] + report.lateness_step / 2)
        ax.legend()
        ax.set_yscale("symlog", linthresh=1.0)  # a backlog's seconds and a steady state's ms, both readable
        fig.autofmt_xdate()
    else:
        ax.text(0.5, 0.5, "no delivery log given", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"Lateness per {report.lateness_period} (ms after due)")


def write_html(report: Report, path: Path) -> Path:
    pictures = charts(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, data in pictures.items():
        (path.parent / name).write_bytes(data)

    def img(name: str) -> str:
        return f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(pictures[name]).decode()}">'

    def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        return f"<table><tr>{head}</tr>{body}</table>"

    late = [
        (
            x.period_start.strftime("%Y-%m-%d %H:%M"),
            x.deliveries,
            f"{x.p50_ms:.1f}",
            f"{x.p99_ms:.1f}",
            f"{x.max_ms:.1f}",
            x.dead_lettered,
        )
        for x in report.lateness
    ]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>duetime report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:60em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:right}}th{{background:#f3f3f3}}img{{max-width:100%}}</style>
</head><body><h1>duetime backlog report</h1>
<p>{report.total:,} stored messages, as of {report.generated_at.isoformat(timespec="seconds")}.</p>
<h2>Due</h2>{img("backlog.png")}{table(("due", "messages"), report.horizons)}
<h2>Destinations</h2>{img("destinations.png")}{table(("destination", "messages"), report.by_destination[:50])}
<h2>Failures</h2>{table(("failure count", "messages"), report.failures)}
<h2>Largest messages</h2>{table(("body bytes", "endpoint", "message id", "destination"), report.largest)}
<h2>Lateness</h2>{img("lateness.png")}{table(("period", "deliveries", "p50 ms", "p99 ms", "max ms", "dead-lettered"), late)}
</body></html>"""
    path.write_text(page, encoding="utf-8")
    return path
