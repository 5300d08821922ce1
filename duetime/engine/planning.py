"""Recurring schedules from inside a dispatcher: their ticks stored a little ahead of time.

Every dispatcher of an endpoint plans, every :data:`PLAN_EVERY` seconds: the store's
compare-and-set lets any number plan at once without a tick stored twice, so there is no leader
to elect and nothing to fail over (a dispatcher killed while planning leaves nothing half done).
The ticks are then ordinary stored messages, delivered by the same rounds as every other one.
"""

from __future__ import annotations

import logging
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


class Planner:
    """Plans the schedules of one store; ``plan_once`` is a step, ``run`` the loop."""

    def __init__(
        self, store: RecurringStore, now: Callable[[], datetime], observer: DispatchObserver | None = None
    ) -> None:
        self.store = store
        self.now = now
        self.observer = observer or DispatchObserver()
        self._failing: str | None = None

    async def plan_once(self) -> None:
        """Plan until no schedule waits; a store that cannot plan is said once and left."""
        while True:
            try:
                report = await within(
                    self.store.plan_schedules(self.now()), PLAN_WITHIN, "planning schedules"
                )
            except StoreNotReady as error:  # a store set up before schedules: `duetime setup`
                self._say_once(str(error))
                return
            except Exception as error:  # an outage: the dispatcher's breakers see it in its rounds
                self._say_once(f"planning recurring schedules failed: {one_line(error)}")
                return
            if self._failing is not None:
                log.info("planning recurring schedules again")
                self._failing = None
            self._count(report)
            if not report.more:
                return

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
        for schedule_id, missed in report.missed_by:
            log.warning(
                "schedule %s: %s tick(s) missed while no dispatcher ran (its catch-up policy left them out)",
                schedule_id,
                missed,
                extra={"fields": {"schedule": schedule_id, "ticks_missed": missed}},
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
