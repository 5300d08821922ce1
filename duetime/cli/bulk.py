"""``duetime bulk …``: the Spark jobs on the command line. PySpark is imported only when one runs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from duetime.cli.common import TransportOpt
from duetime.cli.terminal import console, err, fail, show
from duetime.errors import ConfigurationError, DuetimeError
from duetime.inputs.durations import parse_duration, parse_time
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact
from duetime.interfaces import IfExists

bulk_app = typer.Typer(
    help=(
        "Bulk work on Apache Spark (pip install 'duetime\\[spark]'; Java 17 or newer): migrate millions of stored "
        "timeouts between stores, schedule a message per row of a data set, export/import Parquet, and "
        "report a backlog. Local mode (local[*]) by default; --master spark://host:7077 (or yarn, k8s://…) "
        "runs on a cluster, and --conf key=value passes Spark settings through."
    ),
    no_args_is_help=True,
)


class Mode(StrEnum):
    preview = "preview"
    migrate = "migrate"
    abort = "abort"


MasterOpt = Annotated[
    str | None,
    typer.Option(
        "--master", help="Spark master: local[*] (default), local[4], spark://host:7077, yarn, k8s://…"
    ),
]
ConfOpt = Annotated[
    list[str] | None,
    typer.Option("--conf", help="Spark setting key=value; repeat for more (as spark-submit takes them)."),
]
BatchRowsOpt = Annotated[
    int,
    typer.Option(
        help="About this many rows per batch: one Spark task, and one transaction in the target, each "
        "(files are spread over batches by message id)."
    ),
]
EndpointOpt = Annotated[
    str | None, typer.Option("--endpoint", help="Only this endpoint (default: every endpoint found).")
]


@contextmanager
def _spark(master: str | None, conf: list[str] | None, reads: str | None = None) -> Iterator[Any]:
    """A Spark session; ``reads``: the files the job reads, refused first if this machine's disk
    can already tell they are not there (Spark takes seconds to start)."""
    from duetime.bulk.frames import file_kind
    from duetime.bulk.hadoopfs import check_readable_here
    from duetime.bulk.spark_session import parse_conf, spark_session

    settings = parse_conf(conf)
    kind = None if reads is None else file_kind(reads)
    if kind is not None:
        check_readable_here(kind[1], master, settings)
    with console.status("starting Spark…"):
        session = spark_session(master, settings)
    previous = signal.signal(signal.SIGINT, lambda *_: _stop(session))
    try:
        yield session
    finally:
        signal.signal(signal.SIGINT, previous)


def _warn_undeclared(spark: Any, rows: str, store: str, transport: str | None) -> None:
    """Before a job stores anything: a warning for each destination the files name that has no
    queue on the transport (as `duetime schedule` and `load` warn), since such messages would all
    go to the error queue when due. Advisory: files the job will refuse, a store not there yet or
    a transport that cannot answer leave the job's own checks to say what is wrong."""
    import asyncio
    import logging

    from duetime.bulk.frames import file_destinations, file_kind
    from duetime.bulk.hadoopfs import input_files
    from duetime.cli.common import can_warn_undeclared, warn_undeclared

    kind = file_kind(rows)
    if kind is None or not can_warn_undeclared(store, transport):
        return  # nothing to ask (a store not there yet, no transport): no pass over the files
    try:
        input_files(spark, kind[1])  # no files: the job says so, in its own words
        with console.status("looking at the destinations…"):
            names, more = file_destinations(spark, kind[1], kind[0])
    except Exception as error:
        logging.getLogger("duetime.cli").debug("could not read the destinations of %s: %s", rows, error)
        return
    asyncio.run(warn_undeclared(store, transport, names))
    if more:
        err.print(f"(the first {len(names):,} destinations were checked for a queue)")


#: Set by Ctrl-C while a job runs: whatever the job raises from then on is the stop.
_STOPPING = threading.Event()


