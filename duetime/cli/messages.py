"""The commands on stored messages: schedule, load, send-delayed, list, show, cancel, reschedule, stats."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from duetime.audit import Action
from duetime.cli.common import (
    DEFAULT_STORE,
    AtOpt,
    EndpointOpt,
    GroupOpt,
    HeaderOpt,
    InOpt,
    MessageIdOpt,
    StoreOpt,
    TransportOpt,
    app,
    body_bytes,
    carry_rule,
    cli_actor,
    confirm_many,
    due_from_options,
    headers_from_pairs,
    record_change,
    refuse_destination,
    refuse_uncarriable,
    transport_url_for,
    warn_undeclared,
)
from duetime.cli.limits import paused_of
from duetime.cli.terminal import console, err, fail, progress_bar, say, table
from duetime.cli.terminal import run_async as _run
from duetime.cli.terminal import show as show_table
from duetime.client import DelayedMessageClient, build_message
from duetime.clock import SYSTEM
from duetime.encryption import describe
from duetime.errors import ConfigurationError, MessageInFlight, command, one_line
from duetime.inputs.durations import parse_duration, parse_time
from duetime.inputs.urls import redact
from duetime.interfaces import (
    AddressTopology,
    DispatcherRegistry,
    IfExists,
    Page,
    Put,
    StoreCounts,
    cursor_text,
    read_cursor,
)
from duetime.limits import pause_for
from duetime.live_dispatchers import DispatcherInfo, describe_claims
from duetime.message import DelayedMessage, body_fields
from duetime.nservicebus.frontdoor import front_door_queue
from duetime.operations.queue_depths import delivered_elsewhere, elsewhere_note, queue_depths, without_queue
from duetime.registry import check_store_exists, open_ready_store, open_store, open_transport
from duetime.settings import (
    DEFAULT_ENDPOINT,
    ENCRYPTION_KEYS_VARIABLE,
    DelayedDeliverySettings,
)


async def _client(store: str, endpoint: str, *, audited: bool = True) -> DelayedMessageClient:
    """A ready client of the store; its changes kept in the audit trail as this command's user's."""
    actor = cli_actor() if audited else None
    return await DelayedMessageClient(
        open_store(check_store_exists(store)), endpoint=endpoint, actor=actor
    ).open()


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
    group: GroupOpt = None,
    if_exists: Annotated[
        IfExists,
        typer.Option(
            help="When a message with --id is waiting: refuse (an error), keep it, replace it (body, "
            "headers, destination, group, due time), or debounce (replace, due --in from now: one "
            "message a delay after the last of a burst)."
        ),
    ] = IfExists.REFUSE,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
) -> None:
    """Schedule one delayed message; prints its id.

    Warns when no queue is declared for the destination (where the transport can tell).
    `--group order-42` files it with others of that key: `duetime list --group order-42` shows
    them, `duetime cancel --group order-42` cancels them all. `--id cart-7 --in 10m --if-exists
    debounce` sends one reminder ten minutes after the last of many calls.
    """
    due = due_from_options(in_, at, body if body_file is None else None)
    payload = body_file.read() if body_file is not None else body_bytes(body)
    made = build_message(
        SYSTEM,
        destination,
        payload,
        headers=headers_from_pairs(header),
        message_id=message_id,
        group=group,
        if_exists=if_exists,
        **due,
    )
    _run(lambda: refuse_uncarriable(store, transport, made))

    async def go() -> Put:
        client = await _client(store, endpoint)
        try:
            return await client.put(made, if_exists)
        finally:
            await client.close()

    done = _run(go)
    message = done.message
    print(message.message_id)  # stdout carries just the id, for $(duetime schedule ...)
    said = {
        "stored": "",
        "kept": " (kept: a message with this id was waiting)",
        "replaced": " (replaced the one waiting)",
    }
    err.print(f"due {message.due_at.isoformat()} -> {message.destination}{said[done.outcome]}")
    _run(lambda: warn_undeclared(store, transport, [destination], endpoint))


@app.command()
def load(
    file: Annotated[
        Path,
        typer.Argument(help="JSON Lines, one message per line (see below).", exists=True, dir_okay=False),
    ],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    chunk: Annotated[int, typer.Option(help="Messages per store_many call (COPY on PostgreSQL).")] = 50_000,
    skip_duplicates: Annotated[bool, typer.Option(help="Skip ids already stored (resume a load).")] = False,
    if_exists: Annotated[
        IfExists,
        typer.Option(
            help="When a line's id is waiting: refuse (stop there), keep it (as --skip-duplicates), "
            'replace it, or debounce (replace, due its "delay" from now). Replace and debounce '
            'store one line at a time, and need an "id" on every line.'
        ),
    ] = IfExists.REFUSE,
    spread: Annotated[
        str,
        typer.Option(
            "--spread",
            help="Spread the messages over this window after their times (10m): each a moment of "
            "its own, chosen from its id, so a file of one due time does not fall due at once.",
        ),
    ] = "0",
    transport: TransportOpt = None,
) -> None:
    """Schedule every message in a JSON Lines file, with a progress bar.

    Each line: {"destination": "orders", "due_at": "2030-01-01T09:00:00Z" or "delay": "10m",
    "body": "text" or "body_base64": "...", "headers": {...}, "id": "optional"}. The whole file is
    checked first (also against what the transport could never carry: too large, a header it
    refuses); if any line is wrong nothing is stored and every problem is listed. Give every
    line an "id" if the load may need re-running (--skip-duplicates recognises stored ids; a line
    without one gets a new id each run).
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
    )

    from duetime.operations.message_files import load as load_file
    from duetime.operations.message_files import validate

    now, window = SYSTEM.now(), parse_duration(spread)
    #: Lines stored or skipped so far, and how many the file holds: what an interruption reports.
    done, lines = 0, 0

    def advance(bar: Progress, task: TaskID, n: int) -> None:
        nonlocal done
        done += n
        bar.advance(task, n)

    async def go() -> Any:
        nonlocal lines
        s = await open_ready_store(store, endpoint)
        try:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=err,
            ) as bar:
                checking = bar.add_task("checking", total=None)
                async with carry_rule(store, transport) as rule:  # what the transport could never carry
                    checked = validate(file, now, carry=rule, if_exists=if_exists)
                lines = checked.lines
                bar.update(checking, total=lines, completed=lines)
                task = bar.add_task("storing", total=lines)
                loaded = await load_file(
                    file,
                    s,
                    now,
                    chunk=chunk,
                    skip_duplicates=skip_duplicates,
                    progress=lambda n: advance(bar, task, n),
                    checked=checked,
                    if_exists=if_exists,
                    spread=window,
                )
            if loaded.replaced:
                action = Action.DEBOUNCE if if_exists is IfExists.DEBOUNCE else Action.REPLACE
                said = f"{loaded.replaced} replaced by lines of {file.name}"
                await record_change(s, action, file.name, ids=loaded.replaced_ids, detail=said)
            return loaded
        finally:
            await s.close()

    try:
        report = _run(go)
    except typer.Exit as leaving:
        if leaving.exit_code == 130 and lines:  # Ctrl-C while storing: say what is stored
            raise fail(
                f"stored {done:,} of {lines:,} lines (the chunk under way may be stored too); to store "
                "the rest, run the same command again with --skip-duplicates (a line without an "
                '"id" gets a new one, and is stored again)',
                code=130,
                label="interrupted:",
            ) from None
        raise
    replaced = f"; replaced {report.replaced} waiting" if report.replaced else ""
    console.print(
        f"stored {report.stored} of {report.lines}; skipped {report.skipped_duplicates} already "
        f"stored{replaced}"
    )
    if report.in_flight:
        shown = ", ".join(report.in_flight[:5]) + (" ..." if len(report.in_flight) > 5 else "")
        say(
            "warning:",
            "yellow",
            f"{len(report.in_flight)} line(s) not stored: their waiting message was being delivered "
            f"({shown}); load them again under new ids if they should go too",
            to=err,
        )
    _run(lambda: warn_undeclared(store, transport, report.destinations))


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
        typer.Option("--transport", help="The broker, e.g. amqp://guest:guest@localhost/."),
    ] = "",
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Send a delayed message through the broker to <endpoint>.Timeouts (the front door).

    For services that reach only the broker: a `duetime run --front-door` consuming that queue stores the
    message once (by its id) and delivers it when it is due. Prints the message id.
    """
    from duetime.nservicebus.frontdoor import front_door_queue, send_delayed

    if not transport:
        raise typer.BadParameter(
            "give --transport (or DUETIME_TRANSPORT): the broker the duetime service reads"
        )
    due = due_from_options(in_, at, body)
    refuse_destination(destination)

    async def go() -> DelayedMessage:
        t = open_transport(transport)
        await t.start()
        try:
            queue = front_door_queue(endpoint)  # the service may not have started yet: declare it
            await (t.declare_address(queue) if isinstance(t, AddressTopology) else t.declare(queue))
            return await send_delayed(
                t,
                endpoint,
                destination,
                body_bytes(body),
                headers=headers_from_pairs(header),
                message_id=message_id,
                **due,
            )
        finally:
            await t.close()

    message = _run(go)
    print(message.message_id)
    err.print(f"due {message.due_at.isoformat()} -> {message.destination} (via {endpoint}.Timeouts)")


def _message_row(m: DelayedMessage) -> dict[str, Any]:
    return {
        "id": m.message_id,
        "destination": m.destination,
        "due_at": m.due_at.isoformat(),
        "failures": m.failure_count,
        "headers": dict(m.headers),
        "size": len(m.body),
        "group": m.group,
    } | ({"encrypted": sealed} if (sealed := describe(m.headers)) else {})


async def _pages(
    client: DelayedMessageClient,
    destination: str | None,
    due_before: str | None,
    limit: int,
    after: tuple[datetime, str] | None,
    group: str | None = None,
) -> AsyncIterator[Page]:
    """Page after page of the listing, from ``after`` on."""
    before = parse_time(due_before) if due_before else None
    while True:
        page = await client.list(
            destination=destination, due_before=before, limit=limit, after=after, group=group
        )
        yield page
        if page.next_cursor is None:
            return
        after = page.next_cursor


@app.command("list")
def list_(
    destination: Annotated[str | None, typer.Option(help="Only messages for this destination.")] = None,
    due_before: Annotated[str | None, typer.Option(help="Only messages due before this ISO time.")] = None,
    group: Annotated[str | None, typer.Option(help="Only messages of this group (e.g. a saga id).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many per page (1-10000).")] = 50,
    after: Annotated[
        str | None, typer.Option(help="Start after this place (printed at the end of the previous page).")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every page, to the end (see --json).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, as read.")] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """List stored messages, soonest due first, a page at a time.

    `duetime list --all --json > all.jsonl` streams everything, however much is stored.
    """
    start = read_cursor(after) if after else None

    async def go() -> tuple[int, tuple[datetime, str] | None]:
        """Each page is printed as it comes (a table a page, or JSON lines): constant memory,
        however much is stored."""
        client = await _client(store, endpoint)
        shown = 0
        try:
            async for page in _pages(client, destination, due_before, limit, start, group):
                if as_json:
                    sys.stdout.writelines(json.dumps(_message_row(m)) + "\n" for m in page.messages)
                elif page.messages:
                    show_table(_page_table(page.messages))
                shown += len(page.messages)
                if not every:
                    return shown, page.next_cursor
            return shown, None
        finally:
            await client.close()

    count, more = _run(go)
    if as_json:
        return
    nxt = f"; next page: duetime list --after '{cursor_text(more)}'" if more else ""
    console.print(f"{count:,} shown{nxt}")


def _page_table(messages: list[DelayedMessage]) -> Any:
    grouped = any(m.group for m in messages)
    grid = table("id", "destination", "due (UTC)", "failures", "body bytes", *(["group"] if grouped else []))
    for m in messages:
        grid.add_row(
            m.message_id,
            m.destination,
            m.due_at.isoformat(),
            str(m.failure_count),
            str(len(m.body)),
            *([m.group or ""] if grouped else []),
        )
    return grid


#: What ``show`` renders on a terminal at most (``--json`` prints everything).
SHOWN_HEADERS, SHOWN_BODY = 200, 64 * 1024


@app.command()
def show(
    message_id: Annotated[str, typer.Argument(help="The message id.")],
    as_json: Annotated[bool, typer.Option("--json", help="One line of JSON, for scripts.")] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Show one stored message in full (body as text where it is text, else as hex)."""

    async def go() -> DelayedMessage | None:
        client = await _client(store, endpoint)
        try:
            return await client.get(message_id)
        finally:
            await client.close()

    m = _run(go)
    if m is None:
        raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
    row = _message_row(m)
    if "encrypted" in row:  # no keyring here, or not its key: what it holds is not shown
        err.print(
            f"the body is {row['encrypted']}: set {ENCRYPTION_KEYS_VARIABLE} to a keyring that holds it"
        )
        m = m.with_changes(body=b"")
    if as_json:
        print(json.dumps(row | body_fields(m.body)))
        return
    # a terminal gets what a person can read: a message may carry a million headers
    headers = sorted(m.headers.items())
    row["headers"] = dict(headers[:SHOWN_HEADERS])
    try:
        text = m.body.decode()[:SHOWN_BODY]
        row["body"], shown_bytes = text, len(text.encode())
    except UnicodeDecodeError:
        row["body_hex"], shown_bytes = m.body[:SHOWN_BODY].hex(), min(len(m.body), SHOWN_BODY)
    console.print_json(json.dumps(row))
    left_out = [
        f"{len(headers) - SHOWN_HEADERS:,} more headers" if len(headers) > SHOWN_HEADERS else "",
        f"{len(m.body) - shown_bytes:,} more bytes of the body" if len(m.body) > shown_bytes else "",
    ]
    if any(left_out):
        err.print(
            f"not shown: {' and '.join(x for x in left_out if x)}; `{command('duetime', 'show', message_id, '--json')}` prints everything"
        )


