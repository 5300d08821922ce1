"""`duetime limits set | list | remove` and `duetime destinations pause | resume | list`.

Flow control (:mod:`duetime.limits`): how fast and how many at once a destination is sent to,
and pausing one. Kept in the store, so every dispatcher of it obeys the same limit within
seconds of a change.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar, cast

import typer

from duetime.audit import Action
from duetime.cli.common import DEFAULT_STORE, EndpointOpt, StoreOpt, app, changing, who, with_capability
from duetime.cli.terminal import console, err, fail, table
from duetime.cli.terminal import show as show_table
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError
from duetime.interfaces import DelayedMessageStore, FlowControlStore, StoreCounts
from duetime.limits import Limit, Pause, Rate, check_destination, destination_states
from duetime.settings import DEFAULT_ENDPOINT

T = TypeVar("T")

limits_app = typer.Typer(
    help="How fast, and how many at once, a destination is sent to. Over a limit a message "
    "waits in the store for its turn: never dropped, never early, its due time unchanged. Kept "
    "in the store, so every dispatcher of it obeys the same limit.",
    no_args_is_help=True,
)
destinations_app = typer.Typer(
    help="The destinations messages are stored for: pause one (nothing is sent to it), resume "
    "it (its backlog goes at its limit), list them with their limits and pauses.",
    no_args_is_help=True,
)
app.add_typer(limits_app, name="limits")
app.add_typer(destinations_app, name="destinations")

DestinationArg = Annotated[
    str, typer.Argument(help="A destination's name (billing) or a pattern of them (partner-*).")
]


def _with_flow(store: str, endpoint: str, work: Callable[[FlowControlStore], Awaitable[T]]) -> T:
    return with_capability(store, endpoint, FlowControlStore, "flow-control limits", work)  # type: ignore[type-abstract]


async def paused_of(store: object) -> list[Pause]:
    """The store's pauses, for a listing that marks paused destinations; none where the store
    keeps none (a listing is not the place to fail for it)."""
    if not isinstance(store, FlowControlStore):
        return []
    try:
        return await store.paused()
    except ConfigurationError:
        return []


@limits_app.command("set")
def set_(
    destination: DestinationArg,
    rate: Annotated[
        str | None,
        typer.Option(
            help="At most this many: 50/s, 600/min, 2/h (shared by every dispatcher).", show_default=False
        ),
    ] = None,
    burst: Annotated[int, typer.Option(help="How many of the rate may go at once after a quiet spell.")] = 1,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="At most this many sent and not yet settled at once (for a webhook, requests in flight).",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="A header whose every value gets the limit of its own (customer-id): one "
            "customer's storm cannot hold back the others.",
            show_default=False,
        ),
    ] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Limit a destination (or each key of it), in place of any limit it had.

      duetime limits set partner-api --rate 50/s
      duetime limits set billing --concurrency 4
      duetime limits set reminders --rate 5/s --key customer-id

    A destination matched by several patterns takes the limit naming it exactly, else the
    longest pattern. Dispatchers apply a change within a few seconds.
    """
    limit = Limit(
        destination,
        Rate.parse(rate, burst) if rate is not None else None,
        concurrency,
        key,
        who(),
        SYSTEM.now(),
    )
    said = {"detail": limit.said()}
    _with_flow(
        store, endpoint, changing(lambda s: s.set_limit(limit), Action.LIMIT_SET, destination, lambda _: said)
    )
    console.print(f"limit for {destination!r}: {limit.said()}")


