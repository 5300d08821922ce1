"""A recurring schedule, and the ticks it stores: each tick is a delayed message like any other.

A tick's id is made from the schedule's id and the tick's planned time, so a tick stored twice is
the same message: the store refuses the second. A schedule's row says how far its ticks are
planned (``planned_until``); a planner stores the ticks up to a little ahead of now and moves
``planned_until`` in the same transaction, and only if the row is still the version it read (see
:mod:`duetime.recurring.planner`). That is what makes every tick go out once, whatever number of
dispatchers plan at the same moment, crash half-way, or come back after a long time away.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from duetime import nservicebus_wire as nservicebus
from duetime.errors import InvalidMessage, InvalidSchedule
from duetime.inputs.durations import parse_time
from duetime.message import DelayedMessage, body_fields, check_encodable, check_storable
from duetime.recurring.rules import Recurrence

#: Headers every tick carries: which schedule, and the time it was planned for.
SCHEDULE_HEADER = "duetime-schedule"
PLANNED_HEADER = "duetime-planned-at"
#: A tick sent by ``trigger`` or ``backfill``, not by the schedule's own clock.
EXTRA_HEADER = "duetime-tick"
#: A tick's id is the schedule's id, this, and the planned time (``nightly@2030-01-01T09:00:00Z``).
TICK_SEPARATOR = "@"
#: The group of every tick of a schedule (``cancel --group`` reaches them; removing a schedule
#: removes its pending ticks this way).
GROUP_PREFIX = "duetime-schedule:"
#: The group of the ticks ``trigger`` and ``backfill`` store: a pause or a change leaves them be
#: (they were asked for), removing the schedule removes them too. It holds the tick separator,
#: which no schedule id may hold, so it is never another schedule's group.
EXTRA_GROUP_SUFFIX = "@extra"
#: What the suffix was before: ``report+extra`` was also the group of a schedule named so.
OLD_EXTRA_GROUP_SUFFIX = "+extra"
#: A schedule id leaves room for the tick's time in a message id (250 characters) and for the
#: prefix and suffix of its groups (200).
MAX_SCHEDULE_ID_LENGTH = 170


def tick_id(schedule_id: str, planned: datetime) -> str:
    return f"{schedule_id}{TICK_SEPARATOR}{_stamp(planned)}"


def _stamp(planned: datetime) -> str:
    at = planned.astimezone(UTC)
    text = at.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{at.microsecond:06d}Z" if at.microsecond else "Z")


def group_of(schedule_id: str) -> str:
    return GROUP_PREFIX + schedule_id


def extra_group_of(schedule_id: str) -> str:
    return GROUP_PREFIX + schedule_id + EXTRA_GROUP_SUFFIX


def check_schedule_id(schedule_id: object) -> str:
    if not isinstance(schedule_id, str) or not schedule_id.strip():
        raise InvalidSchedule("A schedule needs an id: a short name such as nightly-invoices.")
    if len(schedule_id) > MAX_SCHEDULE_ID_LENGTH:
        raise InvalidSchedule(
            f"A schedule id is at most {MAX_SCHEDULE_ID_LENGTH} characters; {len(schedule_id)} given."
        )
    try:  # (bytes that are not UTF-8, as a shell passes them, are not "control characters")
        check_encodable("The schedule id", schedule_id)
    except InvalidMessage as error:
        raise InvalidSchedule(str(error)) from None
    if any(c in schedule_id for c in (TICK_SEPARATOR, "\x00")) or not schedule_id.isprintable():
        raise InvalidSchedule(
            f"A schedule id may not hold {TICK_SEPARATOR!r} or control characters (it is part of each tick's id)."
        )
    return schedule_id


_CHECKED_AT = datetime(2000, 1, 1, tzinfo=UTC)


class ScheduleRow(NamedTuple):
    """A schedule as a store keeps it: its id, its JSON text, how far its ticks are stored
    (None: nothing more to plan, paused or ended), and its version (moved on by every change)."""

    schedule_id: str
    text: str
    planned_until: datetime | None
    version: int


def set_aside_row(row: ScheduleRow, why: str) -> ScheduleRow:
    """``row`` set aside (nothing more planned, ``why`` kept), written as JSON even where the
    schedule itself cannot be read back."""
    try:
        data = json.loads(row.text)
    except ValueError:
        data = None
    text = row.text
    if isinstance(data, dict):
        data["set_aside"] = why
        text = json.dumps(data, separators=(",", ":"))
    return row._replace(text=text, planned_until=None)


@dataclass(frozen=True)
class Schedule:
    """A message to deliver again and again: to ``destination``, with ``body`` and ``headers``,
    at the times ``recurrence`` gives."""

    schedule_id: str
    destination: str
    recurrence: Recurrence
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    paused: bool = False
    #: Kept by the store: ticks stored so far, ticks a catch-up policy left out, the planned time
    #: of the last tick stored, when it was made and last changed.
    ticks_planned: int = 0
    ticks_missed: int = 0
    last_planned: datetime | None = None
    created_at: datetime | None = None
    changed_at: datetime | None = None
    #: How far ticks are stored (None: nothing more to plan); the row's version.
    planned_until: datetime | None = None
    version: int = 0
    #: Why no tick of it could be planned (a planner set it aside, so the others go on): a
    #: ``change`` or ``resume`` tries again.
    set_aside: str | None = None
    #: The planned time of the latest tick that was being delivered when a pause or a change
    #: removed the others: planning starts after it on resuming, so it does not go out twice.
    in_flight_until: datetime | None = None

    def __post_init__(self) -> None:
        check_schedule_id(self.schedule_id)
        # a tick is checked as every message is (destination, body, headers): make one now, so a
        # schedule whose ticks could not be stored is refused when it is given
        check_storable(self.tick(_CHECKED_AT, _CHECKED_AT))

    def state(self) -> str:
        if self.set_aside is not None:
            return "set aside"
        return "paused" if self.paused else "ended" if self.planned_until is None else "active"

    def next_planned(self, now: datetime) -> datetime | None:
        """The first planned time at or after ``now`` (None: paused or ended)."""
        if self.paused or self.planned_until is None or self.set_aside is not None:
            return None
        return self.recurrence.after(now - timedelta(microseconds=1))

    def tick(
        self, planned: datetime, due: datetime, *, kind: str | None = None, own_id: bool = False
    ) -> DelayedMessage:
        """The message for the tick planned at ``planned``, due at ``due``. ``kind`` marks a tick
        the schedule's clock did not make (``trigger``, ``backfill``); ``own_id`` gives it an id
        of its own rather than the planned time's."""
        headers = {
            **self.headers,
            SCHEDULE_HEADER: self.schedule_id,
            PLANNED_HEADER: planned.astimezone(UTC).isoformat(),
        }
        message_id, group = tick_id(self.schedule_id, planned), group_of(self.schedule_id)
        if kind is not None:
            headers[EXTRA_HEADER] = kind
            group = extra_group_of(self.schedule_id)
            if own_id:
                message_id += f"+{kind}"
        if nservicebus.ENCLOSED_TYPES in headers:
            # for an NServiceBus endpoint: each tick its own message id (its outbox would take a
            # schedule's one id, copied onto every tick, for a duplicate and drop all but the
            # first), and sent at its planned time (its critical time counts from there)
            headers[nservicebus.MESSAGE_ID] = message_id
            headers[nservicebus.TIME_SENT] = nservicebus.to_wire(planned)
        return DelayedMessage(message_id, self.destination, due, self.body, headers, group=group)

    # --- as a store keeps it --------------------------------------------------------------------
    def to_text(self) -> str:
        return json.dumps(
            {
                "destination": self.destination,
                "body": self.body.decode("latin-1"),
                "headers": dict(self.headers),
                "recurrence": self.recurrence.to_json(),
                "paused": self.paused,
                "ticks_planned": self.ticks_planned,
                "ticks_missed": self.ticks_missed,
                "last_planned": _iso(self.last_planned),
                "created_at": _iso(self.created_at),
                "changed_at": _iso(self.changed_at),
                "set_aside": self.set_aside,
                "in_flight_until": _iso(self.in_flight_until),
            },
            separators=(",", ":"),
        )

    def row(self) -> ScheduleRow:
        return ScheduleRow(self.schedule_id, self.to_text(), self.planned_until, self.version)

    @classmethod
    def from_row(cls, row: ScheduleRow) -> Schedule:
        data: dict[str, Any] = json.loads(row.text)
        return cls(
            schedule_id=row.schedule_id,
            destination=data["destination"],
            recurrence=_recurrence(json.dumps(data["recurrence"], sort_keys=True)),
            body=str(data.get("body", "")).encode("latin-1"),
            headers=dict(data.get("headers") or {}),
            paused=bool(data.get("paused")),
            ticks_planned=int(data.get("ticks_planned") or 0),
            ticks_missed=int(data.get("ticks_missed") or 0),
            last_planned=_time(data.get("last_planned")),
            created_at=_time(data.get("created_at")),
            changed_at=_time(data.get("changed_at")),
            planned_until=None if row.planned_until is None else row.planned_until.astimezone(UTC),
            version=row.version,
            set_aside=None if data.get("set_aside") is None else str(data["set_aside"]),
            in_flight_until=_time(data.get("in_flight_until")),
        )

    def with_changes(self, **changes: Any) -> Schedule:
        return replace(self, **changes)


