"""The commands on stored messages: schedule, load, send-delayed, list, show, cancel, reschedule, stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from duetime.cli.common import (
    DEFAULT_STORE,
    AtOpt,
    EndpointOpt,
    HeaderOpt,
    InOpt,
    MessageIdOpt,
    StoreOpt,
    TransportOpt,
    _due,
    _headers,
    _open,
    _transport_url,
    app,
)
from duetime.client import DelayedMessageClient
from duetime.clock import SYSTEM
from duetime.durations import parse_time
from duetime.errors import ConfigurationError
from duetime.interfaces import (
    BrowsableQueue,
)
from duetime.message import DelayedMessage
from duetime.registry import check_store_exists, open_store, open_transport
from duetime.terminal import console, err, fail
from duetime.terminal import run_async as _run


@app.command()
def schedule(
    destination: Annotated[str, typer.Argument(help="The queue the message is for.")],
    body: Annotated[str, typer.Argument(help="The message body (text). Use --body-file for bytes.")] = "",
    in_: InOpt = None,
    at: AtOpt = None,
    header: HeaderOpt = [],  # noqa: B006
    message_id: MessageIdOpt = None,
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
        client = await DelayedMessageClient(open_store(check_store_exists(store)), endpoint=endpoint).open()
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

    now = SYSTEM.now()

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
    in_: InOpt = None,
    at: AtOpt = None,
    header: HeaderOpt = [],  # noqa: B006
    message_id: MessageIdOpt = None,
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
        client = await DelayedMessageClient(open_store(check_store_exists(store)), endpoint=endpoint).open()
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
        client = await DelayedMessageClient(open_store(check_store_exists(store)), endpoint=endpoint).open()
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
        client = await DelayedMessageClient(open_store(check_store_exists(store)), endpoint=endpoint).open()
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
        client = await DelayedMessageClient(open_store(check_store_exists(store)), endpoint=endpoint).open()
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
            counts = await s.counts(SYSTEM.now())
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
            t = open_transport(_transport_url(store, transport))
        except ConfigurationError:
            return result  # a store without a default transport: no queues to show
        try:
            if isinstance(t, BrowsableQueue):
                result["queues"] = await t.queues()
        finally:
            await t.close()
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
