"""``duetime rabbitmq …``: the native delay topology on the command line."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer

from duetime.cli.common import body_bytes, refuse_split_duration
from duetime.cli.terminal import console, err, say, show, table
from duetime.cli.terminal import run_async as _run
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, DuetimeError
from duetime.inputs.durations import parse_duration
from duetime.inputs.urls import redact

T = TypeVar("T")
rabbitmq_app = typer.Typer(
    help=(
        "RabbitMQ native delays: 28 levels of TTL queues and topic exchanges keyed by the delay in "
        "binary (up to 268,435,455 s). `setup` declares them, `verify` checks them, `send` delays a "
        "message natively, `catchall` shows and sends back what lost its destination, `retire-store` "
        "switches an endpoint's store off once it is empty."
    ),
    no_args_is_help=True,
)

UrlOpt = Annotated[
    str,
    typer.Option(
        "--transport",
        "--url",
        help="The broker, amqp://user:pass@host:5672/vhost (also DUETIME_TRANSPORT, as every command).",
    ),
]
NamesOpt = Annotated[
    str,
    typer.Option(
        "--names",
        help="duetime (default), nsb-v2 or nsb-v1 (NServiceBus's names) or celery (kombu's, as Celery "
        "5.5+ workers declare them), to share the broker with that system.",
    ),
]
QueueTypeOpt = Annotated[
    str, typer.Option("--queue-type", help="quorum (default; classic on RabbitMQ < 3.10) or classic.")
]


@contextlib.asynccontextmanager
async def _native(url: str, names: str, queue_type: str = "quorum") -> AsyncIterator[Any]:
    """The topology on a connected broker, closed afterwards. The URL and the names are checked
    before connecting: a wrong one is then one line, with nothing left open behind it."""
    from duetime.backends.rabbitmq.native import NativeDelays
    from duetime.backends.rabbitmq.transport import RabbitMqTransport

    if urlsplit(url).scheme.lower() not in ("amqp", "amqps"):
        raise ConfigurationError(
            f"{redact(url)} is not a RabbitMQ URL: the rabbitmq commands need "
            "amqp://user:password@host:5672/vhost (--transport, or DUETIME_TRANSPORT)."
        )
    transport = RabbitMqTransport(url)
    native = NativeDelays(transport, names, queue_type=queue_type)
    await transport.start()
    try:
        yield native
    finally:
        await transport.close()


@rabbitmq_app.command()
def setup(
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    names: NamesOpt = "duetime",
    queue_type: QueueTypeOpt = "quorum",
) -> None:
    """Declare the 28 levels, their bindings, TTLs and dead-letter chain, and the delivery exchange. Idempotent."""

    async def go() -> None:
        async with _native(url, names, queue_type) as native:
            version = ".".join(map(str, await native.broker_version()))
            for line in await native.setup():
                console.print(f"declared {line}")
            console.print(f"RabbitMQ {version}; queues: {(await native.queue_arguments(0))['x-queue-type']}")

    _run(go)


@rabbitmq_app.command()
def verify(
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    names: NamesOpt = "duetime",
    queue_type: QueueTypeOpt = "quorum",
) -> None:
    """Check every exchange and queue exists with the right arguments (exit 1 if not)."""

    async def go() -> list[str]:
        async with _native(url, names, queue_type) as native:
            return list(await native.verify())

    problems = _run(go)
    for problem in problems:
        say("problem:", "red", problem, to=err)
    if problems:
        raise typer.Exit(1)
    say("complete:", "green", "the native delay topology has every exchange, queue and binding")


@rabbitmq_app.command()
def teardown(
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    names: NamesOpt = "duetime",
    force: Annotated[
        bool, typer.Option(help="Delete even while messages wait in the levels (they are lost).")
    ] = False,
) -> None:
    """Delete the topology; refused while delayed messages are still waiting in it."""

    async def go() -> None:
        async with _native(url, names) as native:
            for line in await native.teardown(force=force):
                console.print(f"deleted {line}")

    _run(go)


@rabbitmq_app.command()
def status(
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    names: NamesOpt = "duetime",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object: queue -> messages.")] = False,
) -> None:
    """How many messages wait in each level, and in the catch-all."""

    async def go() -> dict[str, int]:
        async with _native(url, names) as native:
            return dict(await native.waiting())

    waiting = _run(go)
    if as_json:
        print(json.dumps(waiting))
        return
    grid = table("queue", "messages")
    for name, count in waiting.items():
        if count:
            grid.add_row(name, f"{count:,}")
    show(grid)
    console.print(f"{sum(waiting.values()):,} waiting")


@rabbitmq_app.command()
def send(
    destination: Annotated[str, typer.Argument(help="The queue the message is for.")],
    body: Annotated[str, typer.Argument(help="The message body (text).")] = "",
    in_: Annotated[
        str, typer.Option("--in", help="Delay: 90, 1.5s, 10m, 1h30m, 2d (rounded up to whole seconds).")
    ] = "0",
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    names: NamesOpt = "duetime",
) -> None:
    """Send one message with a native delay."""
    refuse_split_duration(in_, body)

    async def go() -> str:
        async with _native(url, names) as native:
            sent = await native.send(destination, body_bytes(body), delay=parse_duration(in_))
            return str(sent.message_id)

    console.print(f"sent {_run(go)}")


@rabbitmq_app.command()
def catchall(
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    send_back: Annotated[
        bool, typer.Option("--send-back", help="Send each message back to its destination.")
    ] = False,
    to: Annotated[str | None, typer.Option(help="With --send-back: deliver to this queue instead.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many messages.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Messages whose destination was gone when their delay ended (they wait here, not dropped)."""
    from duetime.backends.rabbitmq.catchall import inspect_catchall

    async def go() -> list[tuple[str, str, str]]:
        async with _native(url, "duetime") as native:
            return await inspect_catchall(native, limit=limit, send_back=send_back, to=to)

    rows = _run(go)
    if as_json:
        for message_id, destination, what in rows:
            print(json.dumps({"id": message_id, "destination": destination, "what_happened": what}))
        return
    grid = table("message id", "destination", "what happened", free=("what happened",))
    for row in rows:
        grid.add_row(*row)
    show(grid)


