"""The ``duetime`` command: run the dispatcher, schedule and inspect delayed messages, try the demo."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from duetime.cli_bulk import bulk_app
from duetime.cli_rabbitmq import rabbitmq_app
from duetime.client import DelayedMessageClient
from duetime.clock import SystemClock
from duetime.deadline import within
from duetime.deliverylog import open_delivery_log
from duetime.dispatcher import Dispatcher, run_until_signal
from duetime.durations import parse_duration, parse_time
from duetime.errorqueue import ORIGINAL_DESTINATION, without_error_headers
from duetime.errors import ConfigurationError, DuetimeError, DuplicateMessageId, one_line
from duetime.frontdoor import FrontDoor
from duetime.interfaces import DelayedMessageStore, ReceivingTransport, TransactionalStore, Transport
from duetime.logs import LogFormat, configure, quiet_drivers
from duetime.message import DelayedMessage, check_due_time
from duetime.registry import open_store, open_transport
from duetime.settings import DelayedDeliverySettings, TransactionMode
from duetime.terminal import console, err, fail, guarded, say
from duetime.terminal import run_async as _run
from duetime.urls import redact

T = TypeVar("T")
DEFAULT_STORE = "sqlite:///duetime.db"

app = typer.Typer(
    help=(
        "duetime keeps delayed messages in a durable store and forwards each to its destination "
        "when it is due.\n\nStart with `duetime demo`. Then: `duetime setup`, `duetime queues declare "
        "orders`, `duetime schedule orders 'hello' --in 10s`, and `duetime run` to deliver."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
errors_app = typer.Typer(help="Inspect the error queue and send messages back for another try.")
queues_app = typer.Typer(
    help="Declare and consume the queues duetime delivers into (SQL queues, RabbitMQ, Redis, NATS)."
)
app.add_typer(errors_app, name="errors")
app.add_typer(queues_app, name="queues")
app.add_typer(bulk_app, name="bulk")
app.add_typer(rabbitmq_app, name="rabbitmq")

StoreOpt = Annotated[
    str,
    typer.Option(
        "--store", envvar="DUETIME_STORE", help="Where delayed messages are kept, e.g. sqlite:///duetime.db."
    ),
]
EndpointOpt = Annotated[
    str,
    typer.Option(
        "--endpoint", envvar="DUETIME_ENDPOINT", help="The endpoint; its table is <endpoint>.delayed."
    ),
]
TransportOpt = Annotated[
    str | None,
    typer.Option(
        "--transport",
        envvar="DUETIME_TRANSPORT",
        help="Where due messages go. Default: the queue tables in the store's own database (SQLite, PostgreSQL).",
    ),
]


def _transport_url(store: str, transport: str | None) -> str:
    """By default a store delivers into the queue tables of its own database (exactly-once capable)."""
    if transport:
        return transport
    if store.startswith("sqlite:"):
        return store.split("?")[0]
    if store.startswith(("postgresql:", "postgres:")):
        return store
    raise ConfigurationError(
        "Give --transport (or DUETIME_TRANSPORT): only SQLite and PostgreSQL stores have a default."
    )


async def _open(store_url: str, endpoint: str) -> DelayedMessageStore:
    store = open_store(_existing(store_url))
    await store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    return store


def _due(in_: str | None, at: str | None) -> dict[str, Any]:
    if (in_ is None) == (at is None):
        raise typer.BadParameter("give exactly one of --in (e.g. 10m) or --at (ISO 8601 time)")
    if in_ is not None:
        return {"delay": parse_duration(in_)}
    due = check_due_time(parse_time(at or ""), "--at")  # refused first, warned about after
    if due <= SystemClock().now():
        say(
            "warning:",
            "yellow",
            f"{due.isoformat()} has passed: the message is due now and goes at once.",
            to=err,
        )
    return {"due_at": due}


def _headers(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"header {pair!r} must look like name=value")
        headers[key] = value
    return headers


def _logging(verbose: bool, fmt: LogFormat = LogFormat.TEXT) -> None:
    configure(logging.DEBUG if verbose else logging.INFO, fmt)


def _version(value: bool) -> None:
    if value:
        from duetime import __version__

        print(f"duetime {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """duetime keeps delayed messages in a durable store and forwards each to its destination when
    it is due."""


def _safest_mode(store: DelayedMessageStore, transport: Transport) -> TransactionMode:
    """Exactly-once where the pair can keep it (one transaction moves a message), else at-least-once."""
    if isinstance(store, TransactionalStore) and store.shares_transaction_with(transport):
        return TransactionMode.EXACTLY_ONCE
    return TransactionMode.AT_LEAST_ONCE


def _existing(store_url: str) -> str:
    """A command that reads or changes a store must not create one as a side effect (a typo in a
    SQLite path would leave an empty file behind): only ``setup`` and ``run`` create."""
    if store_url.startswith("sqlite:"):
        from duetime.backends.sqlite.connection import parse_sqlite_url

        path, _ = parse_sqlite_url(store_url)
        if not path.exists():
            raise ConfigurationError(
                f"There is no SQLite store at {path} (the file does not exist): create it with "
                f"`duetime setup --store {store_url}`, "
                "or check the path."
            )
    return store_url


@app.command()
def setup(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    queue: Annotated[list[str], typer.Option("--queue", "-q", help="Also declare this SQLite queue.")] = [],  # noqa: B006
) -> None:
    """Create the store's tables (idempotent; safe to run from several processes at once)."""

    async def go() -> None:
        s = open_store(store)
        await s.setup_infrastructure(endpoint)
        if queue:
            t = open_transport(_transport_url(store, None))
            await t.start()
            for name in queue:
                await t.declare(name)
            await t.close()
        await s.close()

    _run(go)
    say("ready:", "green", f"endpoint {endpoint!r} in {redact(store)}")


