"""`duetime errors …`: what is in the error queue, and sending a message back for another try."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    StoreOpt,
    TransportOpt,
    _open,
    _transport_url,
    errors_app,
)
from duetime.durations import parse_duration
from duetime.errorqueue import ORIGINAL_DESTINATION, without_error_headers
from duetime.errors import ConfigurationError, DuplicateMessageId
from duetime.interfaces import (
    BrowsableQueue,
)
from duetime.message import DelayedMessage
from duetime.registry import open_transport
from duetime.terminal import console
from duetime.terminal import run_async as _run


def _error_transport(store: str, transport: str | None) -> BrowsableQueue:
    t = open_transport(_transport_url(store, transport))
    if not isinstance(t, BrowsableQueue):
        raise ConfigurationError(
            f"{type(t).__name__} cannot show its error queue from here; use the broker's own tools."
        )
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
            return list(await t.peek(error_queue, limit))
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
            item = await t.take(error_queue, message_id)
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
            await t.acknowledge([item])
            return message
        finally:
            await s.close()
            await t.close()

    message = _run(go)
    console.print(f"{message.message_id} goes to {message.destination} at {message.due_at.isoformat()}")