@rabbitmq_app.command(
    "retire-store",
    short_help="Switch an endpoint's store off; refused while it still holds delayed messages.",
)
def retire_store(
    store: Annotated[str, typer.Option("--store", help="The endpoint's duetime store.")],
    endpoint: Annotated[
        str,
        typer.Option("--endpoint", help="The endpoint whose store is retired."),
    ],
    url: UrlOpt = "amqp://guest:guest@127.0.0.1:5672/",
    delete_front_door: Annotated[
        bool,
        typer.Option(help="Also delete the empty <endpoint>.Timeouts queue (and its old name, .timeouts)."),
    ] = True,
) -> None:
    """Switch an endpoint's store off (what NServiceBus calls "disabling the timeout manager"): refused while
    it or its front-door queue still holds delayed messages."""
    from duetime.nservicebus.frontdoor import front_door_queue, legacy_front_door_queue
    from duetime.registry import open_store
    from duetime.settings import TransactionMode

    async def go() -> None:
        s = open_store(store)
        try:
            await s.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
            counts = await s.counts(SYSTEM.now())
        finally:
            await s.close()
        if counts.total:
            raise DuetimeError(
                f"{endpoint}'s store still holds {counts.total} delayed messages (next due {counts.next_due}); "
                "keep its dispatcher running until they are delivered."
            )
        async with _native(url, "duetime") as native:
            queues = {
                q: await native.depth(q)
                for q in (front_door_queue(endpoint), legacy_front_door_queue(endpoint))
            }
            for queue, waiting in queues.items():
                if waiting > 0:
                    raise DuetimeError(
                        f"{queue} still holds {waiting} messages for the store; run the dispatcher first."
                    )
            for queue, waiting in queues.items():
                if waiting == 0 and delete_front_door:
                    native.transport.addresses.add(queue)  # its NServiceBus exchange goes with it
                    await native.transport.delete(queue)
                    console.print(f"deleted the empty front-door queue {queue}")
        say(
            f"{endpoint}'s store is empty and can be retired:",
            "green",
            "stop its dispatcher, send every delay natively (DelayRouter without a store), and drop "
            f"the table {endpoint}.delayed when you like.",
        )

    _run(go)