def _stop(session: Any) -> None:
    """Ctrl-C during a job: Spark's jobs are cancelled from a thread of their own, and again
    every half second until the job gives up (one may start between two). PySpark's own handler
    cancels them on the thread that waits on the JVM, which py4j refuses with a traceback. A
    second Ctrl-C leaves at once, with the same line."""
    if _STOPPING.is_set():  # the second: what is committed is safe; the JVM ends with us
        _stopped()
        os._exit(130)
    _STOPPING.set()

    def cancel() -> None:
        with contextlib.suppress(Exception):  # the JVM may be going away: nothing left to cancel
            while True:
                session.sparkContext.cancelAllJobs()
                time.sleep(0.5)

    threading.Thread(target=cancel, name="duetime-cancel", daemon=True).start()


def _stopped() -> typer.Exit:
    # Every job commits batch by batch behind a ledger (files: only a complete folder counts),
    # so a stopped job loses nothing and the same command goes on from where it stopped.
    return fail(
        "what was committed stays; run the same command again to go on from there "
        "(or undo a migration with --mode abort).",
        code=130,
        label="stopped:",
    )


def _guard(action: Callable[[], None]) -> None:
    try:
        action()
    except KeyboardInterrupt:
        raise _stopped() from None
    except Exception as error:
        if _STOPPING.is_set():  # a job cancelled by Ctrl-C fails as it may: that is the stop
            raise _stopped() from None
        if isinstance(error, DuetimeError):
            raise fail(str(error)) from None
        # One of our errors raised in a Spark task reaches the driver inside Spark's own (a
        # PythonException holding the task's traceback): say it as the driver would have.
        ours = _TASK_ERROR.findall(str(error))
        if not ours:
            raise
        raise fail(ours[-1].strip()) from None


#: The last line of a task's traceback when it ended in a duetime error.
_TASK_ERROR = re.compile(r"^duetime\.errors\.\w+: (.+)$", re.MULTILINE)


