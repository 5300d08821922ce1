"""`duetime queues …`: declare and consume the queues duetime delivers into."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    StoreOpt,
    TransportOpt,
    _transport_url,
    queues_app,
)
from duetime.errors import ConfigurationError, DestinationNotFound
from duetime.interfaces import InspectableQueue, ReceivingTransport
from duetime.registry import open_transport
from duetime.terminal import console, err
from duetime.terminal import run_async as _run
from duetime.urls import redact


@queues_app.command("declare")
def queues_declare(
    names: Annotated[list[str], typer.Argument(help="Queue names.")],
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
    endpoint: EndpointOpt = "duetime",  # accepted like everywhere; queues are shared by endpoints
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
    count: Annotated[int, typer.Option(min=1, help="Stop after this many messages.")] = 10,
    wait: Annotated[float, typer.Option(min=0, help="Seconds to wait for messages.")] = 5.0,
    store: StoreOpt = DEFAULT_STORE,
    transport: TransportOpt = None,
    endpoint: EndpointOpt = "duetime",  # accepted like everywhere; queues are shared by endpoints
) -> None:
    """Consume messages from a queue: print each as a JSON line, then acknowledge it."""

    async def go() -> int:
        t_url = _transport_url(store, transport)
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