def schedule_json(s: Schedule, now: datetime) -> dict[str, Any]:
    """A schedule as ``duetime recurring show`` prints it and the HTTP API answers it: its
    state, the next tick after ``now`` (the store's time), what it sent and missed."""
    following = s.next_planned(now)
    return {
        "id": s.schedule_id,
        "destination": s.destination,
        "when": s.recurrence.describe(),
        "state": s.state(),
        "set_aside": s.set_aside,
        "next": None if following is None else following.isoformat(),
        "last_planned": None if s.last_planned is None else s.last_planned.isoformat(),
        "ticks_planned": s.ticks_planned,
        "ticks_missed": s.ticks_missed,
        "recurrence": s.recurrence.to_json(),
        "headers": dict(s.headers),
        **body_fields(s.body),
    }


@functools.lru_cache(maxsize=4096)
def _recurrence(text: str) -> Recurrence:
    """A stored recurrence, read (and checked) once per distinct one: many schedules share one.
    A zone this host cannot read is said when its ticks are asked for, not here."""
    return Recurrence.from_json(json.loads(text), zone_checked=False)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _time(value: object) -> datetime | None:
    return None if value is None else parse_time(str(value))


@dataclass(frozen=True)
class Plan:
    """What one planning step of a schedule stores: its ticks, the schedule as it is after, how
    many ticks a catch-up policy left out, and whether more is left to walk (a next step goes on)."""

    ticks: list[DelayedMessage]
    after: Schedule
    missed: int
    more: bool = False