def _cutoff(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


@bulk_app.command()
def migrate(
    source: Annotated[
        str,
        typer.Option(
            "--from",
            help="A duetime store (postgresql://…, mysql://…, sqlite:///…), a legacy table (add "
            "?layout=timeoutdata or ?layout=msmq, and &table=… if not the default name), or files "
            "(parquet:/dir, jsonl:/dir).",
        ),
    ],
    target: Annotated[
        str,
        typer.Option(
            "--to",
            help="A duetime store (postgresql://…, mysql://…, sqlite:///…, redis://…), parquet:/dir, "
            "jsonl:/dir, or RabbitMQ's native delays (amqp://…?native=duetime).",
        ),
    ],
    endpoint: EndpointOpt = None,
    cutoff: Annotated[
        str | None,
        typer.Option(help="Only messages due at or after this time (ISO 8601 with offset); the rest stay."),
    ] = None,
    rename: Annotated[
        list[str],
        typer.Option(
            help="FOUND=REAL: store the messages of source endpoint FOUND under endpoint REAL (a "
            "TimeoutData table of Shipping.Policy is named Shipping_Policy_TimeoutData). Repeatable."
        ),
    ] = [],  # noqa: B006
    mode: Annotated[
        Mode, typer.Option(help="preview changes nothing; migrate moves (resumable); abort puts back.")
    ] = Mode.preview,
    batch_rows: BatchRowsOpt = 100_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    master: MasterOpt = None,
    conf: ConfOpt = None,
) -> None:
    """Move stored timeouts to another store, safely: preview first, then migrate; abort undoes.

    A killed migration is resumed by running the same command again: nothing lost, nothing doubled.

    Example: duetime bulk migrate --from 'postgresql://db/legacy?layout=timeoutdata' --to postgresql://db/app --endpoint Sales --mode migrate
    """

    def go() -> None:
        from duetime.bulk.frames import file_kind
        from duetime.bulk.migrate import MigrationSpec, abort, check_urls, migrate, reach_source, reach_target

        renames = _renames(rename)
        spec = MigrationSpec(
            source, target, endpoint, _cutoff(cutoff), batch_rows, tuple(sorted(renames.items()))
        )
        check_urls(source, target)  # before Spark takes seconds to start
        if mode is Mode.abort:
            if file_kind(target) is None:
                result = abort(spec)
            else:  # what a run wrote to a folder is read through Spark
                with _spark(master, conf) as spark:
                    result = abort(spec, spark)
            _print_result(result, as_json)
            return
        reach_source(source, endpoint, renames)
        reach_target(target)
        with _spark(master, conf, reads=source) as spark:
            if mode is Mode.preview:
                from duetime.bulk.preview import preview

                with console.status("reading the source…"):
                    found = preview(spark, source, endpoint, spec.cutoff, target_url=target, renames=renames)
                _print_preview(found, as_json)
                return
            from duetime.cli.row_progress import RowReport  # (Rich's bar: only when a job runs)

            with RowReport("migrating") as report:
                result = migrate(spark, spec, report)
            _print_result(result, as_json)

    _guard(go)


def _renames(pairs: list[str]) -> dict[str, str]:
    renames: dict[str, str] = {}
    for pair in pairs:
        found, sep, real = pair.partition("=")
        if not sep or not found.strip() or not real.strip():
            raise typer.BadParameter(
                f"--rename {pair!r}: write FOUND=REAL, e.g. Shipping_Policy=Shipping.Policy"
            )
        renames[found.strip()] = check_name("endpoint", real.strip())
    return renames


def _print_preview(found: Any, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(asdict(found), default=str))
        return
    table = Table(title=f"{found.total:,} messages would move")
    for column in ("endpoint", "destination", "messages", "earliest due", "latest due"):
        table.add_column(column, justify="right" if column == "messages" else "left")
    for g in found.groups:
        table.add_row(g.endpoint, g.destination, f"{g.count:,}", str(g.earliest), str(g.latest))
    show(table)
    for source_table, endpoint in found.tables:
        console.print(f"table {source_table} -> endpoint {endpoint}")
    for warning in found.warnings:
        console.print(f"[yellow]warning:[/] {warning}", markup=True)
    for refusal in found.target_problems:
        console.print(f"[red]the target refuses:[/] {refusal}", markup=True)
    if found.target_problems:
        console.print("[red]a migration would not start until these are fixed[/]", markup=True)
    if found.problem_counts:
        console.print(
            f"[yellow]{found.problem_total:,} problems[/] (these stay where they are):", markup=True
        )
        for kind, count in sorted(found.problem_counts.items()):
            console.print(f"  {kind}: {count:,}")
        for name, ident, why in found.problems[:20]:
            console.print(f"  {name} {ident}: {why}")
    else:
        console.print("[green]no problems found[/]", markup=True)


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(asdict(result), default=str))
        return
    console.print(
        f"run {result.run_id or '-'} {result.status}: {result.inserted:,} moved, {result.put_back:,} put back "
        f"(of {result.staged:,} staged, {result.planned:,} planned, {result.batches} batches)"
    )
    for note in result.notes[:25]:
        console.print(f"  {note}")


@bulk_app.command()
def schedule(
    rows: Annotated[str, typer.Argument(help="Rows to schedule: parquet:/dir or jsonl:/file-or-dir.")],
    store: Annotated[str, typer.Option("--to", help="The duetime store, e.g. postgresql://db/app.")],
    job: Annotated[
        str, typer.Option(help="A name for this job: re-running it never stores a message twice.")
    ],
    endpoint: EndpointOpt = None,
    rejects: Annotated[
        str | None, typer.Option(help="Folder for rejected rows with reasons (JSON Lines).")
    ] = None,
    batch_rows: BatchRowsOpt = 100_000,
    spread: Annotated[
        str,
        typer.Option(
            "--spread",
            help="Spread the messages over this window after their due times (10m): each a moment "
            "of its own, chosen from its id (a re-run gives the same), so a million rows of one "
            "time do not fall due at once.",
        ),
    ] = "0",
    if_exists: Annotated[
        str,
        typer.Option(
            "--if-exists",
            help="When a row's id is waiting in the store: keep the stored message (the row is "
            "counted as skipped), or replace it with the row (body, headers, destination, group, due "
            "time; never one being delivered). A re-run of the job replaces nothing twice.",
        ),
    ] = "keep",
    transport: TransportOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
) -> None:
    """Schedule a delayed message for every row: destination, due_at, body, headers, optional id.

    Destinations with no queue on the transport (--transport, else the store's own queue tables)
    are warned about before anything is stored.

    Example: duetime bulk schedule parquet:/data/reminders --to postgresql://db/app --endpoint crm --job reminders-2026-11
    """

    def go() -> None:
        from duetime.bulk.migrate import reach_target
        from duetime.bulk.schedule import bulk_if_exists, check_schedule
        from duetime.bulk.schedule import schedule as run

        how = bulk_if_exists(if_exists)
        check_schedule(rows, store, job=job, endpoint=endpoint, batch_rows=batch_rows)  # before Spark starts
        window = parse_duration(spread)
        reach_target(store)
        with _spark(master, conf, reads=rows) as spark:
            _warn_undeclared(spark, rows, store, transport)
            from duetime.cli.row_progress import RowReport  # (Rich's bar: only when a job runs)

            with RowReport("scheduling") as report:
                done = run(
                    spark,
                    rows,
                    store,
                    endpoint=endpoint,
                    job=job,
                    rejects=rejects,
                    batch_rows=batch_rows,
                    progress=report,
                    spread=window,
                    if_exists=how,
                )
        replaced = f", {done.replaced:,} replaced" if how is IfExists.REPLACE else ""
        console.print(
            f"{done.rows:,} rows: {done.stored:,} stored{replaced}, {done.skipped:,} already scheduled, "
            f"{done.rejected:,} rejected"
        )
        if done.in_flight:
            console.print(
                f"{done.in_flight:,} rows not stored: a dispatcher was delivering the message with "
                "their id as it was, so it was not replaced."
            )
        if done.rejects_path:
            console.print(f"rejected rows and reasons: {done.rejects_path}")

    _guard(go)


