"""Recurring schedules in a store, written once: a backend keeps rows, these rules keep the promise.

A schedule's row is a JSON text, how far its ticks are stored (``planned_until``) and a version.
Every change is a compare-and-set on the version: a writer that read an older row writes nothing
and reads again. Planning (:meth:`ScheduleRules.plan_schedules`) writes the row and stores the new
ticks in one transaction of the backend's, so ticks are stored exactly once, however many
dispatchers plan at the same moment and wherever one is killed. The ticks are then delivered as
every stored message is (exactly-once where the store and the destination share a transaction).
"""

from __future__ import annotations

import builtins
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from itertools import islice

from duetime.encryption import KEY_HEADER, PROBLEM_HEADER, Sealer, Unreadable, sealed_with
from duetime.errors import (
    ConfigurationError,
    InvalidSchedule,
    MessageInFlight,
    ScheduleExists,
    ScheduleNotFound,
    StoreNotReady,
    one_line,
)
from duetime.inputs.durations import parse_time
from duetime.interfaces import Clock, ListQuery, Page
from duetime.message import DelayedMessage
from duetime.recurring.schedule import (
    GROUP_PREFIX,
    OLD_EXTRA_GROUP_SUFFIX,
    PLANNED_HEADER,
    Plan,
    PlanReport,
    Schedule,
    ScheduleRow,
    check_schedule_id,
    extra_group_of,
    group_of,
    plan,
    set_aside_row,
)

#: A schedule's row as planned, and the ticks to store with it.
Planned = tuple[ScheduleRow, Sequence[DelayedMessage]]
#: Ticks planned this far ahead of now (and always the next one, however far off it is): a
#: dispatcher away for less than this misses nothing, and a pause or a change removes few.
PLAN_AHEAD = timedelta(seconds=30)
#: Schedules planned in one step; the rest in the next.
PLAN_BATCH = 500
#: Tries of a change that keeps finding the row changed under it (a planner at work).
CHANGE_TRIES = 20
#: Ticks a pause or a change looks through for the last one that went out (ticks are stored
#: at most PLAN_AHEAD ahead, one a second at the most).
MOST_GONE = 1000


def schedules_need_setup() -> StoreNotReady:
    return StoreNotReady(
        "This store was set up before recurring schedules existed; run `duetime setup` once to add "
        "their table (every stored message stays)."
    )


