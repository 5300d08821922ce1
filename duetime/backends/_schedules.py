"""Recurring schedules in a store, written once: a backend keeps rows, these rules keep the promise.

A schedule's row is a JSON text, how far its ticks are stored (``planned_until``) and a version.
Every change is a compare-and-set on the version: a writer that read an older row writes nothing
and reads again. Planning (:meth:`ScheduleRules.plan_schedules`) writes the row and stores the new
ticks in one transaction of the backend's, so ticks are stored exactly once, however many
dispatchers plan at the same moment and wherever one is killed. The ticks are then delivered as
every stored message is (exactly-once where the store and the destination share a transaction).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from duetime.errors import InvalidSchedule, ScheduleExists, ScheduleNotFound, StoreNotReady
from duetime.interfaces import Clock
from duetime.message import DelayedMessage
from duetime.recurring.schedule import (
    PlanReport,
    Schedule,
    ScheduleRow,
    check_schedule_id,
    extra_group_of,
    group_of,
    plan,
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

    @abstractmethod
    def cancel_group(self, group: str) -> int: ...

    @abstractmethod
    def store_new(self, messages: Sequence[DelayedMessage]) -> int: ...

    # --- the rules ------------------------------------------------------------------------------
    def add_schedule(self, schedule: Schedule, now: datetime | None = None) -> Schedule:
        """Keep ``schedule`` and store its first ticks; ScheduleExists if its id is taken."""
        self._ready()
        now = now or self.clock.now()
        if not self._schedule_insert(schedule.with_changes(version=0).row()):
            raise ScheduleExists(
                f"A schedule with id {schedule.schedule_id!r} exists; remove it first, or change it "
                "with `duetime recurring change`."
            )
        self._plan_one(schedule.schedule_id, now, PLAN_AHEAD)
        return self.get_schedule(schedule.schedule_id)

    def get_schedule(self, schedule_id: str) -> Schedule:
        self._ready()
        row = self._schedule_get(check_schedule_id(schedule_id))
        if row is None:
            raise ScheduleNotFound(
                f"No schedule {schedule_id!r} in this endpoint; `duetime recurring list` shows them."
            )
        return Schedule.from_row(row)

    def list_schedules(self, after: str = "", limit: int = 100) -> list[Schedule]:
        """A page of schedules by id; pass the last id back as ``after``."""
        self._ready()
        return [Schedule.from_row(r) for r in self._schedule_page(after, limit)]

    def change_schedule(
        self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime
    ) -> Schedule:
        """Apply ``change`` and plan again from ``now``: ticks stored for the old schedule and
        not being delivered are removed first (it takes effect from its next tick). Meanwhile the
        schedule is paused, so a planner adds nothing for the old one; a crash part-way leaves
        it paused (``resume`` carries on), never ticking twice."""
        now = now or self.clock.now()
        target = change(self.get_schedule(schedule_id))
        frozen = self._set(
            schedule_id, lambda s: change(s).with_changes(paused=True, planned_until=None), now
        )
        self.cancel_group(group_of(schedule_id))
        return frozen if target.paused else self._resume(schedule_id, now)

    def pause_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """No more ticks until resumed; stored ticks not being delivered are removed."""
        now = now or self.clock.now()
        paused = self._set(schedule_id, lambda s: s.with_changes(paused=True, planned_until=None), now)
        self.cancel_group(group_of(schedule_id))
        return paused

    def resume_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """Tick again from the next planned time after ``now`` (the ticks of the pause are not
        sent, nor counted as missed)."""
        return self._resume(schedule_id, now or self.clock.now())

    def _resume(self, schedule_id: str, now: datetime) -> Schedule:
        self._set(schedule_id, lambda s: s.with_changes(paused=False, planned_until=now), now)
        self._plan_one(schedule_id, now, PLAN_AHEAD)
        return self.get_schedule(schedule_id)

    def remove_schedule(self, schedule_id: str) -> int:
        """Forget the schedule and remove its stored ticks; how many ticks were removed (one
        being delivered at that moment still goes). ScheduleNotFound if there is none."""
        self._ready()
        if not self._schedule_delete(check_schedule_id(schedule_id)):
            raise ScheduleNotFound(f"No schedule {schedule_id!r} in this endpoint.")
        return self.cancel_group(group_of(schedule_id)) + self.cancel_group(extra_group_of(schedule_id))

    def trigger_schedule(self, schedule_id: str, now: datetime | None = None) -> DelayedMessage:
        """One tick now, beside the schedule's own (which go on as planned); a pause or a change
        does not take it back."""
        now = now or self.clock.now()
        schedule = self.get_schedule(schedule_id)
        tick = schedule.tick(now, now, kind="trigger", own_id=True)
        self.store_new([tick])
        return tick

    def backfill_schedule(
        self, schedule_id: str, start: datetime, end: datetime, now: datetime | None = None
    ) -> int:
        """Send now every tick planned from ``start`` to ``end`` (both in the past); a tick with
        that time still stored is not stored twice. How many were stored."""
        now = now or self.clock.now()
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
        self, now: datetime, ahead: timedelta = PLAN_AHEAD, limit: int = PLAN_BATCH
    ) -> PlanReport:
        """Store the ticks due within ``ahead`` of every schedule that needs them (a step of at
        most ``limit`` schedules; ``more`` says when others wait)."""
        self._ready()
        now = now or self.clock.now()
        rows = self._schedules_to_plan(now + ahead, limit)
        # in id order: every planner writes rows in the same order, so two never wait on each
        # other in a circle (a deadlock)
        ordered = sorted(rows, key=lambda r: r.schedule_id)
        steps = [(row.schedule_id, plan(Schedule.from_row(row), now, ahead)) for row in ordered]
        # another planner's, or a changed schedule: its turn, or the next step's
        written = (
            self._schedule_update([(step.after.row(), step.ticks) for _, step in steps]) if steps else []
        )
        ticks = missed = planned = 0
        earliest: datetime | None = None
        missed_by: list[tuple[str, int]] = []
        for (schedule_id, step), done in zip(steps, written, strict=True):
            if not done:
                continue
            planned += 1
            ticks += len(step.ticks)
            if step.missed:
                missed += step.missed
                missed_by.append((schedule_id, step.missed))
            if step.ticks:
                first = min(t.due_at for t in step.ticks)
                earliest = first if earliest is None else min(earliest, first)
        if earliest is not None:
            self._announce(earliest)
        return PlanReport(planned, ticks, missed, earliest, tuple(missed_by), len(rows) >= limit)

    def _plan_one(self, schedule_id: str, now: datetime, ahead: timedelta) -> None:
        for attempt in range(CHANGE_TRIES):
            if attempt:
                time.sleep(min(0.02 * attempt, 0.2))
            row = self._schedule_get(schedule_id)
            if row is None:
                return
            step = plan(Schedule.from_row(row), now, ahead)
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
            changed = change(Schedule.from_row(row)).with_changes(
                schedule_id=schedule_id, version=row.version, changed_at=now
            )
            if self._schedule_update([(changed.row(), [])])[0]:
                return changed.with_changes(version=row.version + 1)
        raise InvalidSchedule(f"The schedule {schedule_id!r} kept changing under this call; try again.")
