"""`duetime serve`: the HTTP API over a store; `duetime api-keys`: the keys that may call it."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from duetime.audit import Action
from duetime.cli import exit_watchdog as lastresort
from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    ErrorQueueOpt,
    StoreOpt,
    TransportOpt,
    app,
    changing,
    configure_logging,
    with_capability,
)
from duetime.cli.terminal import console, err, fail, table
from duetime.cli.terminal import run_async as _run
from duetime.cli.terminal import show as show_table
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, MissingExtra
from duetime.inputs.durations import parse_duration
from duetime.inputs.urls import redact
from duetime.interfaces import ApiKeyStore
from duetime.observability.logs import LogFormat
from duetime.registry import check_store_exists
from duetime.settings import DEFAULT_ENDPOINT, DEFAULT_ERROR_QUEUE

log = logging.getLogger("duetime.api")
T = TypeVar("T")

keys_app = typer.Typer(
    help="The API keys that may call `duetime serve`: create (the secret is printed once), list, revoke.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="api-keys")


@app.command(short_help="Serve the HTTP API: schedule, look up and cancel messages from any language.")
def serve(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on: 127.0.0.1 is this machine only; 0.0.0.0 lets other machines "
            "in (refused until the store holds an API key)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 8081,
    timeout: Annotated[
        str, typer.Option(help="How long a request waits for the store before answering 503: 10s, 30s, ...")
    ] = "10s",
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            help="The reverse proxies (addresses, comma-separated) whose X-Forwarded-For and "
            "X-Forwarded-Proto are believed (TLS ended at the proxy).",
        ),
    ] = None,
    certfile: Annotated[
        str | None,
        typer.Option("--tls-cert", help="Serve HTTPS with this certificate (PEM; with --tls-key)."),
    ] = None,
    keyfile: Annotated[
        str | None, typer.Option("--tls-key", help="The certificate's private key (PEM).")
    ] = None,
    share_port: Annotated[
        bool,
        typer.Option(
            "--share-port",
            help="Let other `duetime serve` processes listen on the same port (each started with "
            "it): the kernel spreads connections among them, one per core. Each holds a key to its "
            "rate on its own.",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="Server processes on the port, one per core is a good start: one process answers "
            "on one core. The command watches them, and ends them all when it ends or one fails. "
            "Each holds a key to its rate on its own.",
        ),
    ] = 1,
    openapi: Annotated[
        bool, typer.Option("--openapi", help="Print the OpenAPI document and exit (serves nothing).")
    ] = False,
    log_format: Annotated[LogFormat, typer.Option("--log-format", help="text or json.")] = LogFormat.TEXT,
) -> None:
    """Serve the HTTP API: messages (create, batch, get, list, reschedule, cancel), recurring
    schedules, the error queue, stats, /healthz and /readyz, and its OpenAPI document at
    /openapi.json. Every request needs an API key once the store holds one.

    \b
      KEY=$(duetime api-keys create billing --scope schedule,read | tail -n 1)
      duetime serve --store postgresql://db/app --port 8081
      curl -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \\
        -d '{"destination": "orders", "delay": "10m", "body": "hi"}' http://127.0.0.1:8081/v1/messages
    """
    if openapi:
        print(json.dumps(openapi_document(), indent=2))
        return
    try:
        import uvicorn  # noqa: F401

        from duetime.api import HttpApi
    except ModuleNotFoundError as missing:
        raise MissingExtra.for_module(missing, "duetime serve") or missing from None
    from duetime.cli.heap import settle_heap
    from duetime.cli.workers import follow_parent, run_workers, tell_started, worker_of
    from duetime.observability.webserver import bind, loopback
    from duetime.observability.webserver import serve as serve_app

    if (certfile is None) != (keyfile is None):
        raise typer.BadParameter("give --tls-cert and --tls-key together")
    configure_logging(False, log_format)
    answer_within = parse_duration(timeout).total_seconds()
    if not 0 < answer_within <= 3600:
        raise typer.BadParameter("--timeout must be more than 0s and at most 1h")
    parent = worker_of()
    if parent is not None:
        follow_parent(parent)
        share_port = True
    elif workers > 1:
        if port == 0:
            raise typer.BadParameter("--workers needs a port (--port 0 would give each worker another)")
        raise typer.Exit(run_workers(workers, sys.argv[1:], port))
    sock = bind(host, port, what="The API port", option="--port", shared=share_port)

    async def go() -> None:
        try:
            api = await HttpApi.open(
                check_store_exists(store),
                endpoint=endpoint,
                transport=transport,
                error_queue=error_queue,
                answer_within=answer_within,
            )
        except BaseException:
            sock.close()
            raise
        try:
            keyed = await api.access.any_key()
            if not keyed and not loopback(host):
                raise ConfigurationError(
                    f"--host {host} lets other machines in, and the store holds no API key: make one "
                    "first (duetime api-keys create NAME --scope schedule,read)"
                )
            address, bound = sock.getsockname()[:2]
            scheme = "https" if certfile else "http"

            def ready() -> None:
                settle_heap()
                if parent is not None:
                    tell_started(parent)
                log.info(
                    "HTTP API of %s on %s://%s:%d/ (%s)",
                    redact(store),
                    scheme,
                    address,
                    bound,
                    "requests need an API key" if keyed else "no API key yet: open to this machine only",
                )

            await serve_app(
                api.app(ready=ready),
                sock,
                forwarded_allow_ips=forwarded_allow_ips,
                certfile=certfile,
                keyfile=keyfile,
            )
        finally:
            lastresort.arm(answer_within + 5, lambda: 0, lambda: None)
            await api.close()
            sock.close()

    _run(go)


def openapi_document() -> dict[str, object]:
    """The OpenAPI document, made from the routes without a store."""
    try:
        from duetime.api.app import create_app
    except ModuleNotFoundError as missing:
        raise MissingExtra.for_module(missing, "duetime serve --openapi") or missing from None
    app_ = create_app(None)  # type: ignore[arg-type]  # the document needs the routes only
    document: dict[str, object] = app_.openapi()
    return document


def _with_keys(store: str, endpoint: str, work: Callable[[ApiKeyStore], Awaitable[T]]) -> T:
    return with_capability(store, endpoint, ApiKeyStore, "API keys", work)  # type: ignore[type-abstract]


@keys_app.command("create")
def keys_create(
    name: Annotated[
        str, typer.Argument(help="The key's name, shown in every request's log line (billing-service).")
    ],
    scope: Annotated[
        str, typer.Option("--scope", help="What it may do, comma-separated: schedule, read, manage.")
    ] = "schedule,read",
    rate: Annotated[
        float, typer.Option("--rate", help="Requests a second it may make (more answer 429).")
    ] = 100.0,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Make an API key; its secret is printed once, as the last line, and kept nowhere.

    `schedule` creates, reschedules and cancels messages; `read` reads messages, schedules, the
    error queue and stats; `manage` changes recurring schedules, retries and discards failed
    messages, and cancels by group or destination.

      KEY=$(duetime api-keys create billing --scope schedule,read | tail -n 1)
    """
    from duetime.api_keys import new_key, read_scopes

    key, secret = new_key(name, read_scopes(scope), SYSTEM.now(), rate)
    said = {"detail": f"scopes {','.join(sorted(x.value for x in key.scopes))}, {key.rate:g}/s"}
    _with_keys(
        store, endpoint, changing(lambda s: s.add_api_key(key), Action.API_KEY_CREATE, name, lambda _: said)
    )
    err.print(
        f"created API key {key.name!r} ({','.join(sorted(x.value for x in key.scopes))}, {key.rate:g} "
        "requests a second); its secret follows, shown this once:"
    )
    sys.stdout.write(secret + "\n")


