"""A transport that cannot be reached: counted as outages, waited out with a doubling back-off.

An outage is never a message's failure: what was claimed goes back to the store untouched, and
only the dispatch breaker's time ends it (a critical error).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from duetime.engine.circuit import RepeatedFailuresOverTimeCircuitBreaker
from duetime.engine.observe import DispatchObserver
from duetime.errors import StorageFull, one_line
from duetime.interfaces import Clock
from duetime.settings import DelayedDeliverySettings

log = logging.getLogger("duetime.dispatcher")


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait after the ``tries``-th failed try in a row: ``first`` seconds, doubling to
    ``longest`` (the dispatcher's ``failure_backoff`` and ``max_failure_backoff``), for the
    transport as a whole and for each route alike."""

    first: float = 1.0
    longest: float = 5.0

    @classmethod
    def of(cls, settings: DelayedDeliverySettings) -> Backoff:
        return cls(settings.failure_backoff.total_seconds(), settings.max_failure_backoff.total_seconds())

    def after(self, tries: int) -> float:
        return min(self.first * 2.0 ** max(tries - 1, 0), self.longest)


#: The dispatcher's default back-off (1 s doubling to 5 s), for a caller without settings at hand.
DEFAULT_BACKOFF = Backoff()


class Outages:
    """Consecutive failed attempts to reach the transport, and the pause after each."""

    def __init__(
        self,
        settings: DelayedDeliverySettings,
        breaker: RepeatedFailuresOverTimeCircuitBreaker,
        clock: Clock,
        observer: DispatchObserver,
        wake: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.breaker = breaker
        self.clock = clock
        self.observer = observer
        #: Set by a stop request (or a store's word): a pause ends at once.
        self.wake = wake
        #: Consecutive attempts the transport could not be reached: the back-off doubles.
        self.consecutive = 0

    @property
    def reachable(self) -> bool:
        return self.consecutive == 0

    def down(self, error: BaseException, doing: str) -> None:
        """The transport could not be reached while ``doing`` something: one outage."""
        self.consecutive += 1
        self.observer.unreachable(error, doing)
        log.warning(
            "transport %s while %s (%s); messages stay stored, retrying (critical after %g s)",
            "full (it cannot write)" if isinstance(error, StorageFull) else "unreachable",
            doing,
            one_line(error),
            self.breaker.time_to_trigger,
        )
        self.breaker.failure(error)

    def up(self) -> None:
        """The transport answered."""
        if self.consecutive:
            log.info("transport reachable again after %d failed attempt(s)", self.consecutive)
        self.consecutive = 0

    async def pause(self) -> None:
        """Back off while the transport is down: ``failure_backoff``, doubling to the maximum, and
        never past the moment the breaker is due (it looks again then, not later)."""
        pause = Backoff.of(self.settings).after(self.consecutive)
        breaker = self.breaker
        if breaker.armed_at is not None:
            left = breaker.armed_at + breaker.time_to_trigger - self.clock.monotonic()
            pause = min(pause, max(left, 0.0) + 0.001)
        await self.clock.wait(self.wake, pause)
