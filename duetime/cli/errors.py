"""`duetime errors …`: what is in the error queue; sending messages back for another try, or
discarding them. Works on every queue transport: the SQL queue tables, RabbitMQ, Redis, NATS."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated

import typer

from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    ErrorQueueOpt,
    StoreOpt,
    TransportOpt,
    cli_actor,
    confirm_many,
    errors_app,
    transport_url_for,
    warn_undeclared,
)
from duetime.cli.terminal import console, err, fail, say, show, table
from duetime.cli.terminal import run_async as _run
from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_duration
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact
from duetime.interfaces import InspectableQueue, ReceivedMessage
from duetime.operations.retry_or_discard import (
    LOOKED_AT,
    chosen,
    discard,
    failed_row,
    failures,
    open_error_transport,
    send_back,
    take,
)
from duetime.registry import open_ready_store
from duetime.settings import DEFAULT_ENDPOINT, DEFAULT_ERROR_QUEUE

IdsArg = Annotated[list[str] | None, typer.Argument(help="Ids of messages in the error queue.")]
AllOpt = Annotated[bool, typer.Option("--all", help="Every message in the error queue (see --destination).")]
ForOpt = Annotated[
    str | None, typer.Option("--destination", help="Only messages that were going to this queue.")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _error_transport(store: str, transport: str | None) -> InspectableQueue:
    return open_error_transport(transport_url_for(store, transport))


async def _pick(
    t: InspectableQueue,
    queue: str,
    ids: Sequence[str],
    every: bool,
    destination: str | None,
    endpoint: str,
    ask: str | None,
    yes: bool,
) -> list[ReceivedMessage]:
    """Take the messages named (by id, or every one, for one destination or all); ask first if
    ``ask`` (a question with {n}, {s}, {where} and {queue} in it) is given."""
    ids, missing = await chosen(t, queue, ids, every, destination, endpoint)
    if not ids:
        if missing:
            raise ConfigurationError(_not_there(queue, missing))
        return []
    if ask:
        where = f" that were going to {destination!r}" if destination else ""
        confirm_many(ask.format(n=len(ids), s="" if len(ids) == 1 else "s", where=where, queue=queue), yes)
    taken, gone = await take(t, queue, ids)
    missing += gone
    if missing and not every:
        if not taken:
            raise ConfigurationError(_not_there(queue, missing))
        say("warning:", "yellow", _not_there(queue, missing), to=err)
    return taken


def _not_there(queue: str, missing: Sequence[str]) -> str:
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return f"not in error queue {queue!r} (handled already? see `duetime errors list`): {shown}"


@errors_app.command("list")
def errors_list(
    destination: ForOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line, headers included.")
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
) -> None:
    """What is in the error queue for this endpoint, and why each message is there (oldest first).

    Nothing is taken: on a broker the messages are read and put back in their order. Endpoints
    that share an error queue each see their own failures.
    """

    async def go() -> tuple[list[ReceivedMessage], int, int, bool]:
        t = _error_transport(store, transport)
        await t.start()
        try:
            got = await failures(t, error_queue, endpoint, destination, limit)
            return got.shown, got.found, got.depth, got.depth > 0 or await t.has_queue(error_queue)
        finally:
            await t.close()

    items, found, depth, there = _run(go)
    if not there:  # a typo in --error-queue would otherwise look like an empty error queue
        say(
            "note:",
            "yellow",
            f"there is no queue {error_queue!r} on {redact(transport_url_for(store, transport))} (yet): nothing "
            "was sent there. A dispatcher's error queue is 'error' unless its --error-queue says otherwise.",
            to=err,
        )
    if as_json:
        for item in items:
            print(json.dumps(failed_row(item)))
        return
    grid = table("id", "for", "error", "attempts", "failed at", free=("error",))
    for item in items:
        row = failed_row(item)
        grid.add_row(
            row["id"],
            row["destination"] or "?",
            (row["error"] or "?")
            + (
                " (kept in the store: retry reschedules it, discard cancels it)"
                if row["kept_in_store"]
                else ""
            ),
            "?" if row["attempts"] is None else str(row["attempts"]),
            row["failed_at"] or "?",
        )
    show(grid)
    among = f" among the first {LOOKED_AT:,} of its {depth:,}" if depth > LOOKED_AT else ""
    console.print(
        f"{len(items)} shown of {found:,} failed in endpoint {endpoint!r} in error queue {error_queue!r}{among}. "
        "Send back with `duetime errors retry ID` (or --all), drop with `duetime errors discard ID`."
    )


@errors_app.command("retry")
def errors_retry(
    ids: IdsArg = None,
    every: AllOpt = False,
    destination: ForOpt = None,
    to: Annotated[str | None, typer.Option("--to", help="Send them to this queue instead.")] = None,
    in_: Annotated[str, typer.Option("--in", help="When to try again: 0 (now), 10m, 1h, ...")] = "0",
    spread: Annotated[
        str,
        typer.Option(
            "--spread",
            help="Spread them over this window after --in (10m): each its own moment, so a large "
            "retry does not fall due at once on a receiver that just recovered.",
        ),
    ] = "0",
    yes: YesOpt = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
) -> None:
    """Send messages from the error queue back into the store for another try.

    Each is stored first and only then removed from the error queue, so a retry that stops
    half-way loses nothing; running it again finishes it (ids already stored are skipped).
    """
    delay, window = parse_duration(in_), parse_duration(spread)
    if to is not None:
        check_name("queue", to)
        _run(lambda: warn_undeclared(store, transport, [to]))  # as schedule does: stored, then dead-lettered

    async def go() -> tuple[int, int, list[str]]:
        t = _error_transport(store, transport)
        await t.start()
        s = await open_ready_store(store, endpoint)
        try:
            taken = await _pick(
                t, error_queue, ids or [], every, destination, endpoint,
                "Send {n} message{s}{where} from error queue {queue!r} back for another try?" if every else None,
                yes,
            )  # fmt: skip
            done = await send_back(s, t, taken, to=to, delay=delay, spread=window, actor=cli_actor())
            return done.sent, done.already, done.nowhere
        finally:
            await s.close()
            await t.close()

    sent, already, nowhere = _run(go)
    when = "now" if delay.total_seconds() <= 0 else f"in {in_}"
    if window.total_seconds() > 0:
        when += f", spread over {spread}"
    console.print(f"sent {sent} back, due {when}" + (f" ({already} were stored already)" if already else ""))
    if nowhere:
        raise _nowhere(nowhere)


def _nowhere(ids: list[str]) -> typer.Exit:
    return fail(
        f"{len(ids)} message(s) do not say where they were going ({', '.join(ids[:3])}...); "
        "they stay in the error queue: retry them with --to QUEUE."
    )


@errors_app.command("discard")
def errors_discard(
    ids: IdsArg = None,
    every: AllOpt = False,
    destination: ForOpt = None,
    yes: YesOpt = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
) -> None:
    """Remove this endpoint's messages from the error queue for good (asks first; --yes does not)."""

    async def go() -> int:
        t = _error_transport(store, transport)
        await t.start()
        s = await open_ready_store(store, endpoint)
        try:
            taken = await _pick(
                t, error_queue, ids or [], every, destination, endpoint,
                "Discard {n} message{s}{where} from error queue {queue!r} for good?", yes,
            )  # fmt: skip
            return await discard(s, t, taken, cli_actor())
        finally:
            await s.close()
            await t.close()

    console.print(f"discarded {_run(go)}")