@keys_app.command("list")
def keys_list(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Every key: its name, scopes, rate, the secret's first characters, made and revoked when."""
    rows = [
        {
            "name": k.name,
            "scopes": ",".join(sorted(x.value for x in k.scopes)),
            "rate": k.rate,
            "starts": k.hint,
            "created_at": k.created_at.isoformat(),
            "revoked_at": None if k.revoked_at is None else k.revoked_at.isoformat(),
        }
        for k in _with_keys(store, endpoint, lambda s: s.api_keys())
    ]
    if as_json:
        sys.stdout.writelines(json.dumps(r) + "\n" for r in rows)
        return
    if not rows:
        err.print("no API keys (duetime api-keys create NAME --scope schedule,read makes one)")
        return
    grid = table("name", "scopes", "rate/s", "starts", "created", "revoked")
    for r in rows:
        grid.add_row(
            str(r["name"]),
            str(r["scopes"]),
            f"{r['rate']:g}",
            str(r["starts"]),
            str(r["created_at"]),
            str(r["revoked_at"] or "-"),
        )
    show_table(grid)


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="The key's name.")],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Refuse a key from now on (every server of the store refuses it within 2 seconds)."""
    if not _with_keys(
        store, endpoint, changing(lambda s: s.revoke_api_key(name, SYSTEM.now()), Action.API_KEY_REVOKE, name)
    ):
        raise fail(f"no API key {name!r} in use (see duetime api-keys list)")
    console.print(f"revoked {name}")
