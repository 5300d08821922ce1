"""`duetime recurring …`: messages delivered again and again (every 30 s, 09:00 each working day).

Each tick is a stored delayed message, planned a little ahead by the running dispatchers
(`duetime run`), so recurring messages need nothing else running.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from itertools import islice
from typing import Annotated, Any, TypeVar

import typer

from duetime import audit
from duetime.audit import Action
from duetime.cli.common import (
    DEFAULT_STORE,
    EndpointOpt,
    HeaderOpt,
    StoreOpt,
    TransportOpt,
    app,
    body_bytes,
    changing,
    headers_from_pairs,
    refuse_destination,
    warn_undeclared,
)
from duetime.cli.terminal import columns_text, console, err, show, table
from duetime.cli.terminal import run_async as _run
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_time
from duetime.interfaces import RecurringStore, ServerClock
from duetime.recurring.rules import Recurrence, recurrence_changed
from duetime.recurring.schedule import Schedule, changed, new_schedule, schedule_json
from duetime.registry import open_ready_store
from duetime.settings import DEFAULT_ENDPOINT

T = TypeVar("T")

recurring_app = typer.Typer(
    help="Messages delivered again and again: add, list, show, next, change, pause, resume, trigger, "
    "backfill, remove. The running dispatchers (duetime run) send each tick once.",
    no_args_is_help=True,
)
app.add_typer(recurring_app, name="recurring")

IdArg = Annotated[str, typer.Argument(help="The schedule's id (a name: nightly-invoices).")]
CronOpt = Annotated[
    str | None,
    typer.Option(
        "--cron",
        help="When, as a cron expression: '0 9 * * MON-FRI' (minute hour day month weekday), or 6 "
        "fields with seconds first.",
    ),
]
EveryOpt = Annotated[str | None, typer.Option("--every", help="Or an interval of elapsed time: 30s, 5m, 1h.")]
ZoneOpt = Annotated[
    str | None,
    typer.Option(
        "--zone", help="The time zone the cron expression is read in (IANA: Europe/Paris). Default UTC."
    ),
]
StartOpt = Annotated[
    str | None,
    typer.Option("--start", help="No tick before this (ISO 8601 with offset); an interval counts from it."),
]
EndOpt = Annotated[str | None, typer.Option("--end", help="No tick after this (ISO 8601 with offset).")]
CountOpt = Annotated[int | None, typer.Option("--count", min=1, help="At most this many ticks in all.")]
SkippedOpt = Annotated[
    str | None,
    typer.Option(
        "--skipped",
        help="A wall time that a spring-forward skips: 'run' fires once at the jump (as cron does), "
        "'skip' does not fire. Default run.",
    ),
]
CatchUpOpt = Annotated[
    str | None,
    typer.Option(
        "--catch-up",
        help="Ticks missed while no dispatcher ran: 'none', 'latest' (the default) or 'all'; those "
        "left out are counted and logged.",
    ),
]
WindowOpt = Annotated[
    str | None,
    typer.Option(
        "--catch-up-window", help="With --catch-up all: only the missed ticks of the last 1h (say)."
    ),
]
JitterOpt = Annotated[
    str | None,
    typer.Option(
        "--jitter",
        help="Each tick may go up to this after its time (30s, 5m): many schedules of one time "
        "then do not all fall due at once. 0 for none.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON, as read.")]


def _store_call(store: str, endpoint: str, work: Callable[[RecurringStore], Awaitable[T]]) -> T:
    return _store_read(store, endpoint, work)[0]


def _store_change(
    store: str,
    endpoint: str,
    work: Callable[[RecurringStore], Awaitable[T]],
    action: Action,
    schedule_id: str,
    said: Callable[[T], dict[str, Any]] = lambda _: {},
) -> T:
    """``work``, then the change kept in the store's audit trail."""
    return _store_call(store, endpoint, changing(work, action, schedule_id, said))


def _store_read(
    store: str, endpoint: str, work: Callable[[RecurringStore], Awaitable[T]]
) -> tuple[T, datetime]:
    """What ``work`` gives, and the store's time just after (a schedule's next tick is reckoned
    from it, as the dispatchers reckon, not from this host's clock)."""

    async def go() -> tuple[T, datetime]:
        s = await open_ready_store(store, endpoint)
        try:
            if not isinstance(s, RecurringStore):
                raise ConfigurationError(f"The store {type(s).__name__} keeps no recurring schedules.")
            done = await work(s)
            server = await s.server_time() if isinstance(s, ServerClock) else None
            return done, server or SYSTEM.now()
        finally:
            await s.close()

    return _run(go)


