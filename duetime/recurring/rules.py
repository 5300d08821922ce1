"""When a recurring schedule ticks: a cron expression or an interval, in an IANA time zone.

The cron expression itself is read by cronsim (5 fields, or 6 with seconds first; Debian cron's
syntax: ranges, lists, steps, month and day names, ``L``, ``#``), a small, typed, well-kept
library written to match Debian's cron. duetime walks the expression in *wall-clock* time and
turns each wall time into an instant itself, so the daylight-saving rules are duetime's and are
spelled out once, here:

- a wall time that a spring-forward skips (02:30 on the night clocks go from 02:00 to 03:00)
  fires once, at the instant of the jump (``skipped="run"``, as cron does), or not at all
  (``skipped="skip"``); several skipped times collapse into that one tick;
- a wall time that autumn repeats (02:30 twice) fires once, at its first occurrence;
- an interval (``every 30s``) is elapsed time from its anchor, whatever the wall clock does.

Every instant is UTC; the host's clock and time zone play no part.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from duetime.errors import InvalidSchedule
from duetime.inputs.durations import parse_duration, parse_time
from duetime.limits import spread_offset
from duetime.message import LATEST_DUE

Skipped = Literal["run", "skip"]
CatchUp = Literal["none", "latest", "all"]

#: The shortest interval a schedule may have: a tick is a stored message, not a busy loop.
SHORTEST_INTERVAL = timedelta(seconds=1)
#: The most a tick may go after its time on purpose (``jitter``).
LONGEST_JITTER = timedelta(days=1)
#: A cron expression that fires less often than this never fires (``0 0 30 2 *``): cronsim
#: walks day by day, so an expression is looked at this far ahead when it is given.
NEVER_AFTER = timedelta(days=366 * 28)  # every weekday-and-date combination repeats within 28 years
#: How far back a walk starts after a clock change (longer than any change's gap).
REWIND = timedelta(hours=3)
#: In the IANA database but no place's time: its offset is 0 and its abbreviation "-00".
NOT_A_PLACE = frozenset({"Factory"})


@functools.cache
def known_zones() -> frozenset[str]:
    """The zone names of the ``tzdata`` package (a dependency): the same on every host. A host's
    own zone files hold more (``localtime``, ``right/*`` counting leap seconds, ``posix/*``),
    which differ from host to host, so a schedule made on one would be read differently, or not
    at all, by a dispatcher on another."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(name.strip() for name in text.splitlines() if name.strip()) - NOT_A_PLACE


def zone_problem(zone: str) -> str | None:
    """Why ``zone`` cannot be a schedule's zone (None: it can)."""
    if zone in known_zones():
        return None
    return f"Unknown time zone {zone!r}; give an IANA name such as Europe/Paris or UTC."


def _zone(name: str) -> ZoneInfo | None:
    if zone_problem(name) is not None:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


@dataclass(frozen=True)
class Recurrence:
    """When a schedule ticks. Exactly one of ``cron`` and ``every``."""

    cron: str | None = None
    every: timedelta | None = None
    zone: str = "UTC"
    #: No tick before ``start`` (an interval counts from it: its anchor); none after ``end``;
    #: at most ``count`` ticks in all.
    start: datetime | None = None
    end: datetime | None = None
    count: int | None = None
    skipped: Skipped = "run"
    #: What a dispatcher that was away does with the ticks it missed: none, the latest, or all
    #: of them (only those within ``catch_up_window`` of now, when it is set).
    catch_up: CatchUp = "latest"
    catch_up_window: timedelta | None = None
    #: Each tick may go up to this after its time, on purpose (a flexible window, as Temporal's
    #: and EventBridge Scheduler's): a tick's own offset, the same on every planning, so that a
    #: thousand schedules for midnight do not all fall due in one millisecond.
    jitter: timedelta | None = None
    #: False for a recurrence read back from a store: a zone this host cannot read is then said
    #: when its ticks are asked for (a planner sets the schedule aside), not when it is read, so
    #: the schedule can still be listed, shown, changed and removed.
    zone_checked: bool = field(default=True, repr=False, compare=False)
    _tz: ZoneInfo | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise InvalidSchedule(
                "Give a schedule either a cron expression or an interval (every 30s), not both."
            )
        object.__setattr__(self, "_tz", _zone(self.zone))
        if self._tz is None and self.zone_checked:
            raise InvalidSchedule(zone_problem(self.zone) or f"Cannot read the time zone {self.zone!r}.")
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise InvalidSchedule(f"The schedule's {name} needs an offset (2030-01-01T09:00:00+01:00).")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise InvalidSchedule("The schedule ends before it starts; give an end after the start.")
        if self.count is not None and self.count < 1:
            raise InvalidSchedule(f"A schedule's count must be at least 1, got {self.count}.")
        if self.skipped not in ("run", "skip"):
            raise InvalidSchedule(f"skipped must be 'run' or 'skip', got {self.skipped!r}.")
        if self.jitter is not None and not timedelta(0) <= self.jitter <= LONGEST_JITTER:
            raise InvalidSchedule(
                f"A jitter is at most a day (and not negative), got {self.jitter.total_seconds():g} s."
            )
        if self.catch_up not in ("none", "latest", "all"):
            raise InvalidSchedule(f"catch_up must be 'none', 'latest' or 'all', got {self.catch_up!r}.")
        if self.every is not None:
            if self.every < SHORTEST_INTERVAL:
                raise InvalidSchedule(
                    f"An interval must be at least {SHORTEST_INTERVAL.total_seconds():g} s, got "
                    f"{self.every.total_seconds():g} s."
                )
            if self.every.microseconds:
                raise InvalidSchedule("An interval is whole seconds (every 1.5s cannot be kept).")
        else:
            self._check_cron()

    @classmethod
    def parse(cls, when: str, **options: Any) -> Recurrence:
        """``when`` as a user writes it: a cron expression (``0 9 * * MON-FRI``, 6 fields with
        seconds first) or an interval (``every 30s``, ``every 1h``)."""
        text = when.strip()
        if text.lower().startswith("every"):
            return cls(every=_duration("interval", text), **options)
        return cls(cron=" ".join(text.split()), **options)

    def _check_cron(self) -> None:
        assert self.cron is not None
        fields = self.cron.split()
        if len(fields) not in (5, 6):
            raise InvalidSchedule(
                f"A cron expression has 5 fields (minute hour day month weekday), or 6 with seconds "
                f"first; {self.cron!r} has {len(fields)}."
            )
        start = datetime(2000, 1, 1)
        try:
            first = next(CronSim(self.cron, start))
        except CronSimError as error:
            if _days_never_in_months(fields):
                day, month = fields[-3], fields[-2]
                raise InvalidSchedule(
                    f"The cron expression {self.cron!r} never fires: no month it names ({month}) has "
                    f"the days it names ({day}); February has 29 days at most, April, June, "
                    "September and November 30."
                ) from None
            raise InvalidSchedule(f"Cannot read the cron expression {self.cron!r}: {error}.") from None
        except StopIteration:
            first = None
        if first is None or first - start > NEVER_AFTER:
            raise InvalidSchedule(f"The cron expression {self.cron!r} never fires.")

    @property
    def tz(self) -> ZoneInfo:
        """The zone's rules; InvalidSchedule when this host cannot read them."""
        if self._tz is None:
            raise InvalidSchedule(
                f"This host cannot read the time zone {self.zone!r}; change the schedule's zone to an "
                "IANA name such as Europe/Paris or UTC."
            )
        return self._tz

    # --- the planned times ------------------------------------------------------------------
    def after(self, instant: datetime) -> datetime | None:
        """The first planned tick strictly after ``instant`` (UTC), or None when there is none
        (past ``end``). ``count`` is the caller's to keep: it knows how many have ticked."""
        return next(self.ticks(instant), None)

    def ticks(self, after: datetime) -> Iterator[datetime]:
        """The planned ticks strictly after ``after``, in order, as UTC instants; none from
        :data:`~duetime.message.LATEST_DUE` on (no message can be due then)."""
        after = after.astimezone(UTC)
        if self.start is not None and after < self.start:
            after = self.start.astimezone(UTC) - timedelta(microseconds=1)
        walk = self._intervals(after) if self.every is not None else self._cron(after)
        last = LATEST_DUE - timedelta(microseconds=1)
        end = last if self.end is None else min(self.end, last)
        while True:
            try:
                tick = next(walk)
            except (StopIteration, OverflowError):  # the calendar ends at year 9999
                return
            if tick > end:
                return
            yield tick

    def passed(
        self, after: datetime, before: datetime, most: int | None = None
    ) -> tuple[int, datetime | None]:
        """How many ticks lie strictly after ``after`` and before ``before`` (at most ``most``),
        and the last of them: counted, not walked, so a dispatcher away for a year on a
        one-second interval settles its missed ticks at once. Only an interval can be counted
        so: (0, None) for a cron expression, whose ticks are walked."""
        if self.every is None:
            return 0, None
        anchor, step = self._anchor(), self.every
        after = max(after.astimezone(UTC), anchor - timedelta(microseconds=1))
        first = (after - anchor) // step + 1
        last = -((anchor - before) // step) - 1  # the last index before ``before``
        if self.end is not None:
            last = min(last, (self.end - anchor) // step)
        if most is not None:
            last = min(last, first + most - 1)
        if last < first:
            return 0, None
        try:
            return last - first + 1, anchor + last * step
        except OverflowError:
            return 0, None

    def _anchor(self) -> datetime:
        return (self.start or datetime(2000, 1, 1, tzinfo=UTC)).astimezone(UTC)

    def _intervals(self, after: datetime) -> Iterator[datetime]:
        assert self.every is not None
        anchor = self._anchor()
        step = self.every
        n = max(0, (after - anchor) // step + 1) if after >= anchor else 0
        while True:
            yield anchor + n * step
            n += 1

    def _cron(self, after: datetime) -> Iterator[datetime]:
        """Wall times from the expression, each made an instant by the rules above."""
        assert self.cron is not None
        tz, previous = self.tz, after
        here = after.astimezone(tz)
        start = here.replace(tzinfo=None)
        rewound = (after - REWIND).astimezone(tz)
        if rewound.utcoffset() != here.utcoffset():
            # the clocks changed a little before: a wall time skipped then maps onto the change,
            # which may come after ``after``; walk from before it
            start = rewound.replace(tzinfo=None)
        for local in CronSim(self.cron, start):
            instant = self._instant(local)
            if instant is None or instant <= previous:
                continue
            yield instant
            previous = instant

    def _instant(self, local: datetime) -> datetime | None:
        """The instant a wall time names: its first occurrence when autumn repeats it; when a
        spring-forward skips it, the jump's instant (``skipped="run"``) or None."""
        tz = self._tz
        assert tz is not None
        first = local.replace(tzinfo=tz, fold=0)
        back = first.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
        if back == local:
            return first.astimezone(UTC)
        if self.skipped == "skip":
            return None
        # skipped: the jump lies between the two readings of the wall time; find its instant
        low = local.replace(tzinfo=tz, fold=1).astimezone(UTC)  # the later offset: before the gap
        high = first.astimezone(UTC)  # the earlier offset: after the gap
        low, high = min(low, high), max(low, high)
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) / 2
            if middle.astimezone(tz).replace(tzinfo=None) >= local:
                high = middle
            else:
                low = middle
        return high.replace(microsecond=0)

    # --- a schedule's text form ---------------------------------------------------------------
    def describe(self) -> str:
        """One line a user reads: ``0 9 * * MON-FRI in Europe/Paris`` or ``every 30 s``."""
        what = f"every {_span(self.every)}" if self.every is not None else f"{self.cron} in {self.zone}"
        if self.count is not None:
            what += f", {self.count} ticks"
        if self.jitter:
            what += f", each up to {_span(self.jitter)} later"
        return what

    def due_of(self, schedule_id: str, planned: datetime) -> datetime:
        """When the tick planned at ``planned`` is due: then, or a moment up to the jitter after
        (its offset a digest of the schedule and the planned time, so every planning of it
        agrees and the tick's id, which is its planned time's, never changes)."""
        if not self.jitter:
            return planned
        return planned + spread_offset(f"{schedule_id}\x00{planned.isoformat()}", self.jitter)

    def to_json(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "every": None if self.every is None else self.every.total_seconds(),
            "zone": self.zone,
            "start": None if self.start is None else self.start.isoformat(),
            "end": None if self.end is None else self.end.isoformat(),
            "count": self.count,
            "skipped": self.skipped,
            "catch_up": self.catch_up,
            "catch_up_window": None if self.catch_up_window is None else self.catch_up_window.total_seconds(),
            "jitter": None if self.jitter is None else self.jitter.total_seconds(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, zone_checked: bool = True) -> Recurrence:
        def when(key: str) -> datetime | None:
            return None if data.get(key) is None else parse_time(str(data[key]))

        def span(key: str) -> timedelta | None:
            return None if data.get(key) is None else timedelta(seconds=float(data[key]))

        return cls(
            cron=data.get("cron"),
            every=span("every"),
            zone=str(data.get("zone") or "UTC"),
            start=when("start"),
            end=when("end"),
            count=data.get("count"),
            skipped=data.get("skipped") or "run",
            catch_up=data.get("catch_up") or "latest",
            catch_up_window=span("catch_up_window"),
            jitter=span("jitter"),
            zone_checked=zone_checked,
        )


def recurrence_of(
    cron: str | None = None,
    every: timedelta | str | None = None,
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
    """A recurrence from what the API and the command line take: ``every`` and the window may
    be written as durations (``30s``, ``1h``)."""
    return Recurrence(
        cron=None if cron is None else " ".join(cron.split()),
        every=_duration("interval", every),
        zone=zone,
        start=start,
        end=end,
        count=count,
        skipped=skipped,
        catch_up=catch_up,
        catch_up_window=_duration("catch-up window", catch_up_window),
        jitter=_duration("jitter", jitter),
    )


def recurrence_changed(
    base: Recurrence | None,
    *,
    cron: str | None = None,
    every: timedelta | str | None = None,
    zone: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    count: int | None = None,
    skipped: str | None = None,
    catch_up: str | None = None,
    catch_up_window: timedelta | str | None = None,
    jitter: timedelta | str | None = None,
    flag: str = "--",
) -> Recurrence:
    """The recurrence given, over ``base`` (a change keeps what is not given; None: a new one,
    which must say when). ``flag`` is how the front end writes a field's name in its messages:
    ``--`` for the command line's ``--cron``, empty for the HTTP API's ``cron``."""
    if cron is not None and every is not None:
        raise InvalidSchedule(f"Give {flag}cron or {flag}every, not both.")
    if base is None and cron is None and every is None:
        raise InvalidSchedule(f"Say when: {flag}cron '0 9 * * MON-FRI' or {flag}every 30s.")
    if cron is None and every is None and base is not None:
        cron, every = base.cron, base.every
    return recurrence_of(
        cron=cron,
        every=every,
        zone=zone or (base.zone if base else "UTC"),
        start=start or (base.start if base else None),
        end=end or (base.end if base else None),
        count=count if count is not None else (base.count if base else None),
        skipped=_choice(f"{flag}skipped", skipped, ("run", "skip"), base.skipped if base else "run"),  # type: ignore[arg-type]
        catch_up=_choice(  # type: ignore[arg-type]
            f"{flag}catch-up" if flag else "catch_up",
            catch_up,
            ("none", "latest", "all"),
            base.catch_up if base else "latest",
        ),
        catch_up_window=catch_up_window
        if catch_up_window is not None
        else (base.catch_up_window if base else None),
        jitter=jitter if jitter is not None else (base.jitter if base else None),
    )


def _choice(name: str, value: str | None, allowed: tuple[str, ...], default: str) -> str:
    if value is None:
        return default
    if value not in allowed:
        raise InvalidSchedule(f"{name} is one of {', '.join(allowed)}; got {value!r}.")
    return value


def _duration(name: str, value: timedelta | str | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    text = value.strip()
    if text.lower().startswith("every"):
        text = text[5:]
    try:
        return parse_duration(text)
    except ValueError as error:
        raise InvalidSchedule(f"Cannot read the {name} {value!r}: {error}") from None


def _span(every: timedelta) -> str:
    seconds = int(every.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _days_never_in_months(fields: list[str]) -> bool:
    """Whether a cron expression cronsim refused is well written but names only days its months
    lack (``0 0 30 2 *``): cronsim calls that a bad day-of-month, which reads like a typo."""
    every_month = [*fields[:-2], "*", fields[-1]]
    try:
        next(CronSim(" ".join(every_month), datetime(2000, 1, 1)))
    except (CronSimError, StopIteration):
        return False
    return True