@bulk_app.command("export")
def export_(
    store: Annotated[str, typer.Option("--from", help="The duetime store to read.")],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="parquet:/dir or jsonl:/dir, replaced whole: a new or empty folder, or an earlier export.",
        ),
    ],
    endpoint: EndpointOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace a folder that holds other files too (never the current folder or a home).",
        ),
    ] = False,
    decrypt: Annotated[
        bool,
        typer.Option(
            "--decrypt",
            help="Write sealed messages opened, with the keyring DUETIME_ENCRYPTION_KEYS names "
            "(without it they are written sealed, as stored: a backup stays unreadable).",
        ),
    ] = False,
    master: MasterOpt = None,
    conf: ConfOpt = None,
) -> None:
    """Write every stored message (ids, due times, headers, bodies, failure counts) to files."""

    def go() -> None:
        from duetime.bulk.export_import import check_export, decrypting_key, export
        from duetime.bulk.migrate import reach_source

        check_export(store, to)  # before Spark takes seconds to start
        if decrypt:
            decrypting_key()
        reach_source(store, endpoint)
        from duetime.cli.row_progress import RowReport  # (Rich's bar: only when a job runs)

        with _spark(master, conf) as spark, RowReport("exporting") as report:
            done = export(spark, store, to, endpoint, progress=report, overwrite=overwrite, decrypt=decrypt)
        console.print(f"{done.rows:,} messages written to {done.path}")
        if done.still_sealed:
            console.print(
                f"{done.still_sealed:,} written still encrypted: their key is not in the keyring "
                "(`duetime keys list` shows its keys)."
            )

    _guard(go)


@bulk_app.command("import")
def import_(
    files: Annotated[str, typer.Option("--from", help="parquet:/dir or jsonl:/dir, as export wrote it.")],
    store: Annotated[str, typer.Option("--to", help="The duetime store to fill.")],
    endpoint: EndpointOpt = None,
    batch_rows: BatchRowsOpt = 100_000,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    transport: TransportOpt = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
) -> None:
    """Load exported files into a store; importing the same files twice changes nothing.

    Destinations with no queue on the transport (--transport, else the store's own queue tables)
    are warned about before anything is stored."""

    def go() -> None:
        from duetime.bulk.export_import import check_import
        from duetime.bulk.export_import import import_ as run
        from duetime.bulk.frames import check_batch_rows
        from duetime.bulk.migrate import reach_target

        check_batch_rows(batch_rows)  # before Spark takes seconds to start
        check_import(files, store)
        reach_target(store)
        with _spark(master, conf, reads=files) as spark:
            _warn_undeclared(spark, files, store, transport)
            from duetime.cli.row_progress import RowReport  # (Rich's bar: only when a job runs)

            with RowReport("importing") as report:
                result = run(spark, files, store, endpoint, progress=report, batch_rows=batch_rows)
        _print_result(result, as_json)

    _guard(go)