@app.command()
def cancel(
    message_id: Annotated[str | None, typer.Argument(help="The message id.")] = None,
    destination: Annotated[
        str | None, typer.Option(help="Cancel every message for this destination (asks first).")
    ] = None,
    due_before: Annotated[
        str | None, typer.Option(help="Cancel every message due before this ISO time (asks first).")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="Cancel every message of this group, e.g. an NServiceBus saga id (asks first)."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Cancel a stored message so it is never delivered, or every one for a destination or group.

    `duetime cancel --destination retired-queue --yes` cancels what is due to a queue that is gone;
    add --due-before to keep the later ones. `duetime cancel --group KEY` cancels a group (what
    `schedule --group` filed, or an NServiceBus saga's timeouts). A message being delivered right
    now is left alone.
    """
    chosen = [message_id is not None, destination is not None or due_before is not None, group is not None]
    if sum(chosen) != 1:
        raise typer.BadParameter("give one of: a message id, --destination and/or --due-before, or --group")
    if group is not None:
        _cancel_group(group, yes, store, endpoint)
        return

    async def one() -> bool:
        client = await _client(store, endpoint)
        try:
            return await client.cancel(message_id or "")
        finally:
            await client.close()

    if message_id is not None:
        if not _run(one):
            raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
        console.print(f"cancelled {message_id}")
        return

    async def many() -> tuple[int, int, int]:
        client = await _client(store, endpoint, audited=False)  # one entry for them all, below
        try:
            ids = [
                m.message_id
                async for page in _pages(client, destination, due_before, 10_000, None)
                for m in page.messages
            ]
            if not ids:
                return 0, 0, 0
            what = " and ".join(
                part
                for part in (
                    f"for {destination!r}" if destination else "",
                    f"due before {due_before}" if due_before else "",
                )
                if part
            )
            confirm_many(f"Cancel {len(ids)} stored message{'' if len(ids) == 1 else 's'} {what}?", yes)
            busy = 0
            cancelled: list[str] = []
            with progress_bar("cancelling", len(ids)) as advance:
                for mid in ids:
                    try:
                        if await client.cancel(mid):
                            cancelled.append(mid)
                    except MessageInFlight:
                        busy += 1
                    advance(1)
            if cancelled:
                said = f"{len(cancelled)} cancelled {what}"
                await record_change(
                    client.store, Action.CANCEL, destination or "*", ids=cancelled, detail=said
                )
            return len(ids), len(cancelled), busy
        finally:
            await client.close()

    found, done, busy = _run(many)
    gone = found - done - busy
    console.print(
        f"cancelled {done} of {found}"
        + (f"; {busy} were being delivered right then" if busy else "")
        + (f"; {gone} were gone already" if gone else "")
    )


#: What ``cancel --group`` cancels in one transaction: a large group goes a batch at a time, each
#: whole, so Ctrl-C stops it between two batches with nothing half done.
CANCEL_BATCH = 5_000


def _cancel_group(group: str, yes: bool, store: str, endpoint: str) -> None:
    """Count the group (for the question), then cancel it a batch at a time with a progress bar;
    Ctrl-C stops after the batch under way and says what is left."""
    stop = threading.Event()

    async def go() -> tuple[int, int]:
        client = await _client(store, endpoint)
        try:
            found = await client.count_group(group)
            if not found:
                return 0, 0
            confirm_many(
                f"Cancel the {found:,} stored message{'' if found == 1 else 's'} of group {group!r}?", yes
            )
            done = 0
            with progress_bar("cancelling", found) as advance:
                while not stop.is_set() and (n := await client.cancel_group(group, limit=CANCEL_BATCH)):
                    done += n
                    advance(n)
            return found, done
        finally:
            await client.close()

    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        found, done = _run(go)
    finally:
        signal.signal(signal.SIGINT, previous)
    if not found:
        raise fail(f"no stored message in group {group!r} (delivered, cancelled, or a different key?)")
    if stop.is_set():
        again = command("duetime", "cancel", "--group", group)
        raise fail(
            f"stopped: cancelled {done:,} of {found:,}, each batch whole; the rest are stored. "
            f"`{again}` cancels them",
            code=130,
        )
    busy = found - done
    console.print(
        f"cancelled {done:,} of {found:,}" + (f"; {busy:,} were being delivered right then" if busy else "")
    )


@app.command()
def reschedule(
    message_id: Annotated[str, typer.Argument(help="The message id.")],
    in_: Annotated[str | None, typer.Option("--in", help="New delay from now: 10m, 1h, ...")] = None,
    at: Annotated[str | None, typer.Option("--at", help="New due time, ISO 8601 with offset.")] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Move a stored message's due time."""
    due = due_from_options(in_, at)

    async def go() -> bool:
        client = await _client(store, endpoint)
        try:
            return await client.reschedule(message_id, **due)
        finally:
            await client.close()

    if not _run(go):
        raise fail(f"no stored message {message_id!r} (already delivered, or cancelled?)")
    console.print(f"rescheduled {message_id}")


@app.command()
def stats(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Counts: stored, due, in flight, failing, next due, per destination, and queue depths."""

    async def go() -> tuple[dict[str, Any], StoreCounts]:
        s = await open_ready_store(store, endpoint)
        try:
            counts = await s.counts(SYSTEM.now())
            present = await s.dispatchers() if isinstance(s, DispatcherRegistry) else []
            pauses = await paused_of(s)
        finally:
            await s.close()
        result: dict[str, Any] = {
            "stored": counts.total,
            "due": counts.due,
            "in_flight": counts.claimed,
            "held": counts.held,
            "failing": counts.failing,
            "next_due": counts.next_due.isoformat() if counts.next_due else None,
            "by_destination": dict(counts.by_destination),
            "more_destinations": counts.more_destinations,
            "more_messages": counts.more_messages,
            "estimated": counts.estimated,
            "dispatchers": [d.as_dict(SYSTEM.now()) for d in present],
            "paused": {
                name: {"by": p.by, "at": p.at.isoformat(), "reason": p.reason}
                for name in counts.by_destination
                if (p := pause_for(pauses, name)) is not None
            },
        }
        try:
            shown = transport_url_for(store, transport)
            t = open_transport(shown)
        except ConfigurationError:
            return result, counts  # a store without a default transport: no queues to show
        # A broker cannot list its queues: the ones this endpoint's messages go to are looked up.
        candidates = [DelayedDeliverySettings.from_env().error_queue, front_door_queue(endpoint)]
        result["queues_on"] = redact(shown)
        try:
            await t.start()
            depths = await queue_depths(t, [*candidates, *counts.by_destination])
        except Exception as error:  # the store's counts stand without the queues
            depths, result["queues_error"] = None, one_line(error)
        finally:
            with contextlib.suppress(Exception):
                await t.close()
        if depths is not None:
            result["queues"] = depths
            # stored for a queue that is not there: each will go to the error queue when due
            result["without_queue"] = without_queue(t, depths, candidates, counts.by_destination)
        elsewhere = delivered_elsewhere(shown, present, SYSTEM.now())
        if elsewhere:
            result["queues_note"] = elsewhere_note(shown, elsewhere)
        return result, counts

    result, counted = _run(go)
    if as_json:
        print(json.dumps(result))
        return
    overview = table("what", "value", show_header=False)
    for key in ("stored", "due", "in_flight", "held", "failing", "next_due"):
        value = result[key]
        if key == "held" and not value:
            continue  # shown only while a flow-control limit or pause holds messages back
        shown = "nothing stored" if value is None else counted.said(value) if key == "stored" else str(value)
        overview.add_row(key.replace("_", " "), shown)
    show_table(overview)
    if result["by_destination"] or result["more_messages"]:
        lacking = set(result.get("without_queue", []))
        paused = result["paused"]
        extra = (["queue"] if lacking else []) + (["paused"] if paused else [])
        per = table("destination", "stored", *extra)
        for name, count in result["by_destination"].items():
            mark = ["none: to the error queue when due" if name in lacking else ""] if lacking else []
            if paused:
                p = paused.get(name)
                mark.append(f"by {p['by']}" + (f": {p['reason']}" if p["reason"] else "") if p else "")
            per.add_row(name, counted.said(count), *mark)
        if rest := counted.rest_said():
            per.add_row(rest, counted.said(result["more_messages"]), *([""] * len(extra)))
        show_table(per)
    if counted.estimated:
        say(
            "note:",
            "yellow",
            "figures marked 'about' are estimates (the database's statistics, or a sample of the "
            "messages): a store this large is not counted message by message",
            to=err,
        )
    _show_dispatchers(result["dispatchers"])
    if result.get("queues"):
        qt = table(f"queue on {result['queues_on']}", "waiting")
        for name, count in result["queues"].items():
            qt.add_row(name, f"{count:,}")
        show_table(qt)
    elif "queues_error" in result:
        reason = f"could not look at the queues of {result['queues_on']}: {result['queues_error']}"
        say("note:", "yellow", reason, to=err)
    elif "queues_on" in result:
        found = (
            "has none of this endpoint's" if "queues" in result else "cannot tell what waits in its queues"
        )
        print(f"queues: {result['queues_on']} {found}")
    if "queues_note" in result:
        say("note:", "yellow", result["queues_note"], to=err)


def _show_dispatchers(found: list[dict[str, Any]]) -> None:
    """Who delivers this endpoint: live ones, ones gone quiet (and when what they held comes
    back), ones that stopped."""
    if not found:
        print("dispatchers: none has run against this store yet (or the store keeps no list)")
        return
    now = SYSTEM.now()
    shown = table("dispatcher", "status", "started", "last seen", "forwarded", "claims", free=("claims",))
    for data in found:
        info = DispatcherInfo.from_json(json.dumps(data))
        seen = f"{(now - info.last_seen).total_seconds():.0f} s ago"
        claims = describe_claims(info, now) if data["status"] == "gone" else f"{info.in_flight:,} in flight"
        shown.add_row(
            f"{info.host} pid {info.pid}", data["status"], info.started_at.isoformat(timespec="seconds"),
            seen, f"{info.forwarded:,}", claims,
        )  # fmt: skip
    show_table(shown)
