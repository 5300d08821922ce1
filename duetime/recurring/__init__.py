"""Recurring schedules: a message delivered again and again, each tick a stored delayed message.

    from duetime.recurring import cron, every

    await client.add_recurring("invoices", "invoices.close", b"{}", when=cron("0 9 * * MON-FRI", zone="Europe/Paris"))
    await client.add_recurring("ping", "health", when=every("30s"))

When a schedule ticks (and what daylight saving does to it) is :mod:`duetime.recurring.rules`;
how each tick is stored once is :mod:`duetime.recurring.schedule`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from duetime.recurring.rules import CatchUp, Recurrence, Skipped, recurrence_of
from duetime.recurring.schedule import PLANNED_HEADER, SCHEDULE_HEADER, Schedule, changed

__all__ = [
    "PLANNED_HEADER",
    "SCHEDULE_HEADER",
    "Recurrence",
    "Schedule",
    "changed",
    "cron",
    "every",
]


def cron(
    expression: str,
    *,
    zone: str = "UTC",
    start: datetime | None = None,
    end: datetime | None = None,
    count: int | None = None,
    skipped: Skipped = "run",
    catch_up: CatchUp = "latest",
    catch_up_window: timedelta | str | None = None,
    jitter: timedelta | str | None = None,
) -> Recurrence:
    """Ticks at the times a cron expression gives (5 fields, or 6 with seconds first), read in
    ``zone`` (an IANA name). ``skipped="skip"``: a wall time a spring-forward skips does not fire
    (by default it fires once, at the jump). ``catch_up``: what a dispatcher that was away does
    with the ticks it missed (``none``, ``latest``, ``all``). ``jitter``: each tick may go up to
    that after its time, so that many schedules of one time do not fall due at once."""
    return recurrence_of(
        cron=expression,
        zone=zone,
        start=start,
        end=end,
        count=count,
        skipped=skipped,
        catch_up=catch_up,
        catch_up_window=catch_up_window,
        jitter=jitter,
    )


def every(
    interval: timedelta | str,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    count: int | None = None,
    catch_up: CatchUp = "latest",
    catch_up_window: timedelta | str | None = None,
    jitter: timedelta | str | None = None,
) -> Recurrence:
    """Ticks every ``interval`` (``30s``, ``1h``, a timedelta; whole seconds) of elapsed time,
    counted from ``start`` (default: 2000-01-01 UTC, so two schedules of one interval tick
    together)."""
    return recurrence_of(
        every=interval,
        start=start,
        end=end,
        count=count,
        catch_up=catch_up,
        catch_up_window=catch_up_window,
        jitter=jitter,
    )