def _when(
    cron: str | None,
    every: str | None,
    zone: str | None,
    start: str | None,
    end: str | None,
    count: int | None,
    skipped: str | None,
    catch_up: str | None,
    window: str | None,
    base: Recurrence | None = None,
    jitter: str | None = None,
) -> Recurrence:
    """The recurrence the options give, over ``base`` (a change keeps what is not given)."""
    return recurrence_changed(
        base,
        cron=cron,
        every=every,
        zone=zone,
        start=parse_time(start) if start else None,
        end=parse_time(end) if end else None,
        count=count,
        skipped=skipped,
        catch_up=catch_up,
        catch_up_window=window,
        jitter=jitter,
    )


#: A long cron text is cut to this in the table (`show` has it whole), so ids keep their room.
WHEN_SHOWN = 48


def _short(text: str) -> str:
    return text if len(text) <= WHEN_SHOWN else text[: WHEN_SHOWN - 1] + "…"


def _row(s: Schedule, now: datetime) -> dict[str, Any]:
    return schedule_json(s, now)


def _said(s: Schedule, verb: str) -> None:
    following = s.next_planned(s.changed_at or SYSTEM.now())  # the store's time of the change
    then = "" if following is None else f"; next tick {following.isoformat()}"
    why = "" if s.set_aside is None else f": {s.set_aside}"
    console.print(
        f"{verb} {s.schedule_id}: {s.recurrence.describe()} -> {s.destination} ({s.state()}{why}){then}"
    )


@recurring_app.command()
def add(
    schedule_id: IdArg,
    destination: Annotated[str, typer.Argument(help="The queue each tick is for.")],
    body: Annotated[str, typer.Argument(help="Each tick's body (text).")] = "",
    cron: CronOpt = None,
    every: EveryOpt = None,
    zone: ZoneOpt = None,
    start: StartOpt = None,
    end: EndOpt = None,
    count: CountOpt = None,
    skipped: SkippedOpt = None,
    catch_up: CatchUpOpt = None,
    catch_up_window: WindowOpt = None,
    jitter: JitterOpt = None,
    header: HeaderOpt = [],  # noqa: B006
    paused: Annotated[
        bool, typer.Option("--paused", help="Keep it, but send nothing until resumed.")
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    transport: TransportOpt = None,
) -> None:
    """Add a recurring message.

    \b
      duetime recurring add invoices invoices.close '{}' --cron '0 9 * * MON-FRI' --zone Europe/Paris
      duetime recurring add ping health --every 30s
    """
    when = _when(cron, every, zone, start, end, count, skipped, catch_up, catch_up_window, jitter=jitter)
    refuse_destination(destination)
    made = new_schedule(
        schedule_id,
        destination,
        when,
        SYSTEM.now(),
        body=body_bytes(body),
        headers=headers_from_pairs(header),
        paused=paused,
    )
    _said(
        _store_change(
            store,
            endpoint,
            lambda s: s.add_schedule(made),
            Action.SCHEDULE_ADD,
            schedule_id,
            lambda s: {"detail": audit.schedule_detail(s.destination, s.paused)},
        ),
        "added",
    )  # planned from the store's time
    _run(lambda: warn_undeclared(store, transport, [destination]))


#: Schedules read, and printed, a page at a time.
LIST_PAGE = 500


@recurring_app.command("list")
def list_(
    store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT, as_json: JsonOpt = False
) -> None:
    """Every schedule: when, its state, the next tick, ticks sent and missed.

    Each page of 500 is printed as it is read (a table a page, or JSON lines with --json), so
    a store of a hundred thousand schedules lists in constant memory."""

    async def every_page(s: RecurringStore) -> int:
        server = s.server_time if isinstance(s, ServerClock) else None
        shown, after = 0, ""
        while True:
            page = await s.list_schedules(after, LIST_PAGE)
            now = (await server() if server else None) or SYSTEM.now()
            rows = [_row(x, now) for x in page]
            if as_json:
                sys.stdout.writelines(json.dumps(r) + "\n" for r in rows)
            elif shown == 0 and len(page) < LIST_PAGE:  # all of it on one page: a drawn table
                if rows:
                    show(_page_table(rows))
            else:  # pages of many: plain columns, the header once (a drawn table took 3 s a page)
                sys.stdout.write(columns_text(None if shown else LIST_COLUMNS, [_cells(r) for r in rows]))
            shown += len(rows)
            if len(page) < LIST_PAGE:
                return shown
            after = page[-1].schedule_id

    if not _store_call(store, endpoint, every_page) and not as_json:
        err.print("no recurring schedules (duetime recurring add ... adds one)")


LIST_COLUMNS = ("id", "destination", "when", "state", "next tick (UTC)", "planned", "missed")


def _cells(r: dict[str, Any]) -> list[str]:
    return [
        r["id"],
        r["destination"],
        _short(r["when"]),
        r["state"],
        r["next"] or "-",
        str(r["ticks_planned"]),
        str(r["ticks_missed"]),
    ]


def _page_table(rows: list[dict[str, Any]]) -> Any:
    t = table(*LIST_COLUMNS)
    for r in rows:
        t.add_row(*_cells(r))
    return t


@recurring_app.command("show")
def show_(
    schedule_id: IdArg, store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT
) -> None:
    """One schedule, whole, as JSON."""
    s, now = _store_read(store, endpoint, lambda st: st.get_schedule(schedule_id))
    print(json.dumps(_row(s, now), indent=2))


@recurring_app.command("next")
def next_(
    schedule_id: IdArg,
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=1000, help="How many.")] = 10,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """The next planned tick times, in UTC and in the schedule's zone."""
    s, now = _store_read(store, endpoint, lambda st: st.get_schedule(schedule_id))
    zone = s.recurrence.tz
    for at in islice(s.recurrence.ticks(now), count):
        print(f"{at.astimezone(UTC).isoformat()}  {at.astimezone(zone).isoformat()} {s.recurrence.zone}")


