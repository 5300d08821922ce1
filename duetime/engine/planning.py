"""Recurring schedules from inside a dispatcher: their ticks stored a little ahead of time.

Every dispatcher of an endpoint plans, every :data:`PLAN_EVERY` seconds: the store's
compare-and-set lets any number plan at once without a tick stored twice, so there is no leader
to elect and nothing to fail over (a dispatcher killed while planning leaves nothing half done).
The ticks are then ordinary stored messages, delivered by the same rounds as every other one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from duetime.engine.deadline import within
from duetime.engine.observe import DispatchObserver
from duetime.errors import StoreNotReady, one_line
from duetime.interfaces import RecurringStore
from duetime.recurring.schedule import PlanReport

log = logging.getLogger("duetime.recurring")

#: Seconds between two planning steps of a dispatcher (ticks are stored 30 s ahead).
PLAN_EVERY = 1.0
#: Seconds a planning step may take before it is given up (and tried again next time).
PLAN_WITHIN = 10.0
#: Planning is behind when a schedule waited longer than this to be planned: its ticks go late.
BEHIND_AFTER = 5.0
#: Seconds between two lines saying planning is behind, while it stays behind.
SAY_EVERY = 60.0
#: Schedules named in a line about missed ticks (the rest are counted).
NAMED = 5


class Planner:
    """Plans the schedules of one store; ``plan_once`` is a step, ``run`` the loop."""

    def __init__(
        self, store: RecurringStore, now: Callable[[], datetime], observer: DispatchObserver | None = None
    ) -> None:
        self.store = store
        self.now = now
        self.observer = observer or DispatchObserver()
        self._failing: str | None = None
        #: When the unbroken run of planning steps began (None before the first, and after a
        #: failure): ticks planned since were not missed by an absent dispatcher, only late.
        self._steady_since: datetime | None = None
        #: When planning was last said to be behind (monotonic seconds).
        self._behind_said_at: float | None = None

    async def plan_once(self) -> None:
        """Plan until no schedule waits; a store that cannot plan is said once and left."""
        started = self.now()
        steady = self._steady_since is not None  # a first pass's wait is the absence, not a lag
        waited = 0.0
        while True:
            try:
                report = await within(
                    self.store.plan_schedules(started, steady_since=self._steady_since),
                    PLAN_WITHIN,
                    "planning schedules",
                )
            except StoreNotReady as error:  # a store set up before schedules: `duetime setup`
                self._say_once(str(error))
                self._steady_since = None
                return
            except Exception as error:  # an outage: the dispatcher's breakers see it in its rounds
                self._say_once(f"planning recurring schedules failed: {one_line(error)}")
                self._steady_since = None
                return
            if self._failing is not None:
                log.info("planning recurring schedules again")
                self._failing = None
            self._count(report)
            if steady:
                self.observer.planning_behind(report.waited)  # each step: a long pass shows its lag
                waited = max(waited, report.waited)
            if not report.more:
                break
            started = self.now()
        if self._steady_since is None:
            self._steady_since = started
        self._behind(waited)

    def _behind(self, waited: float) -> None:
        """One line a minute while the planning lag is over BEHIND_AFTER."""
        at = time.monotonic()
        if waited <= BEHIND_AFTER or (
            self._behind_said_at is not None and at - self._behind_said_at < SAY_EVERY
        ):
            return
        self._behind_said_at = at
        log.warning(
            "planning recurring schedules is behind: a schedule waited %.0f s to be planned, so "
            "its ticks go late (none is dropped); more dispatchers, or fewer schedules, catch up",
            waited,
            extra={"fields": {"planning_behind_seconds": round(waited, 1)}},
        )

    def _count(self, report: PlanReport) -> None:
        self.observer.planned(report.ticks, report.missed)
        if report.set_aside:
            self.observer.schedules_set_aside(len(report.set_aside))
        for schedule_id, why in report.set_aside:
            log.warning(
                "schedule %s cannot be planned and is set aside (the others go on): %s; "
                "`duetime recurring change` or `resume` tries it again",
                schedule_id,
                why,
                extra={"fields": {"schedule": schedule_id, "set_aside": why}},
            )
        if report.missed_by:  # one line a step, however many schedules
            named = ", ".join(f"{sid} ({n:,})" for sid, n in report.missed_by[:NAMED])
            others = len(report.missed_by) - NAMED
            log.warning(
                "%s tick(s) of %s schedule(s) missed while no dispatcher ran (their catch-up policy "
                "left them out): %s%s",
                f"{report.missed:,}",
                f"{len(report.missed_by):,}",
                named,
                f" and {others:,} more" if others > 0 else "",
                extra={
                    "fields": {
                        "ticks_missed": report.missed,
                        "schedules": len(report.missed_by),
                        "schedule": report.missed_by[0][0],
                    }
                },
            )

    def _say_once(self, text: str) -> None:
        if text != self._failing:
            log.warning("%s", text)
            self._failing = text

    async def run(self, wait_for_stop: Callable[[float], Awaitable[bool]]) -> None:
        """Plan, then wait :data:`PLAN_EVERY` (or until stopped), until stopped."""
        while True:
            await self.plan_once()
            if await wait_for_stop(PLAN_EVERY):
                return
