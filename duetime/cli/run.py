"""`duetime setup`, `duetime run` and `duetime demo`: create the tables, deliver, try it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any

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
    transport_url_for,
)
from duetime.cli.heap import settle_heap
from duetime.cli.terminal import EXIT_CRITICAL, console, fail, guarded, say
from duetime.cli.terminal import run_async as _run
from duetime.clock import SYSTEM
from duetime.engine.deadline import within
from duetime.engine.dispatcher import SKEW_WARNING, Dispatcher
from duetime.engine.outages import Backoff
from duetime.engine.routes import described, read_routes, route_transport, routed
from duetime.errors import DuetimeError, InvalidSetting, one_line
from duetime.inputs.urls import redact
from duetime.interfaces import DeliveryLog, ServerClock
from duetime.nservicebus.frontdoor import front_door_queue
from duetime.observability.deliverylog import SqlDeliveryLog, open_delivery_log
from duetime.observability.logs import LogFormat
from duetime.registry import has_default_transport, open_ready_store, open_store, open_transport
from duetime.service import Service
from duetime.settings import (
    DEFAULT_ENDPOINT,
    DEFAULT_ERROR_QUEUE,
    DelayedDeliverySettings,
    TransactionMode,
    setting_value,
)


@app.command()
def setup(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
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
    configure_logging(False)  # a change to a table in use says what it is doing while it does it
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


# The options of `duetime run`.
ModeOpt = Annotated[
    TransactionMode | None,
    typer.Option(
        help="Default: exactly-once where the transport shares the store's transaction (a SQLite "
        "or PostgreSQL store delivering into its own queue tables), at-least-once otherwise."
    ),
]

BurstOpt = Annotated[
    bool,
    typer.Option(help="Store what waits at the front door, forward what is due now, then exit (cron-style)."),
]

RetriesOpt = Annotated[int | None, typer.Option(help="NumberOfRetries before the error queue (default 0).")]

BatchSizeOpt = Annotated[int | None, typer.Option(help="Messages claimed per round trip (default 100).")]

LatenessBudgetOpt = Annotated[
    str | None,
    typer.Option(
        help="How late a due message may be delivered, so that one round (or one send) carries "
        "every message due by then (default 1ms, at most 1s; never early). The dispatcher claims "
        "(or, exactly-once, moves) what comes due within DUETIME_CLAIM_WINDOW (50ms) and delivers "
        "each at its due time rounded up to a whole budget. A larger budget trades punctuality "
        "for CPU: at a few hundred messages a second, 20ms costs about half the CPU a message of "
        "1ms, with the consumer. Also "
        "DUETIME_LATENESS_BUDGET.",
        show_default=False,
    ),
]

FrontDoorOpt = Annotated[
    bool,
    typer.Option(
        "--front-door/--no-front-door",
        help="Also store what senders put on the <endpoint>.Timeouts queue (NServiceBus's timeout "
        "manager queue; the old name <endpoint>.timeouts too while it exists). Needs a transport "
        "duetime can read from: RabbitMQ, NATS, Redis streams or the store's own queue tables.",
    ),
]

RouteOpt = Annotated[
    list[str],
    typer.Option(
        "--route",
        help="PATTERN=TRANSPORT_URL: destinations matching the pattern (orders.*, as the shell "
        "matches) go to that transport instead, e.g. 'reminders.*=webhooks://' or "
        "'orders.*=amqp://guest:guest@localhost/'. Repeat it; the first that matches wins, "
        "--transport takes the rest and the error queue (unless a route names it). "
        "DUETIME_ROUTES holds them separated by spaces. With routes, delivery is at-least-once. "
        "'sealed:' before a URL delivers that route's messages encrypted with the keyring "
        "(DUETIME_ENCRYPTION_KEYS), for a consumer that holds it.",
        show_default=False,
    ),
]

SetupOpt = Annotated[bool, typer.Option("--setup/--no-setup", help="Create tables first.")]

DeliveryLogOpt = Annotated[
    str | None,
    typer.Option(
        help="Log every delivery for `duetime bulk report`: jsonl:/folder, or a database URL "
        "(table duetime_delivery_log).",
    ),
]

VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log every batch (debug level).")]

LogFormatOpt = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        help="text (one line per record, UTC timestamps) or json (one object per line).",
    ),
]

MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=65535,
        help="Serve Prometheus metrics on /metrics and the probes /healthz (alive) and /readyz "
        "(store and transport reachable) on this port. Needs duetime\\[metrics].",
    ),
]

MetricsHostOpt = Annotated[
    str,
    typer.Option(
        help="Address the metrics port listens on; 0.0.0.0 to let other machines (Prometheus, "
        "a kubelet) reach it.",
    ),
]

ReadyAfterOpt = Annotated[
    float,
    typer.Option(
        min=0,
        help="/readyz answers 503 once a circuit breaker has been failing this many seconds.",
    ),
]


@app.command()
def run(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    route: RouteOpt = [],  # noqa: B006
    mode: ModeOpt = None,
    burst: BurstOpt = False,
    retries: RetriesOpt = None,
    batch_size: BatchSizeOpt = None,
    lateness_budget: LatenessBudgetOpt = None,
    error_queue: ErrorQueueOpt = DEFAULT_ERROR_QUEUE,
    front_door: FrontDoorOpt = False,
    auto_setup: SetupOpt = True,
    delivery_log: DeliveryLogOpt = None,
    verbose: VerboseOpt = False,
    log_format: LogFormatOpt = LogFormat.TEXT,
    metrics_port: MetricsPortOpt = None,
    metrics_host: MetricsHostOpt = "127.0.0.1",
    ready_after: ReadyAfterOpt = 10.0,
) -> None:
    """Run the dispatcher until SIGTERM/SIGINT. Settings also come from DUETIME_* variables.

    A circuit breaker that trips (the store or transport failing for 30 s) ends the process with
    exit code 3, so a supervisor restarts it; a stop signal finishes the batch in flight first.
    """
    configure_logging(verbose, log_format)
    given = (mode, retries, batch_size, lateness_budget, error_queue)  # in _FLAGS's order
    base_settings = _settings(dict(zip(_FLAGS, given, strict=True)))
    routes = read_routes(route)

    async def go() -> None:
        settings, shown = base_settings, transport_url_for(store, transport)
        async with contextlib.AsyncExitStack() as opened:
            # whatever was opened is closed, also when a later step of the start fails
            s = open_store(store, claim_timeout=settings.claim_timeout)
            opened.push_async_callback(_close, s.close)
            t = routed(routes, shown, open_transport, Backoff.of(settings))
            opened.push_async_callback(_close, t.close)
            log = await _open_log(delivery_log, opened)
            service = Service(
                s,
                t,
                settings,
                endpoint=endpoint,
                front_door=front_door,
                metrics_port=None if burst else metrics_port,
                metrics_host=metrics_host,
                ready_after=ready_after,
                delivery_log=log,
                setup=auto_setup,
                transport_name=described(routes, shown) if routes else redact(shown),
            )
            try:
                await (_burst(service) if burst else _serve(service, redact(store)))
            finally:
                _leave_if_stuck(service.dispatcher, settings)

    _run(go)


#: The settings each of `run`'s flags sets.
_FLAGS = {
    "--mode": "transaction_mode",
    "--retries": "number_of_retries",
    "--batch-size": "batch_size",
    "--lateness-budget": "lateness_budget",
    "--error-queue": "error_queue",
}


def _settings(flags: dict[str, Any]) -> DelayedDeliverySettings:
    """The settings from DUETIME_* variables and the flags given; a wrong value is refused before
    anything opens, naming the flag as it was typed."""
    changes = {
        _FLAGS[flag]: setting_value(_FLAGS[flag], f"{flag} {value!r}", value)
        if isinstance(value, str)
        else value
        for flag, value in flags.items()
        if value is not None
    }
    try:
        return DelayedDeliverySettings.from_env().with_changes(**changes)
    except InvalidSetting as wrong:
        flag = next((f for f, name in _FLAGS.items() if name == wrong.setting), None)
        if flag is not None and flags[flag] is not None:
            raise wrong.named(f"{flag} {flags[flag]}") from None
        raise


async def _open_log(where: str | None, opened: contextlib.AsyncExitStack) -> DeliveryLog | None:
    """The delivery log asked for, open and reachable, closed with the rest of the run."""
    if where is None:
        return None
    log = open_delivery_log(where)
    opened.push_async_callback(_close, log.close)
    if isinstance(log, SqlDeliveryLog):
        await asyncio.to_thread(log.reach)
    return log


async def _burst(service: Service) -> None:
    stats = await service.run_burst()
    console.print(f"forwarded {stats.forwarded}, to the error queue {stats.dead_lettered}")


async def _serve(service: Service, store: str) -> None:
    """The service until SIGTERM or SIGINT (or a tripped breaker), with the lines an operator
    reads: "dispatching" once the store answered and the transport connected (a wrong broker
    password was said to be dispatching before it failed), and what it did when it stops."""
    dispatcher = service.dispatcher
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    watch = asyncio.ensure_future(
        _on_stop(dispatcher, lambda: _leave_if_stuck(dispatcher, dispatcher.settings))
    )
    try:
        await service.start()
        if not dispatcher.stopping:
            door = (
                f", and storing what arrives on {front_door_queue(service.endpoint)}"
                if service.front_door
                else ""
            )
            logging.getLogger("duetime").info(
                "dispatching endpoint %s from %s to %s, %s%s; Ctrl-C to stop",
                service.endpoint,
                store,
                service.transport_name,
                dispatcher.mode.value,
                door,
            )
            settle_heap()
        await service.wait()
    finally:
        watch.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
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
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
    route: RouteOpt = [],  # noqa: B006
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
    routes = read_routes(route)  # each route's transport is checked too, as `run` would use it

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
        urls = list(dict.fromkeys([r.url for r in routes] + ([transport_url] if transport_url else [])))
        if not urls:
            return f"{answers}; no transport given (--transport), so none checked{skew}"
        for url in urls:
            try:
                t = route_transport(url, open_transport)
                await within(t.start(), timeout, "connecting")
            except Exception as error:
                raise _NotOk(_said("transport", url, error)) from None
            await _quietly(t.close())
        shown = described(routes, transport_url or "") if routes else redact(urls[0])
        return f"{answers}; transport {shown} connects{skew}"

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