@limits_app.command("list")
def list_(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Every limit: its destination or pattern, rate, burst, concurrency, key, who set it."""
    limits = _with_flow(store, endpoint, lambda s: s.limits())
    if as_json:
        sys.stdout.writelines(json.dumps(_limit_row(x)) + "\n" for x in limits)
        return
    if not limits:
        err.print("no limits (duetime limits set DESTINATION --rate 50/s sets one)")
        return
    grid = table("destination", "rate", "burst", "concurrency", "key", "set by", "set at")
    for x in limits:
        grid.add_row(
            x.destination,
            x.rate.text() if x.rate else "-",
            str(x.rate.burst) if x.rate else "-",
            str(x.concurrency) if x.concurrency else "-",
            x.key or "-",
            x.set_by or "-",
            x.set_at.isoformat(timespec="seconds") if x.set_at else "-",
        )
    show_table(grid)


def _limit_row(x: Limit) -> dict[str, object]:
    return {
        "destination": x.destination,
        "rate": x.rate.text() if x.rate else None,
        "per_second": x.rate.per_second if x.rate else None,
        "burst": x.rate.burst if x.rate else None,
        "concurrency": x.concurrency,
        "key": x.key,
        "set_by": x.set_by,
        "set_at": x.set_at.isoformat() if x.set_at else None,
    }


@limits_app.command("remove")
def remove(
    destination: DestinationArg,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Remove a destination's limit: what waits for it goes at full speed (within seconds)."""
    check_destination(destination)
    if not _with_flow(
        store, endpoint, changing(lambda s: s.remove_limit(destination), Action.LIMIT_REMOVE, destination)
    ):
        raise fail(f"no limit for {destination!r} (see duetime limits list)")
    console.print(f"removed the limit for {destination!r}")


@destinations_app.command("pause")
def pause(
    destination: DestinationArg,
    reason: Annotated[str, typer.Option(help="Why, for whoever looks (an incident's number).")] = "",
    by: Annotated[
        str | None, typer.Option(help="Who paused it; by default the user at this host.", show_default=False)
    ] = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Send nothing to a destination (or a pattern of them) until it is resumed.

    Its messages stay stored and wait, due or not; every dispatcher stops within a few seconds.

      duetime destinations pause billing --reason "INC-42: receiver down"
    """
    paused = Pause(destination, by if by is not None else who(), SYSTEM.now(), reason)
    if not _with_flow(
        store,
        endpoint,
        changing(
            lambda s: s.pause_destination(paused), Action.PAUSE, destination, lambda _: {"detail": reason}
        ),
    ):
        raise fail(f"{destination!r} is paused already (see duetime destinations list)")
    console.print(
        f"paused {destination!r}: nothing is sent to it until duetime destinations resume {destination}"
    )


@destinations_app.command("resume")
def resume(
    destination: DestinationArg,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Resume a paused destination: what waited goes now, at its limit if it has one."""
    check_destination(destination)
    if not _with_flow(
        store, endpoint, changing(lambda s: s.resume_destination(destination), Action.RESUME, destination)
    ):
        raise fail(f"{destination!r} is not paused (see duetime destinations list)")
    console.print(f"resumed {destination!r}")


@destinations_app.command("list")
def destinations(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Every destination stored for, limited or paused: how many wait, its limit, who paused it.

    Shown for each: the messages stored for it, the limit it is sent at (a pattern's, if one
    matches), and who paused it, when and why."""

    async def read(s: FlowControlStore) -> tuple[list[Limit], list[Pause], StoreCounts]:
        counts = await cast(DelayedMessageStore, s).counts(SYSTEM.now())  # every store counts
        return await s.limits(), await s.paused(), counts

    limits, pauses, counts = _with_flow(store, endpoint, read)
    states = destination_states(counts.by_destination, limits, pauses)
    rows = [state.as_json() for state in states]
    if as_json:
        sys.stdout.writelines(json.dumps(r) + "\n" for r in rows)
        return
    if not rows:
        err.print("nothing stored, no limits, no pauses")
        return
    grid = table("destination", "stored", "limit", "paused", free=("paused",))
    for state in states:
        p = state.pause
        mark = (
            f"by {p.by} at {p.at.isoformat(timespec='seconds')}" + (f": {p.reason}" if p.reason else "")
            if p
            else "-"
        )
        grid.add_row(state.destination, f"{state.stored:,}", state.limit.said() if state.limit else "-", mark)
    show_table(grid)
    if counts.held:
        err.print(f"{counts.held:,} due messages wait for a limit's turn or a resume")
