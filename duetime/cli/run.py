"""`duetime setup`, `duetime run` and `duetime demo`: create the tables, deliver, try it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from duetime.cli import exit_watchdog as lastresort
from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    ErrorQueueOpt,
    StoreOpt,
    TransportOpt,
    app,
    configure_logging,
    open_ready_store,
    safest_mode,
    transport_url_for,
)
from duetime.cli.terminal import EXIT_CRITICAL, console, fail, guarded, say
from duetime.cli.terminal import run_async as _run
from duetime.clock import SYSTEM
from duetime.engine.deadline import within
from duetime.engine.dispatcher import SKEW_WARNING, Dispatcher, run_until_signal
from duetime.errors import ConfigurationError, DuetimeError, InvalidSetting, one_line
from duetime.inputs.urls import redact
from duetime.interfaces import ReceivingTransport, ServerClock
from duetime.nservicebus.frontdoor import FrontDoor, front_door_queue
from duetime.observability.deliverylog import SqlDeliveryLog, open_delivery_log
from duetime.observability.heartbeat import Heartbeat
from duetime.observability.logs import LogFormat
from duetime.registry import has_default_transport, open_store, open_transport
from duetime.settings import DelayedDeliverySettings, TransactionMode

if TYPE_CHECKING:
    from duetime.observability.probes import ProbeServer


@app.command()
def setup(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    queue: Annotated[
        list[str],
        typer.Option(
            "--queue", "-q", help="Also declare this queue on the transport (the error queue comes with it)."
        ),
    ] = [],  # noqa: B006
    transport: TransportOpt = None,
) -> None:
    """Create the store's tables (idempotent; safe to run from several processes at once).

    With --queue (or --transport), the transport is connected and the queues declared on it: the
    ones named, and the error queue ("error") the dispatcher sends failures to. Without
    --transport that is the queue tables in the store's own database.
    """
    declaring = bool(queue or transport)  # a store without queue tables of its own needs --transport
    where = transport_url_for(store, transport) if declaring else ""
    names = [*queue, DelayedDeliverySettings.from_env().error_queue]

    async def go() -> None:
        s = open_store(store)
        try:
            await s.setup_infrastructure(endpoint)
        finally:
            await s.close()
        if declaring:
            t = open_transport(where)
            try:
                await t.start()
                for name in names:
                    await t.declare(name)
            finally:
                await t.close()

    _run(go)
    say("ready:", "green", f"endpoint {endpoint!r} in {redact(store)}")
    if declaring:
        say("declared:", "green", f"{', '.join(names)} on {redact(where)}")


@app.command()
def run(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    transport: TransportOpt = None,
    mode: Annotated[
        TransactionMode | None,
        typer.Option(
            help="Default: exactly-once where the transport shares the store's transaction (a SQLite "
            "or PostgreSQL store delivering into its own queue tables), at-least-once otherwise."
        ),
    ] = None,
    burst: Annotated[
        bool,
        typer.Option(
            help="Store what waits at the front door, forward what is due now, then exit (cron-style)."
        ),
    ] = False,
    retries: Annotated[
        int | None, typer.Option(help="NumberOfRetries before the error queue (default 0).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Messages claimed per round trip (default 100).")
    ] = None,
    error_queue: ErrorQueueOpt = "error",
    front_door: Annotated[
        bool,
        typer.Option(
            "--front-door/--no-front-door",
            envvar="DUETIME_FRONT_DOOR",
            help="Also store what senders put on the <endpoint>.Timeouts queue (NServiceBus's timeout "
            "manager queue; the old name <endpoint>.timeouts too while it exists). Needs a transport "
            "duetime can read from: RabbitMQ, NATS, Redis streams or the store's own queue tables.",
        ),
    ] = False,
    auto_setup: Annotated[bool, typer.Option("--setup/--no-setup", help="Create tables first.")] = True,
    delivery_log: Annotated[
        str | None,
        typer.Option(
            help="Log every delivery for `duetime bulk report`: jsonl:/folder, or a database URL "
            "(table duetime_delivery_log).",
            envvar="DUETIME_DELIVERY_LOG",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every batch (debug level).")] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            "--log-format",
            envvar="DUETIME_LOG_FORMAT",
            help="text (one line per record, UTC timestamps) or json (one object per line).",
        ),
    ] = LogFormat.TEXT,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="DUETIME_METRICS_PORT",
            min=0,
            max=65535,
            help="Serve Prometheus metrics on /metrics and the probes /healthz (alive) and /readyz "
            "(store and transport reachable) on this port. Needs duetime\\[metrics].",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            envvar="DUETIME_METRICS_HOST",
            help="Address the metrics port listens on; 0.0.0.0 to let other machines (Prometheus, "
            "a kubelet) reach it.",
        ),
    ] = "127.0.0.1",
    ready_after: Annotated[
        float,
        typer.Option(
            envvar="DUETIME_READY_AFTER",
            min=0,
            help="/readyz answers 503 once a circuit breaker has been failing this many seconds.",
        ),
    ] = 10.0,
) -> None:
    """Run the dispatcher until SIGTERM/SIGINT. Settings also come from DUETIME_* variables.

    A circuit breaker that trips (the store or transport failing for 30 s) ends the process with
    exit code 3, so a supervisor restarts it; a stop signal finishes the batch in flight first.
    """
    configure_logging(verbose, log_format)
    flags = {"transaction_mode": "--mode", "number_of_retries": "--retries", "batch_size": "--batch-size"}
    flags["error_queue"] = "--error-queue"
    given: dict[str, Any] = {"transaction_mode": mode, "number_of_retries": retries, "batch_size": batch_size}
    given["error_queue"] = error_queue
    changes = {key: value for key, value in given.items() if value is not None}
    try:  # refused before anything opens, naming the flag as it was typed
        base_settings = DelayedDeliverySettings.from_env().with_changes(**changes)
    except InvalidSetting as wrong:
        if wrong.setting in changes:
            raise wrong.named(f"{flags[wrong.setting]} {changes[wrong.setting]}") from None
        raise

    async def go() -> None:
        settings = base_settings
        async with contextlib.AsyncExitStack() as opened:
            # whatever was opened is closed, also when a later step of the start fails
            s = open_store(store, claim_timeout=settings.claim_timeout)
            opened.push_async_callback(_close, s.close)
            t = open_transport(transport_url_for(store, transport))
            opened.push_async_callback(_close, t.close)
            if front_door and not isinstance(t, ReceivingTransport):
                raise ConfigurationError(
                    f"--front-door needs a transport duetime can read the {front_door_queue(endpoint)} "
                    f"queue from; {redact(transport_url_for(store, transport))} is not one (use RabbitMQ, "
                    "NATS, Redis streams or the store's own queue tables), or leave --front-door out."
                )
            if mode is None and "DUETIME_TRANSACTION_MODE" not in os.environ:
                settings = settings.with_changes(transaction_mode=safest_mode(s, t))
            if auto_setup:
                await s.setup_infrastructure(endpoint)
            log = None if delivery_log is None else open_delivery_log(delivery_log)
            if log is not None:
                opened.push_async_callback(_close, log.close)
            if isinstance(log, SqlDeliveryLog):
                await asyncio.to_thread(log.reach)
            await _dispatch(Dispatcher(s, t, settings, endpoint=endpoint, delivery_log=log), t, settings)

    async def _say_dispatching(dispatcher: Dispatcher, settings: DelayedDeliverySettings) -> None:
        """ "dispatching" once it is: the store answered and the transport connected (a wrong
        broker password was said to be dispatching before it failed)."""
        await dispatcher.connected()
        logging.getLogger("duetime").info(
            "dispatching endpoint %s from %s to %s, %s%s; Ctrl-C to stop",
            endpoint,
            redact(store),
            redact(transport_url_for(store, transport)),
            settings.transaction_mode.value,
            f", and storing what arrives on {front_door_queue(endpoint)}" if front_door else "",
        )

    async def _dispatch(dispatcher: Dispatcher, t: object, settings: DelayedDeliverySettings) -> None:
        try:
            await _dispatch_until_stopped(dispatcher, t, settings)
        finally:
            _leave_if_stuck(dispatcher, settings)

    async def _dispatch_until_stopped(
        dispatcher: Dispatcher, t: object, settings: DelayedDeliverySettings
    ) -> None:
        if burst:
            if front_door and isinstance(t, ReceivingTransport):
                await dispatcher.start()
                door = FrontDoor(dispatcher, t, wait=0.5)
                await door.start()
                while await door.process_once():  # take in what waits at the front door first
                    pass
            stats = await dispatcher.run_burst()
            # recorded as a dispatcher that ran and stopped: `stats` said none had run
            await Heartbeat(dispatcher, redact(transport_url_for(store, transport))).beat(stopped=True)
            console.print(f"forwarded {stats.forwarded}, to the error queue {stats.dead_lettered}")
            return
        # the probes' port first: one in use is an error before any companion coroutine exists
        probes = (
            None if metrics_port is None else _probes(dispatcher, metrics_host, metrics_port, ready_after)
        )
        extra = [
            Heartbeat(dispatcher, redact(transport_url_for(store, transport))).run(),
            _on_stop(dispatcher, lambda: _leave_if_stuck(dispatcher, settings)),
        ]
        if probes is not None:
            extra.append(probes.run())
        if front_door and isinstance(t, ReceivingTransport):
            extra.append(FrontDoor(dispatcher, t).run())
        extra.append(_say_dispatching(dispatcher, settings))
        await run_until_signal(dispatcher, *extra)
        done = dispatcher.stats
        logging.getLogger("duetime").info(
            "stopped: forwarded %s, to the error queue %s, retried %s, outages %s since it started",
            f"{done.forwarded:,}",
            f"{done.dead_lettered:,}",
            f"{done.retries:,}",
            f"{done.outages:,}",
            extra={
                "fields": {
                    "forwarded": done.forwarded,
                    "dead_lettered": done.dead_lettered,
                    "retried": done.retries,
                    "outages": done.outages,
                }
            },
        )

    _run(go)


async def _on_stop(dispatcher: Dispatcher, then: Callable[[], None]) -> None:
    """Call ``then`` once a stop is asked for (a signal, or a breaker that tripped)."""
    while not await dispatcher.wait_for_stop(3600):
        pass
    then()


#: A run its breakers ended has no batch left to finish: it closes what answers within this many
#: seconds (at most ``stop_timeout``) and leaves, so its supervisor starts it again soon after the
#: breaker's time, not a whole ``stop_timeout`` later.
CRITICAL_EXIT_WITHIN = 5.0


def _leave_if_stuck(dispatcher: Dispatcher, settings: DelayedDeliverySettings) -> None:
    """From the moment a run stops, it has ``stop_timeout`` to end, or after a critical error
    :data:`CRITICAL_EXIT_WITHIN` (see duetime.cli.exit_watchdog)."""

    def last_words() -> None:
        critical = dispatcher.critical_error
        if critical is not None:  # what the way out would have said (exit code 3)
            fail(str(critical), code=EXIT_CRITICAL, label="critical:")

    seconds = settings.stop_timeout.total_seconds()
    if dispatcher.critical_error is not None:
        seconds = min(seconds, CRITICAL_EXIT_WITHIN)
    lastresort.arm(
        seconds,
        lambda: EXIT_CRITICAL if dispatcher.critical_error is not None else 1,
        last_words,
    )


async def _close(close: Callable[[], Awaitable[None]]) -> None:
    """Close one part of a run; a partitioned server may not answer a polite goodbye either:
    never hang on it, and never let it hide why the run ended."""
    try:
        await within(close(), 10.0, "closing")
    except Exception as error:
        logging.getLogger("duetime").warning("closing failed: %s", one_line(error))


@app.command(
    short_help="Exit 0 if the store answers and the transport connects, else 1 with the reason (for probes)."
)
def check(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = "duetime",
    transport: TransportOpt = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds each side may take to answer.")] = 10.0,
) -> None:
    """Exit 0 when the store is set up and answers and the transport accepts a connection; exit 1
    with a one-line reason otherwise. For scripts and exec probes (changes nothing). A store with
    no queue tables of its own (MariaDB, Redis) and no --transport: the store alone is checked.

    \b
      duetime check --store postgresql://db/app --transport amqp://mq
      ok: store postgresql://db/app answers (1,204 stored, 3 due); transport amqp://mq connects
    """
    # a store-only probe: MariaDB and Redis have no default transport to check
    transport_url = transport_url_for(store, transport) if transport or has_default_transport(store) else None

    async def go() -> str:
        try:
            s = await within(open_ready_store(store, endpoint), timeout, "opening the store")
        except Exception as error:
            raise _NotOk(_said("store", store, error)) from None
        skew = ""
        try:
            counts = await within(s.counts(SYSTEM.now()), timeout, "counting")
            if isinstance(s, ServerClock):
                before = SYSTEM.now()
                server = await within(s.server_time(), timeout, "reading the store's clock")
                if server is not None:
                    seconds = (server - before).total_seconds()
                    skew = f"; this host's clock is {abs(seconds):.1f} s {'behind' if seconds > 0 else 'ahead of'} the store's"
                    if abs(seconds) > SKEW_WARNING:
                        skew += " (due times and claims follow the store's; set this host's clock right: NTP)"
        except Exception as error:
            raise _NotOk(_said("store", store, error)) from None
        finally:
            await _quietly(s.close())
        answers = f"store {redact(store)} answers ({counts.said(counts.total)} stored, {counts.due:,} due)"
        if transport_url is None:
            return f"{answers}; no transport given (--transport), so none checked{skew}"
        try:
            t = open_transport(transport_url)
            await within(t.start(), timeout, "connecting")
        except Exception as error:
            raise _NotOk(_said("transport", transport_url, error)) from None
        await _quietly(t.close())
        return f"{answers}; transport {redact(transport_url)} connects{skew}"

    try:
        print("ok:", _run(go))
    except _NotOk as problem:
        print(f"not ok: {problem}", file=sys.stderr)
        raise typer.Exit(1) from None


def _said(side: str, url: str, error: Exception) -> str:
    """What ``check`` says of a failing side: duetime's own words as they are (they name the URL
    where it matters, and the error's class means nothing to the reader); a library's error with
    its class, after the URL."""
    if isinstance(error, DuetimeError):
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"{side}: {text}" if redact(url) in text else f"{side} {redact(url)}: {text}"
    return f"{side} {redact(url)}: {one_line(error)}"


class _NotOk(Exception):
    """What ``check`` found wrong (exit code 1, not the CLI's usual error handling)."""


async def _quietly(closing: Awaitable[None]) -> None:
    try:
        await within(closing, 5.0, "closing")
    except Exception as error:
        logging.getLogger("duetime").debug("closing failed: %s", one_line(error))


def _probes(dispatcher: Dispatcher, host: str, port: int, ready_after: float) -> ProbeServer:
    """The metrics and probe server, its port bound now (a port in use is a one-line error)."""
    from duetime.observability.metrics import instrument
    from duetime.observability.probes import ProbeServer, bind

    sock = bind(host, port)
    registry, backlog = instrument(dispatcher)
    server = ProbeServer(dispatcher, registry, backlog, sock, ready_after=ready_after)
    address, bound = server.address
    logging.getLogger("duetime").info(
        "metrics on http://%s:%d/metrics, probes /healthz and /readyz", address, bound
    )
    return server


#: The demo keeps every id it scheduled to check each arrives once: bounded, so a typo of a few
#: zeros is an error, not a machine out of memory.
DEMO_MOST = 1_000_000
DEMO_LONGEST = 3_600.0


@app.command()
def demo(
    messages: Annotated[int, typer.Option(help="How many delayed messages to schedule.")] = 5000,
    spread: Annotated[float, typer.Option(help="Due times spread over this many seconds.")] = 3.0,
    mode: Annotated[
        TransactionMode, typer.Option(help="Delivery guarantee to use.")
    ] = TransactionMode.EXACTLY_ONCE,
    db: Annotated[
        str | None, typer.Option(help="SQLite file to use (default: a fresh temporary one).")
    ] = None,
) -> None:
    """Schedule thousands of messages, deliver them, and prove none is lost, doubled or early."""
    from duetime.cli.demo import run_demo

    if not 1 <= messages <= DEMO_MOST or not 0 <= spread <= DEMO_LONGEST:
        raise typer.BadParameter(
            f"--messages must be from 1 to {DEMO_MOST:,} and --spread from 0 to {DEMO_LONGEST:,.0f} seconds "
            "(a demonstration: it keeps every id in memory to check each arrives once)"
        )
    ok = guarded(lambda: run_demo(messages, timedelta(seconds=spread), mode, db, console))
    raise typer.Exit(0 if ok else 2)