class ScheduleRules(ABC):
    """The schedule side of :class:`duetime.backends.StoreRules`."""

    clock: Clock

    # --- what a backend supplies -----------------------------------------------------------
    @abstractmethod
    def _schedule_insert(self, row: ScheduleRow) -> bool:
        """Insert ``row`` for the bound endpoint unless its id is there (False then)."""

    @abstractmethod
    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        """In one transaction, for each (row, ticks): if the stored row's version is
        ``row.version``, write ``row``'s text and ``planned_until`` with the version one more, and
        store each of ``ticks`` whose id is not stored yet; otherwise write nothing for it. Says,
        in order, which were written."""

    @abstractmethod
    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None: ...

    @abstractmethod
    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        """Up to ``limit`` rows with ids after ``after``, by id."""

    @abstractmethod
    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        """Up to ``limit`` rows whose ``planned_until`` is at or before ``until``, earliest first."""

    @abstractmethod
    def _schedule_delete(self, schedule_id: str) -> bool: ...

    # --- from the store (StoreRules) ------------------------------------------------------------
    @abstractmethod
    def _ready(self) -> str: ...

    @abstractmethod
    def _announce(self, due_at: datetime) -> None: ...

    @property
    @abstractmethod
    def sealer(self) -> Sealer | None:
        """What seals and opens schedules (see StoreRules.sealer)."""

    @abstractmethod
    def cancel_group(self, group: str) -> int: ...

    @abstractmethod
    def store_new(self, messages: Sequence[DelayedMessage]) -> int: ...

    @abstractmethod
    def cancel(self, message_id: str) -> bool: ...

    @abstractmethod
    def list(self, query: ListQuery) -> Page: ...

    @abstractmethod
    def server_time(self) -> datetime | None: ...

    def _now(self, now: datetime | None) -> datetime:
        """``now`` if given, else the store's time: every schedule command follows the store's
        clock, as dispatchers do, so a host whose clock is wrong skips or doubles no tick."""
        if now is not None:
            return now
        return self.server_time() or self.clock.now()

    # --- sealing (duetime.encryption): a schedule's body and headers are kept sealed, and its
    # ticks copy them as they are, so planning never needs the keys --------------------------------
    def _row_of(self, schedule: Schedule) -> ScheduleRow:
        return (schedule if self.sealer is None else self.sealer.seal_schedule(schedule)).row()

    def _schedule_of(self, row: ScheduleRow) -> Schedule:
        """The stored schedule in plaintext, or still sealed with the reason it did not open."""
        schedule = Schedule.from_row(row)
        if self.sealer is None or KEY_HEADER not in schedule.headers:
            return schedule
        try:
            return self.sealer.open_schedule(schedule)
        except Unreadable as error:
            return schedule.with_changes(headers={**schedule.headers, PROBLEM_HEADER: str(error)})

    # --- the rules ------------------------------------------------------------------------------
    def add_schedule(self, schedule: Schedule, now: datetime | None = None) -> Schedule:
        """Keep ``schedule`` and store its first ticks, planned from ``now`` (the store's time
        when not given); ScheduleExists if its id is taken. A schedule whose ticks cannot be
        planned is refused, and a failed add leaves nothing behind."""
        self._ready()
        now = self._now(now)
        schedule = schedule.with_changes(
            version=0,
            created_at=now,
            changed_at=now,
            planned_until=None if schedule.paused else now,
            set_aside=None,
        )
        if not schedule.paused:
            _plannable(plan(schedule, now, PLAN_AHEAD))
        if not self._schedule_insert(self._row_of(schedule)):
            raise ScheduleExists(
                f"A schedule with id {schedule.schedule_id!r} exists; remove it first, or change it "
                "with `duetime recurring change`."
            )
        try:
            self._plan_one(schedule.schedule_id, now, PLAN_AHEAD)
        except BaseException:
            self._schedule_delete(schedule.schedule_id)
            raise
        return self.get_schedule(schedule.schedule_id)

    def get_schedule(self, schedule_id: str) -> Schedule:
        self._ready()
        row = self._schedule_get(check_schedule_id(schedule_id))
        if row is None:
            raise ScheduleNotFound(
                f"No schedule {schedule_id!r} in this endpoint; `duetime recurring list` shows them."
            )
        return self._schedule_of(row)

    def list_schedules(self, after: str = "", limit: int = 100) -> builtins.list[Schedule]:
        """A page of schedules by id; pass the last id back as ``after``."""
        if not isinstance(after, str) or "\x00" in after:
            raise InvalidSchedule(
                "after is the last schedule id of the previous page: text without NUL bytes."
            )
        self._ready()
        return [self._schedule_of(r) for r in self._schedule_page(after, limit)]

    def change_schedule(
        self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime | None = None
    ) -> Schedule:
        """Apply ``change`` and plan again from ``now``: ticks stored for the old schedule and
        not being delivered are removed first (it takes effect from its next tick). Meanwhile the
        schedule is paused, so a planner adds nothing for the old one; a crash part-way leaves
        it paused (``resume`` carries on), never ticking twice."""
        now = self._now(now)
        target = change(self.get_schedule(schedule_id))
        frozen = self._freeze(schedule_id, change, now)
        return frozen if target.paused else self._resume(schedule_id, now)

    def pause_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """No more ticks until resumed; stored ticks not being delivered are removed."""
        return self._freeze(schedule_id, lambda s: s, self._now(now))

    def _freeze(self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime) -> Schedule:
        """``change`` the schedule and pause it, then remove its stored ticks. A tick being
        delivered cannot be removed, and one may be delivered while this runs: every stored tick
        before the first one removed went or is going out, so planning starts after the last of
        them when the schedule resumes (``in_flight_until``), and none goes out twice."""
        read: builtins.list[Schedule] = []

        def frozen_of(s: Schedule) -> Schedule:
            read[:] = [s]
            return change(s).with_changes(paused=True, planned_until=None)

        frozen = self._set(schedule_id, frozen_of, now)
        before = read[0]
        removed = self._cancel_ticks(schedule_id)
        if removed is None:  # every stored tick went out (or none was stored)
            going = None if before.paused else before.planned_until
        else:  # the ones before the first removed went out: the last of them
            going = None
            with contextlib.suppress(InvalidSchedule):  # a zone this host cannot read: none went
                for at in islice(before.recurrence.ticks(now), MOST_GONE):
                    if at >= removed:
                        break
                    going = at
        if going is None or going <= now:
            return frozen
        if frozen.in_flight_until is not None and going <= frozen.in_flight_until:
            return frozen
        return self._set(schedule_id, lambda s: s.with_changes(in_flight_until=going), now)

    def _cancel_ticks(self, schedule_id: str) -> datetime | None:
        """Remove the schedule's stored ticks one by one; the earliest planned time of those
        removed (None: none could be, all being delivered or delivered meanwhile)."""
        removed: datetime | None = None
        for tick in self._ticks_of(group_of(schedule_id)):
            try:
                if not self.cancel(tick.message_id):
                    continue  # delivered meanwhile
            except MessageInFlight:
                continue
            planned = _planned_at(tick)
            removed = planned if removed is None else min(removed, planned)
        return removed

    def _ticks_of(self, group: str) -> builtins.list[DelayedMessage]:
        found: builtins.list[DelayedMessage] = []
        after = None
        while True:
            page = self.list(ListQuery(group=group, limit=500, after=after))
            found += page.messages
            if page.next_cursor is None:
                return found
            after = page.next_cursor

    def resume_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """Tick again from the next planned time after ``now`` (the ticks of the pause are not
        sent, nor counted as missed). A schedule a planner set aside is tried again."""
        return self._resume(schedule_id, self._now(now))

    def _resume(self, schedule_id: str, now: datetime) -> Schedule:
        def resumed(s: Schedule) -> Schedule:
            start = now if s.in_flight_until is None else max(now, s.in_flight_until)
            return s.with_changes(paused=False, planned_until=start, in_flight_until=None, set_aside=None)

        self._set(schedule_id, resumed, now)
        self._plan_one(schedule_id, now, PLAN_AHEAD)
        return self.get_schedule(schedule_id)

    def remove_schedule(self, schedule_id: str) -> int:
        """Forget the schedule and remove its stored ticks; how many ticks were removed (one
        being delivered at that moment still goes). ScheduleNotFound if there is none."""
        self._ready()
        if not self._schedule_delete(check_schedule_id(schedule_id)):
            raise ScheduleNotFound(f"No schedule {schedule_id!r} in this endpoint.")
        removed = self.cancel_group(group_of(schedule_id)) + self.cancel_group(extra_group_of(schedule_id))
        old_extra = schedule_id + OLD_EXTRA_GROUP_SUFFIX
        if self._schedule_get(old_extra) is None:
            # trigger and backfill ticks stored by earlier versions, unless that is another
            # schedule's own group
            removed += self.cancel_group(GROUP_PREFIX + old_extra)
        return removed

    def trigger_schedule(self, schedule_id: str, now: datetime | None = None) -> DelayedMessage:
        """One tick now, beside the schedule's own (which go on as planned); a pause or a change
        does not take it back."""
        now = self._now(now)
        schedule = self.get_schedule(schedule_id)
        tick = schedule.tick(now, now, kind="trigger", own_id=True)
        self.store_new([tick])
        return tick

    def backfill_schedule(
        self, schedule_id: str, start: datetime, end: datetime, now: datetime | None = None
    ) -> int:
        """Send now every tick planned from ``start`` to ``end`` (both in the past); a tick with
        that time still stored is not stored twice. How many were stored."""
        now = self._now(now)
        if end > now:
            raise InvalidSchedule("A backfill ends now at the latest; ticks to come are the schedule's own.")
        if start > end:
            raise InvalidSchedule("A backfill's start comes before its end.")
        schedule = self.get_schedule(schedule_id)
        times = []
        for at in schedule.recurrence.ticks(start - timedelta(microseconds=1)):
            if at > end:
                break
            times.append(at)
            if len(times) > 100_000:
                raise InvalidSchedule("A backfill is at most 100,000 ticks; give a shorter span.")
        stored = 0
        for i in range(0, len(times), 1000):
            stored += self.store_new([schedule.tick(at, now, kind="backfill") for at in times[i : i + 1000]])
        return stored

    def plan_schedules(
        self,
        now: datetime | None = None,
        ahead: timedelta = PLAN_AHEAD,
        limit: int = PLAN_BATCH,
        *,
        steady_since: datetime | None = None,
    ) -> PlanReport:
        """Store the ticks due within ``ahead`` of every schedule that needs them (a step of at
        most ``limit`` schedules; ``more`` says when others wait). A schedule that cannot be
        planned is set aside (its state says why) and the others go on. ``steady_since``: see
        :func:`duetime.recurring.schedule.plan`."""
        self._ready()
        now = self._now(now)
        rows = self._schedules_to_plan(now + ahead, limit)
        oldest = min((r.planned_until for r in rows if r.planned_until is not None), default=None)
        waited = 0.0 if oldest is None else max(0.0, (now + ahead - oldest).total_seconds())
        # in id order: every planner writes rows in the same order, so two never wait on each
        # other in a circle (a deadlock)
        changes: list[Planned] = []
        steps: list[tuple[str, Plan | str]] = []
        for row in sorted(rows, key=lambda r: r.schedule_id):
            step = _plan_row(row, now, ahead, steady_since)
            steps.append((row.schedule_id, step))
            changes.append(
                (set_aside_row(row, step), []) if isinstance(step, str) else (step.after.row(), step.ticks)
            )
        # another planner's, or a changed schedule: its turn, or the next step's
        written = self._schedule_update(changes) if changes else []
        ticks = missed = planned = 0
        more = len(rows) >= limit
        earliest: datetime | None = None
        missed_by: list[tuple[str, int]] = []
        set_aside: list[tuple[str, str]] = []
        for (schedule_id, step), done in zip(steps, written, strict=True):
            if not done:
                continue
            if isinstance(step, str):
                set_aside.append((schedule_id, step))
                continue
            planned += 1
            ticks += len(step.ticks)
            more = more or step.more
            if step.missed:
                missed += step.missed
                missed_by.append((schedule_id, step.missed))
            if step.ticks:
                first = min(t.due_at for t in step.ticks)
                earliest = first if earliest is None else min(earliest, first)
        if earliest is not None:
            self._announce(earliest)
        return PlanReport(planned, ticks, missed, earliest, tuple(missed_by), more, tuple(set_aside), waited)

    def _plan_one(self, schedule_id: str, now: datetime, ahead: timedelta) -> None:
        """Plan one schedule now (it was added, changed or resumed); one that cannot be planned
        is set aside and the caller told why in one line."""
        for attempt in range(CHANGE_TRIES):
            if attempt:
                time.sleep(min(0.02 * attempt, 0.2))
            row = self._schedule_get(schedule_id)
            if row is None:
                return
            step = _plan_row(row, now, ahead)
            if isinstance(step, str):
                if self._schedule_update([(set_aside_row(row, step), [])])[0]:
                    raise InvalidSchedule(
                        f"The schedule {schedule_id!r} cannot be planned, so it is set aside: {step}"
                    )
                continue
            if not step.ticks and step.after == Schedule.from_row(row):
                return
            if self._schedule_update([(step.after.row(), step.ticks)])[0]:
                if step.ticks:
                    self._announce(min(t.due_at for t in step.ticks))
                return

    def _set(self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime) -> Schedule:
        """Compare-and-set: apply ``change`` to the row as read until no one changed it between."""
        self._ready()
        check_schedule_id(schedule_id)
        for attempt in range(CHANGE_TRIES):
            if attempt:
                time.sleep(min(0.02 * attempt, 0.2))  # a planner holds the row: let it finish
            row = self._schedule_get(schedule_id)
            if row is None:
                raise ScheduleNotFound(f"No schedule {schedule_id!r} in this endpoint.")
            before = self._schedule_of(row)
            changed = change(before).with_changes(
                schedule_id=schedule_id, version=row.version, changed_at=now
            )
            _check_sealed_change(before, changed)
            if self._schedule_update([(self._row_of(changed), [])])[0]:
                return changed.with_changes(version=row.version + 1)
        raise InvalidSchedule(f"The schedule {schedule_id!r} kept changing under this call; try again.")


