"""`duetime queues …`: declare and consume the queues duetime delivers into."""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Annotated

import typer

from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    StoreOpt,
    TransportOpt,
    queues_app,
    transport_url_for,
)
from duetime.cli.terminal import console, err
from duetime.cli.terminal import run_async as _run
from duetime.errors import ConfigurationError, DestinationNotFound
from duetime.inputs.urls import redact
from duetime.interfaces import InspectableQueue, ReceivedMessage, ReceivingTransport
from duetime.registry import open_transport
from duetime.settings import DEFAULT_ENDPOINT


@queues_app.command("declare")
def queues_declare(
    names: Annotated[list[str], typer.Argument(help="Queue names.")],
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,  # accepted like everywhere; queues are shared by endpoints
) -> None:
    """Declare queues, so messages for them are delivered (not sent to the error queue)."""

    async def go() -> None:
        t = open_transport(transport_url_for(store, transport))
        await t.start()
        try:
            for name in names:
                await t.declare(name)
        finally:
            await t.close()

    _run(go)
    console.print(f"declared {', '.join(names)}")


def json_line(item: ReceivedMessage) -> str:
    """One received message as a JSON line that keeps every byte: the body as text where it is
    UTF-8 (``"encoding": "text"``), else base64 (``"encoding": "base64"``)."""
    try:
        body, encoding = item.body.decode(), "text"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(item.body).decode("ascii"), "base64"
    line = {"id": item.message_id, "headers": dict(item.headers), "body": body, "encoding": encoding}
    # what could not be read as duetime wrote it (a sealed message this keyring cannot open)
    return json.dumps(line | ({"problem": item.problem} if item.problem else {}))


@queues_app.command("receive")
def queues_receive(
    name: Annotated[str, typer.Argument(help="The queue to consume.")],
    count: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many messages (10; 1 with --raw).")
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds to wait for a first message (with --count, for all of them); "
            "what is there already is taken at once.",
        ),
    ] = 5.0,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Write one message's body alone, byte for byte (e.g. > body.bin), and nothing else."
        ),
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,  # accepted like everywhere; queues are shared by endpoints
) -> None:
    """Consume messages from a queue: print each as a JSON line, then acknowledge it.

    Each line holds the id, the headers and the body: as text where the body is UTF-8
    ("encoding": "text"), else base64 ("encoding": "base64"), so no byte is lost. A message is
    acknowledged only once its line is written out.
    """
    if raw and count not in (None, 1):
        raise typer.BadParameter(
            "--raw writes one body alone; leave out --count (or give 1)", param_hint="--count"
        )
    wanted = count or (1 if raw else 10)

    async def go() -> int:
        t_url = transport_url_for(store, transport)
        t = open_transport(t_url)
        if not isinstance(t, ReceivingTransport):
            raise ConfigurationError(f"{type(t).__name__} cannot be consumed from here.")
        await t.start()
        got = 0
        try:
            if isinstance(t, InspectableQueue) and not await t.has_queue(name):  # a typo waits for nothing
                raise DestinationNotFound(
                    f"Queue {name!r} does not exist on {redact(t_url)}; declare it first (duetime queues declare {name})."
                )
            # --wait is for the whole command; once something has arrived, only what is there
            # already is taken unless --count asks for more (it waited out its 5 s every time)
            deadline = time.monotonic() + wait
            while got < wanted:
                left = max(0.0, deadline - time.monotonic())
                items = await t.receive(name, wanted - got, left if got == 0 or count else 0.0)
                if not items:
                    break
                for item in items:
                    if raw:
                        sys.stdout.buffer.write(item.body)
                    else:
                        sys.stdout.write(json_line(item) + "\n")
                sys.stdout.flush()  # written out before the broker forgets them
                await t.acknowledge(items)
                got += len(items)
        finally:
            await t.close()
        return got

    got = _run(go)
    err.print(f"{got} received")
