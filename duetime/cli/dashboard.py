"""`duetime dashboard`: the web pages an operator opens to see and steer delivery."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from duetime.cli import exit_watchdog as lastresort
from duetime.cli.common import (
    DEFAULT_STORE,
    ErrorQueueOpt,
    StoreOpt,
    TransportOpt,
    app,
    configure_logging,
    transport_url_for,
)
from duetime.cli.terminal import run_async as _run
from duetime.inputs.durations import parse_duration
from duetime.inputs.urls import redact
from duetime.observability.logs import LogFormat
from duetime.settings import (
    DEFAULT_ENDPOINT,
    DEFAULT_ERROR_QUEUE,
)

log = logging.getLogger("duetime.dashboard")


@app.command(
    short_help="Serve the web dashboard: backlog, lateness, dispatchers, stored messages and the error queue."
)
def dashboard(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: Annotated[
        list[str],
        typer.Option("--endpoint", help="Endpoint to show; repeat it to show several."),
    ] = [DEFAULT_ENDPOINT],  # noqa: B006
    transport: TransportOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on: 127.0.0.1 is this machine only (a reverse proxy on it "
            "reaches it); 0.0.0.0 lets other machines in (set a password first).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = 8080,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Serve the pages only: no cancel, reschedule or retry.")
    ] = False,
    show_contents: Annotated[
        bool,
        typer.Option(
            "--show-contents",
            help="Without a password, show message bodies and headers anyway (hidden by default: "
            "anyone who reaches the port would read them). With a password they are always shown.",
        ),
    ] = False,
    allow_no_password: Annotated[
        bool,
        typer.Option(
            "--allow-no-password",
            help="Listen on an address other machines reach although no DUETIME_DASHBOARD_PASSWORD "
            "is set (refused by default: the read-only pages would be open to the network).",
        ),
    ] = False,
    sample_every: Annotated[
        str, typer.Option(help="How often to look at the store for the charts: 10s, 1m, ...")
    ] = "10s",
    timeout: Annotated[
        str,
        typer.Option(
            help="How long a page or an action waits for the store or broker before answering 503 "
            "(a partitioned server never answers): 10s, 30s, ..."
        ),
    ] = "10s",
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            help="The reverse proxies (addresses, comma-separated) whose X-Forwarded-For names the "
            "client. Without it the client is the connection's own address: a header anyone can "
            "send is never taken for it (the login throttle counts per client).",
        ),
    ] = None,
    log_format: Annotated[LogFormat, typer.Option("--log-format", help="text or json.")] = LogFormat.TEXT,
) -> None:
    """Serve the web dashboard: backlog and lateness over time, live dispatchers, browse and search
    stored messages, cancel, reschedule or send one now, and the error queue's retry and discard.

    Changes need a login: set DUETIME_DASHBOARD_PASSWORD (and DUETIME_DASHBOARD_USER, default
    duetime); without a password the pages show but change nothing. Example:

      DUETIME_DASHBOARD_PASSWORD=s3cret duetime dashboard --store postgresql://db/app --port 8080
    """
    from duetime.dashboard.app import Dashboard
    from duetime.dashboard.security import Credentials, secret
    from duetime.observability.webserver import bind, loopback, serve

    configure_logging(False, log_format)
    every = parse_duration(sample_every).total_seconds()
    if every < 1:
        raise typer.BadParameter("--sample-every must be at least 1s")
    answer_within = parse_duration(timeout).total_seconds()
    if not 0 < answer_within <= 3600:
        raise typer.BadParameter("--timeout must be more than 0s and at most 1h")
    credentials = Credentials.from_env()
    sock = bind(host, port, what="The dashboard port", option="--port")  # an address it lacks: first
    if credentials is None and not allow_no_password and not loopback(host):
        sock.close()
        raise typer.BadParameter(
            f"--host {host} lets other machines in, and no DUETIME_DASHBOARD_PASSWORD is set: set "
            "one, or pass --allow-no-password to open the read-only pages to anyone who reaches the port"
        )

    async def go() -> None:
        try:
            board = await Dashboard.open(
                store,
                endpoint,
                transport_url=transport_url_for(store, transport),
                error_queue=error_queue,
                read_only=read_only,
                credentials=credentials,
                show_contents=show_contents,
                sample_every=every,
                answer_within=answer_within,
            )
        except BaseException:
            sock.close()
            raise
        address, bound = sock.getsockname()[:2]

        def ready() -> None:
            """Said once the server runs and a stop signal ends it cleanly: a script that stops
            it when it reads this line never kills it half-started (exit 143)."""
            log.info(
                "dashboard of %s on http://%s:%d/ (%s)",
                redact(store),
                address,
                bound,
                "read-only"
                if not board.can_change
                else f"changes need user {credentials.user if credentials else ''!r} and the password",
            )
            if credentials is None and not read_only:
                log.info("set DUETIME_DASHBOARD_PASSWORD to cancel, reschedule and retry from the dashboard")

        try:
            await serve(
                board.app(secret=secret(), ready=ready), sock, forwarded_allow_ips=forwarded_allow_ips
            )
        finally:
            # a store behind a partition answers no goodbye, and Python waits at exit for the
            # thread still waiting on it: leave after --timeout, as `duetime run` does
            lastresort.arm(answer_within + 5, lambda: 0, lambda: None)
            await board.close()
            sock.close()

    _run(go)