#: A tick planned this long before now is late, not missed: planning runs every second or so.
LATE_NOT_MISSED = timedelta(seconds=2)
#: Planned times one step walks at most (a cron schedule away for long: the next steps go on).
MOST_WALKED = 10_000


def plan(
    schedule: Schedule,
    now: datetime,
    ahead: timedelta,
    *,
    most: int = 1000,
    steady_since: datetime | None = None,
) -> Plan:
    """The ticks of ``schedule`` to store now: every planned time after ``planned_until`` up to
    the first one past ``now + ahead`` (so the next tick is always stored, however far off).
    Ticks planned before ``now`` were missed by a dispatcher that was away: its catch-up policy
    says which of them still go (due now), and the rest are counted. The policy holds for the
    whole absence, however many steps it takes (``latest`` sends one tick, not one a step).
    ``most`` bounds the ticks one step stores. ``steady_since``: since when the planner has
    planned every step; a tick planned after that was not missed (no dispatcher was away), only
    late, because planning fell behind, and goes whatever the policy."""
    horizon = now + ahead
    if schedule.paused or schedule.planned_until is None or schedule.planned_until > horizon:
        return Plan([], schedule, 0)  # nothing to plan, or planned far enough already
    r = schedule.recurrence
    count_left = None if r.count is None else r.count - schedule.ticks_planned
    late_before = now - LATE_NOT_MISSED
    if steady_since is not None:
        late_before = min(late_before, steady_since)
    window_from = None if r.catch_up_window is None else now - r.catch_up_window
    until: datetime = schedule.planned_until
    going: list[datetime] = []
    walked = missed = 0
    # an interval's missed ticks are counted, not walked: all but the one the policy keeps
    counted_before = window_from if r.catch_up == "all" else late_before
    if counted_before is not None:
        n, last = r.passed(until, min(counted_before, late_before), count_left)
        if last is not None:
            walked, until = n, last
            if r.catch_up == "latest" and (window_from is None or last >= window_from):
                going.append(last)
                missed = n - 1
            else:
                missed = n
    latest: datetime | None = None  # the latest missed tick so far, which ``latest`` still sends
    ended = more = False
    upcoming = r.ticks(until)
    for stepped in range(MOST_WALKED + 1):
        if count_left is not None and walked >= count_left:
            ended = True
            break
        if len(going) >= most or stepped == MOST_WALKED:
            more = True
            break
        at = next(upcoming, None)
        if at is None:  # past the recurrence's end
            ended = True
            break
        walked += 1
        if at < late_before:  # missed while no dispatcher ran
            until = at
            in_window = window_from is None or at >= window_from
            if r.catch_up == "all" and in_window:
                going.append(at)
            elif r.catch_up == "latest" and in_window:
                missed += latest is not None
                latest = at
            else:
                missed += 1
            continue
        if latest is not None:
            going.append(latest)
            latest = None
        going.append(at)
        until = at
        if at > horizon:
            break
    if latest is not None and more:  # stopped among missed ticks: the next step starts at this one
        until, walked = latest - timedelta(microseconds=1), walked - 1
    elif latest is not None:  # the schedule ended among missed ticks: its last one goes
        going.append(latest)
    after = schedule.with_changes(
        ticks_planned=schedule.ticks_planned + walked,
        ticks_missed=schedule.ticks_missed + missed,
        last_planned=going[-1] if going else schedule.last_planned,
        planned_until=None if ended else until,
    )
    return Plan([schedule.tick(at, r.due_of(schedule.schedule_id, at)) for at in going], after, missed, more)


