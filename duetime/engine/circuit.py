"""Circuit breakers: NServiceBus's repeated-failures-over-time and failure-rate breakers.

A breaker never raises by itself; when it trips it calls its ``trigger`` with a
:class:`~duetime.errors.CriticalError`, and the dispatcher makes sure that call happens and stops.
It tells ``events`` (the dispatcher's observers) when it arms, disarms and trips; the log line of
each is the log observer's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

from duetime.errors import CriticalError

log = logging.getLogger("duetime.circuit")


class BreakerEvents(Protocol):
    """What a breaker tells (a :class:`~duetime.engine.observe.DispatchObserver` is one)."""

    def breaker_armed(self, name: str, error: BaseException) -> None: ...

    def breaker_disarmed(self, name: str, failures: int) -> None: ...

    def breaker_tripped(self, name: str, failures: int, error: CriticalError) -> None: ...


class RepeatedFailuresOverTimeCircuitBreaker:
    """Arms on the first failure, disarms on a success, trips when failures outlast ``time_to_trigger``."""

    def __init__(
        self,
        name: str,
        time_to_trigger: float,
        trigger: Callable[[CriticalError], None],
        monotonic: Callable[[], float],
        message: str,
        events: BreakerEvents,
    ) -> None:
        self.name = name
        self.events = events
        self.time_to_trigger = time_to_trigger
        self._trigger = trigger
        self._monotonic = monotonic
        self._message = message
        self.armed_at: float | None = None
        self.failures = 0
        self.tripped = False

    @property
    def armed(self) -> bool:
        return self.armed_at is not None

    def success(self) -> None:
        if self.armed_at is not None:
            self.events.breaker_disarmed(self.name, self.failures)
        self.armed_at = None
        self.failures = 0

    def failure(self, error: BaseException) -> None:
        now = self._monotonic()
        self.failures += 1
        if self.armed_at is None:
            self.armed_at = now
            self.events.breaker_armed(self.name, error)
            return
        if not self.tripped and now - self.armed_at >= self.time_to_trigger:
            self.tripped = True
            critical = CriticalError(_describe(self._message, error))
            critical.__cause__ = error
            self.events.breaker_tripped(self.name, self.failures, critical)
            self._trigger(critical)


class FailureRateCircuitBreaker:
    """Trips when more than ``maximum_per_second`` failures fall within one second."""

    def __init__(
        self,
        name: str,
        maximum_per_second: int,
        trigger: Callable[[CriticalError], None],
        monotonic: Callable[[], float],
        message: str,
        events: BreakerEvents,
    ) -> None:
        self.name = name
        self.events = events
        self.maximum = maximum_per_second
        self._trigger = trigger
        self._monotonic = monotonic
        self._message = message
        self._window = -math.inf
        self._count = 0
        self.tripped = False

    def failure(self, error: BaseException) -> None:
        second = math.floor(self._monotonic())
        if second != self._window:
            self._window, self._count = second, 0
        self._count += 1
        log.warning("circuit breaker %s: %d failure(s) this second: %s", self.name, self._count, error)
        if self._count > self.maximum and not self.tripped:
            self.tripped = True
            critical = CriticalError(_describe(self._message, error))
            critical.__cause__ = error
            self.events.breaker_tripped(self.name, self._count, critical)
            self._trigger(critical)


def _describe(message: str, error: BaseException) -> str:
    """The breaker's message verbatim (operators match on it), then the last failure."""
    return f"{message} Last failure: {type(error).__name__}: {error}"