@bulk_app.command()
def report(
    store: Annotated[
        str,
        typer.Option("--store", help="The duetime store whose backlog to report."),
    ],
    endpoint: EndpointOpt = None,
    delivery_log: Annotated[
        str | None,
        typer.Option(help="The dispatcher's delivery log (jsonl:/dir or a database URL) for lateness."),
    ] = None,
    period: Annotated[str, typer.Option(help="Lateness per second, minute, hour or day.")] = "minute",
    html: Annotated[Path | None, typer.Option(help="Write an HTML report with charts here.")] = None,
    csv_dir: Annotated[Path | None, typer.Option("--csv", help="Write CSV tables into this folder.")] = None,
    master: MasterOpt = None,
    conf: ConfOpt = None,
) -> None:
    """The backlog (by destination, by due time, failures, largest) and lateness over time."""
    if period not in ("second", "minute", "hour", "day"):
        raise typer.BadParameter("--period must be second, minute, hour or day")

    def go() -> None:
        from duetime.bulk import report as r
        from duetime.bulk.migrate import check_urls, reach_source

        # the report is small and written on this machine: a place it cannot go is said before
        # Spark counts anything, not after
        if html is not None:
            _can_write(html.parent, html)
        if csv_dir is not None:
            _can_write(csv_dir, None)
        check_urls(store, None)
        if delivery_log:
            r.check_log(delivery_log)
        reach_source(store, endpoint)
        with _spark(master, conf, reads=delivery_log) as spark:
            from duetime.cli.row_progress import RowReport  # (Rich's bar: only when a job runs)

            with RowReport("reading") as report:
                found = r.backlog(spark, store, endpoint, progress=report)
            if delivery_log:
                with console.status("reading the delivery log…"):
                    found.lateness = r.lateness(spark, delivery_log, period)
                found.lateness_period = period
        _print_report(found)
        if delivery_log and not found.lateness:
            console.print(f"{redact(delivery_log)} holds no deliveries yet: no lateness to show")
        if csv_dir is not None:
            for path in r.write_csv(found, csv_dir):
                console.print(f"wrote {path}")
        if html is not None:
            console.print(f"wrote {r.write_html(found, html)}")

    _guard(go)


def _can_write(folder: Path, file: Path | None) -> None:
    """``folder`` (made if missing) takes new files, and ``file`` is not a folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".duetime-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigurationError(
            f"cannot write the report into {folder}: {error.strerror or error}."
        ) from None
    if file is not None and file.is_dir():
        raise ConfigurationError(f"--html {file} is a folder; name the file, e.g. {file / 'report.html'}.")


def _print_report(found: Any) -> None:
    console.print(f"[bold]{found.total:,}[/] stored messages", markup=True)
    due = Table(title="due")
    due.add_column("when")
    due.add_column("messages", justify="right")
    for name, count in found.horizons:
        due.add_row(name, f"{count:,}")
    show(due)
    dest = Table(title="top destinations")
    dest.add_column("destination")
    dest.add_column("messages", justify="right")
    for name, count in found.by_destination[:10]:
        dest.add_row(name, f"{count:,}")
    show(dest)
    console.print("failure counts: " + (", ".join(f"{k}: {v:,}" for k, v in found.failures) or "none"))
    if found.largest:
        size, name, ident, destination = found.largest[0]
        console.print(f"largest: a body of {size:,} bytes ({name} {ident} → {destination})")
    if found.lateness:
        late = Table(title=f"lateness per {found.lateness_period}")
        for column in ("from", "deliveries", "p50 ms", "p99 ms", "max ms"):
            late.add_column(column, justify="right")
        for x in found.lateness[-15:]:
            late.add_row(
                x.period_start.strftime("%m-%d %H:%M"),
                f"{x.deliveries:,}",
                f"{x.p50_ms:.1f}",
                f"{x.p99_ms:.1f}",
                f"{x.max_ms:.1f}",
            )
        show(late)