def _check_sealed_change(before: Schedule, after: Schedule) -> None:
    """A schedule still sealed (no keyring here, or not its key) may be paused, resumed or
    re-timed, but what it sends cannot be changed without opening it."""
    kid = sealed_with(before.headers)
    if kid is None:
        return
    if (before.destination, before.body, dict(before.headers)) != (
        after.destination,
        after.body,
        dict(after.headers),
    ):
        raise ConfigurationError(
            f"the schedule {before.schedule_id!r} is encrypted with key {kid!r}: to change what it sends, "
            "set DUETIME_ENCRYPTION_KEYS to a keyring that holds that key."
        )


def _plan_row(
    row: ScheduleRow, now: datetime, ahead: timedelta, steady_since: datetime | None = None
) -> Plan | str:
    """The plan of a stored schedule, or why it cannot be planned. Planning is reckoning only (no
    store is asked), so whatever it raises is the schedule's own: a zone this host cannot read,
    ticks no message can carry. Such a schedule is set aside; the others go on."""
    try:
        return plan(Schedule.from_row(row), now, ahead, steady_since=steady_since)
    except Exception as error:
        return one_line(error)


def _plannable(step: Plan) -> None:
    """Refuse a new schedule whose first step stores no tick and ends it: it would never tick."""
    if not step.ticks and step.after.planned_until is None:
        raise InvalidSchedule(
            f"The schedule {step.after.schedule_id!r} has no tick to come: its start, end or count "
            "leave none from now to the year 9998."
        )


def _planned_at(tick: DelayedMessage) -> datetime:
    """The planned time a stored tick carries (its due time if the header is unreadable)."""
    try:
        return parse_time(tick.headers[PLANNED_HEADER])
    except (KeyError, ValueError):
        return tick.due_at
