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
)
from duetime.cli.terminal import run_async as _run
from duetime.inputs.durations import parse_duration
from duetime.observability.logs import LogFormat
from duetime.settings import (
    DEFAULT_DASHBOARD_HOST,
    DEFAULT_DASHBOARD_PORT,
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
    ] = DEFAULT_DASHBOARD_HOST,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to serve on.")] = DEFAULT_DASHBOARD_PORT,
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
    from duetime.dashboard.server import DashboardServer

    configure_logging(False, log_format)
    server = DashboardServer(
        store,
        endpoint,
        transport=transport,
        error_queue=error_queue,
        host=host,
        port=port,
        read_only=read_only,
        show_contents=show_contents,
        allow_no_password=allow_no_password,
        sample_every=parse_duration(sample_every).total_seconds(),
        answer_within=parse_duration(timeout).total_seconds(),
        forwarded_allow_ips=forwarded_allow_ips,
    )
    sock = server.bind()

    def stopping() -> None:
        # a store behind a partition answers no goodbye, and Python waits at exit for the thread
        # still waiting on it: leave after --timeout, as `duetime run` does
        lastresort.arm(server.answer_within + 5, lambda: 0, lambda: None)

    _run(lambda: server.serve(sock, on_stop=stopping))