@app.command()
def run(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    transport: TransportOpt = None,
    mode: Annotated[
        TransactionMode | None,
        typer.Option(
            help="Default: exactly-once where the transport shares the store's transaction (a SQLite "
            "or PostgreSQL store delivering into its own queue tables), at-least-once otherwise."
        ),
    ] = None,
    burst: Annotated[
        bool,
        typer.Option(
            help="Store what waits at the front door, forward what is due now, then exit (cron-style)."
        ),
    ] = False,
    retries: Annotated[
        int | None, typer.Option(help="NumberOfRetries before the error queue (default 0).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Messages claimed per round trip (default 100).")
    ] = None,
    error_queue: Annotated[
        str | None, typer.Option(help="Where failed messages go (default 'error').")
    ] = None,
    front_door: Annotated[
        bool,
        typer.Option(
            help="Also store what arrives on the <endpoint>.timeouts queue (the timeout manager queue NServiceBus senders use)."
        ),
    ] = True,
    auto_setup: Annotated[bool, typer.Option("--setup/--no-setup", help="Create tables first.")] = True,
    delivery_log: Annotated[
        str | None,
        typer.Option(
            help="Log every delivery for `duetime bulk report`: jsonl:/folder, or a database URL "
            "(table duetime_delivery_log).",
            envvar="DUETIME_DELIVERY_LOG",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every batch (debug level).")] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            envvar="DUETIME_LOG_FORMAT",
            help="text (one line per record, UTC timestamps) or json (one object per line).",
        ),
    ] = LogFormat.TEXT,
) -> None:
    """Run the dispatcher until SIGTERM/SIGINT. Settings also come from DUETIME_* variables.

    A circuit breaker that trips (the store or transport failing for 30 s) ends the process with
    exit code 3, so a supervisor restarts it; a stop signal finishes the batch in flight first.
    """
    _logging(verbose, log_format)
    changes: dict[str, Any] = {}
    for key, value in (
        ("transaction_mode", mode),
        ("number_of_retries", retries),
        ("batch_size", batch_size),
        ("error_queue", error_queue),
    ):
        if value is not None:
            changes[key] = value

    async def go() -> None:
        settings = DelayedDeliverySettings.from_env().with_changes(**changes)
        s = open_store(store)
        t = open_transport(_transport_url(store, transport))
        if mode is None and "DUETIME_TRANSACTION_MODE" not in os.environ:
            settings = settings.with_changes(transaction_mode=_safest_mode(s, t))
        if auto_setup:
            await s.setup_infrastructure(endpoint)
        log = None if delivery_log is None else open_delivery_log(delivery_log)
        dispatcher = Dispatcher(s, t, settings, endpoint=endpoint, delivery_log=log)
        try:
            if burst:
                if front_door and isinstance(t, ReceivingTransport):
                    await dispatcher.start()
                    door = FrontDoor(dispatcher, t, wait=0.5)
                    await door.start()
                    while await door.process_once():  # take in what waits at the front door first
                        pass
                stats = await dispatcher.run_burst()
                console.print(f"forwarded {stats.forwarded}, to the error queue {stats.dead_lettered}")
                return
            extra = []
            if front_door and isinstance(t, ReceivingTransport):
                extra.append(FrontDoor(dispatcher, t).run())
            logging.getLogger("duetime").info(
                "dispatching endpoint %s from %s to %s, %s; Ctrl-C to stop",
                endpoint,
                redact(store),
                redact(_transport_url(store, transport)),
                settings.transaction_mode.value,
            )
            await run_until_signal(dispatcher, *extra)
        finally:
            # A partitioned server may not answer a polite goodbye either: never hang on it.
            for closing in (t.close(), s.close(), *([log.close()] if log is not None else [])):
                try:
                    await within(closing, 10.0, "closing")
                except Exception as error:
                    logging.getLogger("duetime").warning("closing failed: %s", one_line(error))

    _run(go)