def changed(
    schedule: Schedule,
    *,
    when: Recurrence | None = None,
    destination: str | None = None,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Schedule:
    """``schedule`` with what is given changed (the rest as it was)."""
    given = {"recurrence": when, "destination": destination, "body": body, "headers": headers}
    return schedule.with_changes(**{k: v for k, v in given.items() if v is not None})


def new_schedule(
    schedule_id: str,
    destination: str,
    recurrence: Recurrence,
    now: datetime,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    paused: bool = False,
) -> Schedule:
    """A schedule as it is made: its ticks planned from ``now`` on (none before)."""
    return Schedule(
        schedule_id,
        destination,
        recurrence,
        body,
        dict(headers or {}),
        paused=paused,
        created_at=now,
        changed_at=now,
        planned_until=None if paused else now,
    )


@dataclass(frozen=True)
class PlanReport:
    """What one planning step did: schedules planned, ticks stored, ticks a catch-up policy left
    out (each logged), and the earliest new tick's due time."""

    schedules: int = 0
    ticks: int = 0
    missed: int = 0
    earliest: datetime | None = None
    #: (schedule id, how many it missed), for the log.
    missed_by: tuple[tuple[str, int], ...] = ()
    #: Whether more is waiting to be planned (the batch was full, or a schedule's walk stopped).
    more: bool = False
    #: (schedule id, why), for each schedule this step set aside because it cannot be planned.
    set_aside: tuple[tuple[str, str], ...] = ()
    #: Seconds the longest-waiting schedule of this step waited to be planned, from when its
    #: next ticks came within reach (about a second when planning keeps up).
    waited: float = 0.0