@recurring_app.command()
def change(
    schedule_id: IdArg,
    destination: Annotated[str | None, typer.Option("--destination", help="A new destination.")] = None,
    body: Annotated[str | None, typer.Option("--body", help="A new body (text).")] = None,
    cron: CronOpt = None,
    every: EveryOpt = None,
    zone: ZoneOpt = None,
    start: StartOpt = None,
    end: EndOpt = None,
    count: CountOpt = None,
    skipped: SkippedOpt = None,
    catch_up: CatchUpOpt = None,
    catch_up_window: WindowOpt = None,
    jitter: JitterOpt = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Change a schedule; it takes effect from its next tick (what is not given stays)."""
    if destination is not None:
        refuse_destination(destination)

    def apply(s: Schedule) -> Schedule:
        when = _when(
            cron, every, zone, start, end, count, skipped, catch_up, catch_up_window, s.recurrence, jitter
        )
        return changed(s, when=when, destination=destination, body=None if body is None else body_bytes(body))

    async def go(s: RecurringStore) -> Schedule:
        apply(await s.get_schedule(schedule_id))  # bad input: one line, nothing changed
        return await s.change_schedule(schedule_id, apply)

    given = {"when": any(x is not None for x in (cron, every, zone, start, end, count, skipped, catch_up,
                                                 catch_up_window, jitter)),
             "destination": destination is not None, "body": body is not None}  # fmt: skip
    detail = audit.changes_detail(name for name, set_ in given.items() if set_)
    _said(
        _store_change(store, endpoint, go, Action.SCHEDULE_CHANGE, schedule_id, lambda _: {"detail": detail}),
        "changed",
    )


@recurring_app.command()
def pause(
    schedule_id: IdArg, store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT
) -> None:
    """Send no tick until resumed (stored ticks not being delivered are removed)."""
    _said(
        _store_change(
            store, endpoint, lambda s: s.pause_schedule(schedule_id), Action.SCHEDULE_PAUSE, schedule_id
        ),
        "paused",
    )


@recurring_app.command()
def resume(
    schedule_id: IdArg, store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT
) -> None:
    """Tick again from the next planned time (the ticks of the pause are not sent)."""
    _said(
        _store_change(
            store, endpoint, lambda s: s.resume_schedule(schedule_id), Action.SCHEDULE_RESUME, schedule_id
        ),
        "resumed",
    )


@recurring_app.command()
def trigger(
    schedule_id: IdArg, store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT
) -> None:
    """Send one tick now, beside the planned ones; prints its message id."""
    tick = _store_change(
        store,
        endpoint,
        lambda s: s.trigger_schedule(schedule_id),
        Action.SCHEDULE_TRIGGER,
        schedule_id,
        lambda t: {"ids": [t.message_id]},
    )
    print(tick.message_id)


@recurring_app.command()
def backfill(
    schedule_id: IdArg,
    start: Annotated[str, typer.Argument(help="From (ISO 8601 with offset).")],
    end: Annotated[str, typer.Argument(help="To (ISO 8601 with offset), now at the latest.")],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Send now the ticks planned between two past times (a tick still stored is not doubled)."""
    begin, finish = parse_time(start), parse_time(end)
    stored = _store_change(
        store,
        endpoint,
        lambda s: s.backfill_schedule(schedule_id, begin, finish),
        Action.SCHEDULE_BACKFILL,
        schedule_id,
        lambda n: {"detail": audit.backfill_detail(begin, finish, n)},
    )
    console.print(f"stored {stored:,} tick(s) of {schedule_id}, due now")


@recurring_app.command()
def remove(
    schedule_id: IdArg, store: StoreOpt = DEFAULT_STORE, endpoint: EndpointOpt = DEFAULT_ENDPOINT
) -> None:
    """Forget a schedule and its stored ticks (one being delivered right now still goes)."""
    removed = _store_change(
        store,
        endpoint,
        lambda s: s.remove_schedule(schedule_id),
        Action.SCHEDULE_REMOVE,
        schedule_id,
        lambda n: {"detail": f"{n} waiting ticks removed"},
    )
    console.print(f"removed {schedule_id} and {removed:,} stored tick(s)")