@app.command()
def schedule(
    destination: Annotated[str, typer.Argument(help="The queue the message is for.")],
    body: Annotated[str, typer.Argument(help="The message body (text). Use --body-file for bytes.")] = "",
    in_: Annotated[str | None, typer.Option("--in", help="Delay: 90, 1.5s, 10m, 1h30m, 2d.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="Due time, ISO 8601 with offset.")] = None,
    header: Annotated[list[str], typer.Option("--header", "-H", help="name=value, repeatable.")] = [],  # noqa: B006
    message_id: Annotated[
        str | None, typer.Option("--id", help="Your own message id (default: generated).")
    ] = None,
    body_file: Annotated[
        typer.FileBinaryRead | None, typer.Option(help="Read the body from a file ('-' = stdin).")
    ] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
) -> None:
    """Schedule one delayed message; prints its id."""
    payload = body_file.read() if body_file is not None else body.encode()
    due = _due(in_, at)

    async def go() -> DelayedMessage:
        client = await DelayedMessageClient(open_store(_existing(store)), endpoint=endpoint).open()
        try:
            return await client.schedule(
                destination, payload, headers=_headers(header), message_id=message_id, **due
            )
        finally:
            await client.store.close()

    message = _run(go)
    print(message.message_id)  # stdout carries just the id, for $(duetime schedule ...)
    err.print(f"due {message.due_at.isoformat()} -> {message.destination}")


@app.command()
def load(
    file: Annotated[
        Path,
        typer.Argument(help="JSON Lines, one message per line (see below).", exists=True, dir_okay=False),
    ],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    chunk: Annotated[int, typer.Option(help="Messages per store_many call (COPY on PostgreSQL).")] = 50_000,
    skip_duplicates: Annotated[bool, typer.Option(help="Skip ids already stored (resume a load).")] = False,
) -> None:
    """Schedule every message in a JSON Lines file, with a progress bar.

    Each line: {"destination": "orders", "due_at": "2030-01-01T09:00:00Z" or "delay": "10m",
    "body": "text" or "body_base64": "...", "headers": {...}, "id": "optional"}. The whole file is
    checked first; if any line is wrong nothing is stored and every problem is listed. Give every
    line an "id" if the load may need re-running (--skip-duplicates recognises stored ids; a line
    without one gets a new id each run).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from duetime.loader import load as load_file
    from duetime.loader import validate

    now = SystemClock().now()

    async def go() -> Any:
        s = await _open(store, endpoint)
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=err,
            ) as bar:
                checking = bar.add_task("checking", total=None)
                checked = validate(file, now)
                bar.update(checking, total=checked.lines, completed=checked.lines)
                task = bar.add_task("storing", total=checked.lines)
                return await load_file(
                    file,
                    s,
                    now,
                    chunk=chunk,
                    skip_duplicates=skip_duplicates,
                    progress=lambda n: bar.advance(task, n),
                    checked=checked,
                )
        finally:
            await s.close()

    report = _run(go)
    console.print(
        f"stored {report.stored} of {report.lines}; skipped {report.skipped_duplicates} already stored"
    )


@app.command("send-delayed")
def send_delayed_command(
    destination: Annotated[str, typer.Argument(help="Where the message should go when it is due.")],
    body: Annotated[str, typer.Argument(help="The message body (text).")] = "",
    in_: Annotated[str | None, typer.Option("--in", help="Delay: 90, 1.5s, 10m, 1h30m, 2d.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="Due time, ISO 8601 with offset.")] = None,
    header: Annotated[list[str], typer.Option("--header", "-H", help="name=value, repeatable.")] = [],  # noqa: B006
    message_id: Annotated[
        str | None, typer.Option("--id", help="Your own message id (default: generated).")
    ] = None,
    transport: Annotated[
        str,
        typer.Option(
            "--transport", envvar="DUETIME_TRANSPORT", help="The broker, e.g. amqp://guest:guest@localhost/."
        ),
    ] = "",
    endpoint: EndpointOpt = "duetime",
) -> None:
    """Send a delayed message through the broker to <endpoint>.timeouts (the front door).

    For services that reach only the broker: the duetime service consuming that queue stores the
    message once (by its id) and delivers it when it is due. Prints the message id.
    """
    from duetime.frontdoor import front_door_queue, send_delayed

    if not transport:
        raise typer.BadParameter(
            "give --transport (or DUETIME_TRANSPORT): the broker the duetime service reads"
        )
    due = _due(in_, at)

    async def go() -> DelayedMessage:
        t = open_transport(transport)
        await t.start()
        try:
            await t.declare(front_door_queue(endpoint))  # the service may not have started yet
            return await send_delayed(
                t,
                endpoint,
                destination,
                body.encode(),
                headers=_headers(header),
                message_id=message_id,
                **due,
            )
        finally:
            await t.close()

    message = _run(go)
    print(message.message_id)
    err.print(f"due {message.due_at.isoformat()} -> {message.destination} (via {endpoint}.timeouts)")


def _message_row(m: DelayedMessage) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "destination": m.destination,
        "due_at": m.due_at.isoformat(),
        "failures": m.failure_count,
        "headers": dict(m.headers),
        "size": len(m.body),
    }


@app.command("list")
def list_(
    destination: Annotated[str | None, typer.Option(help="Only messages for this destination.")] = None,
    due_before: Annotated[str | None, typer.Option(help="Only messages due before this ISO time.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (1-10000).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
) -> None:
    """List stored messages, soonest due first."""

    async def go() -> list[DelayedMessage]:
        client = await DelayedMessageClient(open_store(_existing(store)), endpoint=endpoint).open()
        try:
            before = parse_time(due_before) if due_before else None
            return (await client.list(destination=destination, due_before=before, limit=limit)).messages
        finally:
            await client.store.close()

    messages = _run(go)
    if as_json:
        for m in messages:
            print(json.dumps(_message_row(m)))
        return
    table = Table("id", "destination", "due (UTC)", "failures", "bytes")
    for column in table.columns:
        column.overflow = "fold"
    for m in messages:
        table.add_row(
            m.message_id, m.destination, m.due_at.isoformat(), str(m.failure_count), str(len(m.body))
        )
    console.print(table)
    console.print(f"{len(messages)} shown")


@app.command()
def show(
    message_id: Annotated[str, typer.Argument(help="The message id.")],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
) -> None:
    """Show one stored message in full (body as text where it is text)."""

    async def go() -> DelayedMessage | None:
        client = await DelayedMessageClient(open_store(_existing(store)), endpoint=endpoint).open()
        try:
            return await client.get(message_id)
        finally:
            await client.store.close()

    m = _run(go)
    if m is None:
        raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
    row = _message_row(m)
    try:
        row["body"] = m.body.decode()
    except UnicodeDecodeError:
        row["body_hex"] = m.body.hex()
    console.print_json(json.dumps(row))


@app.command()
def cancel(
    message_id: Annotated[str, typer.Argument(help="The message id.")],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
) -> None:
    """Cancel a stored message so it is never delivered."""

    async def go() -> bool:
        client = await DelayedMessageClient(open_store(_existing(store)), endpoint=endpoint).open()
        try:
            return await client.cancel(message_id)
        finally:
            await client.store.close()

    if not _run(go):
        raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
    console.print(f"cancelled {message_id}")


@app.command()
def reschedule(
    message_id: Annotated[str, typer.Argument(help="The message id.")],
    in_: Annotated[str | None, typer.Option("--in", help="New delay from now: 10m, 1h, ...")] = None,
    at: Annotated[str | None, typer.Option("--at", help="New due time, ISO 8601 with offset.")] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
) -> None:
    """Move a stored message's due time."""
    due = _due(in_, at)

    async def go() -> bool:
        client = await DelayedMessageClient(open_store(_existing(store)), endpoint=endpoint).open()
        try:
            return await client.reschedule(message_id, **due)
        finally:
            await client.store.close()

    if not _run(go):
        raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
    console.print(f"rescheduled {message_id}")


@app.command()
def stats(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    transport: TransportOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Counts: stored, due, in flight, failing, next due, per destination, and queue depths."""

    async def go() -> dict[str, Any]:
        s = await _open(store, endpoint)
        try:
            counts = await s.counts(SystemClock().now())
        finally:
            await s.close()
        result: dict[str, Any] = {
            "stored": counts.total,
            "due": counts.due,
            "in_flight": counts.claimed,
            "failing": counts.failing,
            "next_due": counts.next_due.isoformat() if counts.next_due else None,
            "by_destination": dict(counts.by_destination),
        }
        try:
            url: str | None = _transport_url(store, transport)
        except ConfigurationError:
            url = None  # a store without a default transport: no queues to show
        if url and url.startswith("sqlite:"):
            from duetime.backends.sqlite import SyncSqliteQueue

            q = SyncSqliteQueue.from_url(url)
            result["queues"] = q.queues()
            q.close()
        elif url and url.startswith("postgres"):
            from duetime.backends.postgres import SyncPostgresQueue

            pq = SyncPostgresQueue.from_url(url)
            result["queues"] = pq.queues()
            pq.close()
        return result

    result = _run(go)
    if as_json:
        print(json.dumps(result))
        return
    table = Table("what", "value", show_header=False)
    for key in ("stored", "due", "in_flight", "failing", "next_due"):
        value = result[key]
        shown = str(value) if value is not None else "nothing stored"
        table.add_row(key.replace("_", " "), shown)
    console.print(table)
    if result["by_destination"]:
        per = Table("destination", "stored")
        for name, count in result["by_destination"].items():
            per.add_row(name, str(count))
        console.print(per)
    if result.get("queues"):
        qt = Table("queue", "waiting")
        for name, count in result["queues"].items():
            qt.add_row(name, str(count))
        console.print(qt)


def _error_transport(store: str, transport: str | None) -> Transport:
    t = open_transport(_transport_url(store, transport))
    if not hasattr(t, "peek") or not hasattr(t, "take"):
        raise ConfigurationError(f"{type(t).__name__} cannot browse its error queue from here.")
    return t


@errors_app.command("list")
def errors_list(
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
    error_queue: Annotated[str, typer.Option(help="The error queue's name.")] = "error",
    limit: Annotated[int, typer.Option()] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """What is in the error queue, and why each message is there."""

    async def go() -> list[Any]:
        t = _error_transport(store, transport)
        await t.start()
        try:
            return list(await t.peek(error_queue, limit))  # type: ignore[attr-defined]
        finally:
            await t.close()

    items = _run(go)
    if as_json:
        for item in items:
            print(json.dumps({"id": item.message_id, "headers": dict(item.headers), "size": len(item.body)}))
        return
    table = Table("id", "for", "error", "attempts", "failed at")
    for item in items:
        h = item.headers
        table.add_row(
            item.message_id,
            h.get(ORIGINAL_DESTINATION, "?"),
            h.get("duetime-error-message", "?")[:80],
            h.get("duetime-error-attempts", "?"),
            h.get("duetime-error-time", "?"),
        )
    console.print(table)
    console.print(f"{len(items)} shown; send one back with `duetime errors retry ID`")


@errors_app.command("retry")
def errors_retry(
    message_id: Annotated[str, typer.Argument(help="The id of the message in the error queue.")],
    in_: Annotated[str, typer.Option("--in", help="When to try again (default: now).")] = "0",
    destination: Annotated[str | None, typer.Option(help="Send it somewhere else than it was going.")] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    transport: TransportOpt = None,
    error_queue: Annotated[str, typer.Option(help="The error queue's name.")] = "error",
) -> None:
    """Send a message from the error queue back into the store for another try."""
    delay = parse_duration(in_)

    async def go() -> DelayedMessage:
        t = _error_transport(store, transport)
        await t.start()
        s = await _open(store, endpoint)
        try:
            item = await t.take(error_queue, message_id)  # type: ignore[attr-defined]
            if item is None:
                raise ConfigurationError(
                    f"No message {message_id!r} in queue {error_queue!r}; see `duetime errors list`."
                )
            target = destination or item.headers.get(ORIGINAL_DESTINATION)
            if not target:
                raise ConfigurationError("The message does not say where it was going; pass --destination.")
            message = DelayedMessage.create(
                target,
                item.body,
                delay=delay,
                headers=without_error_headers(item.headers),
                message_id=item.message_id,
            )
            # Stored first, then removed from the error queue: never lost. A duplicate means an
            # earlier try stopped half-way after storing it.
            with contextlib.suppress(DuplicateMessageId):
                await s.store(message)
            await t.acknowledge([item])  # type: ignore[attr-defined]
            return message
        finally:
            await s.close()
            await t.close()

    message = _run(go)
    console.print(f"{message.message_id} goes to {message.destination} at {message.due_at.isoformat()}")


@queues_app.command("declare")
def queues_declare(
    names: Annotated[list[str], typer.Argument(help="Queue names.")],
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
) -> None:
    """Declare queues, so messages for them are delivered (not sent to the error queue)."""

    async def go() -> None:
        t = open_transport(_transport_url(store, transport))
        await t.start()
        try:
            for name in names:
                await t.declare(name)
        finally:
            await t.close()

    _run(go)
    console.print(f"declared {', '.join(names)}")


@queues_app.command("receive")
def queues_receive(
    name: Annotated[str, typer.Argument(help="The queue to consume.")],
    count: Annotated[int, typer.Option(help="Stop after this many messages.")] = 10,
    wait: Annotated[float, typer.Option(help="Seconds to wait for messages.")] = 5.0,
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
) -> None:
    """Consume messages from a queue: print each as a JSON line, then acknowledge it."""

    async def go() -> int:
        t = open_transport(_transport_url(store, transport))
        if not isinstance(t, ReceivingTransport):
            raise ConfigurationError(f"{type(t).__name__} cannot be consumed from here.")
        await t.start()
        got = 0
        try:
            while got < count:
                items = await t.receive(name, count - got, wait)
                if not items:
                    break
                for item in items:
                    print(
                        json.dumps(
                            {
                                "id": item.message_id,
                                "headers": dict(item.headers),
                                "body": item.body.decode(errors="replace"),
                            }
                        )
                    )
                await t.acknowledge(items)
                got += len(items)
        finally:
            await t.close()
        return got

    got = _run(go)
    err.print(f"{got} received")


@app.command()
def demo(
    messages: Annotated[int, typer.Option(help="How many delayed messages to schedule.")] = 5000,
    spread: Annotated[float, typer.Option(help="Due times spread over this many seconds.")] = 3.0,
    mode: Annotated[
        TransactionMode, typer.Option(help="Delivery guarantee to use.")
    ] = TransactionMode.EXACTLY_ONCE,
    db: Annotated[
        str | None, typer.Option(help="SQLite file to use (default: a fresh temporary one).")
    ] = None,
) -> None:
    """Schedule thousands of messages, deliver them, and prove none is lost, doubled or early."""
    from duetime.demo import run_demo

    if messages < 1 or spread < 0:
        raise typer.BadParameter("--messages must be at least 1 and --spread not negative")
    ok = guarded(lambda: run_demo(messages, timedelta(seconds=spread), mode, db, console))
    raise typer.Exit(0 if ok else 2)


def main() -> None:
    quiet_drivers(verbose=bool(os.environ.get("DUETIME_DEBUG")))
    try:
        app()
    except DuetimeError as error:  # bad input found before any async work started
        fail(str(error))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:  # a bug of ours: still one line, the traceback only on request
        if os.environ.get("DUETIME_DEBUG"):
            raise
        fail(
            f"internal error ({type(error).__name__}: {error}); this is a duetime bug, please report it "
            "with the output of the same command run with DUETIME_DEBUG=1."
        )
        sys.exit(1)
