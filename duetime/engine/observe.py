"""What the dispatcher and the front door tell observers as they work.

Every sink of the engine is an observer (Dramatiq's middleware idea): the stats, the lateness
histogram, the trace, the delivery log, the summary line, the Prometheus metrics. The engine tells
them what it already has in hand and knows none of them; each overrides only the events it needs,
the rest are no-ops. ``duetime.observability.metrics`` is one; a test or a custom exporter can be
another (``Dispatcher(..., observer=...)`` or ``dispatcher.observer.add(...)``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from duetime.message import DelayedMessage

log = logging.getLogger("duetime.observe")


class Settled(NamedTuple):
    """A message the dispatcher is done with (delivered, or put in the error queue and removed),
    whichever way it went (a batch sent, or a transactional move)."""

    message_id: str
    destination: str
    due_at: datetime
    #: Tries it took, this one included.
    attempts: int
    #: Its W3C ``traceparent`` header, if it has one (the forward span links to it).
    trace: str | None = None

    def lateness(self, at: datetime) -> float:
        """Seconds from its due time to ``at`` (negative: early, which the engine never is)."""
        return (at - self.due_at).total_seconds()


class DispatchObserver:
    """The engine's events, each a no-op here: subclass and override what you need.

    Events are called in the engine's own task with what it has in hand; a synchronous one must be
    cheap. Raising is a bug in the observer: it is logged, and neither delivery nor the other
    observers wait on it. I/O belongs in :meth:`round_ended`, awaited once a round is settled.
    """

    def round_started(self) -> None:
        """A round begins (a claim or a transactional move follows)."""

    def claimed(self, count: int) -> None:
        """``count`` due messages were claimed (or, exactly-once, taken in a move)."""

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        """Messages delivered at ``at`` and removed from the store."""

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        """Messages put in the error queue at ``at`` and removed from the store."""

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        """A forward failed (its ``attempts``-th) and will be tried again."""

    def unreachable(self, error: BaseException, doing: str) -> None:
        """The transport could not be reached while ``doing`` something: one outage, nothing lost."""

    def fetch_failed(self, error: Exception) -> None:
        """Claiming (or moving) due messages failed: the store did not answer."""

    def batch(self, size: int, seconds: float) -> None:
        """One batch handled: how many messages, how long from claim to done."""

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        """Front-door messages stored, sent to the error queue as unreadable, already stored."""

    def planned(self, ticks: int, missed: int) -> None:
        """Recurring schedules' ticks stored by a planning step, and ticks their catch-up policy
        left out (missed while no dispatcher ran)."""

    async def round_ended(self) -> None:
        """Awaited after every round, found or not: the place for I/O (a log written elsewhere)."""


class Observers(DispatchObserver):
    """Every observer of one dispatcher, told each event in the order they were added."""

    def __init__(self, observers: Iterable[DispatchObserver] = ()) -> None:
        self._all = list(observers)

    def add(self, observer: DispatchObserver) -> None:
        """Tell ``observer`` of every event from now on."""
        self._all.append(observer)

    def _each(self, event: str, *args: object) -> None:
        for observer in self._all:
            try:
                getattr(observer, event)(*args)
            except Exception:
                log.exception("observer %s failed on %s", type(observer).__name__, event)

    def round_started(self) -> None:
        self._each("round_started")

    def claimed(self, count: int) -> None:
        self._each("claimed", count)

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        if done:
            self._each("delivered", done, at)

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        if done:
            self._each("dead_lettered", done, at)

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        self._each("retried", message, attempts, error)

    def unreachable(self, error: BaseException, doing: str) -> None:
        self._each("unreachable", error, doing)

    def fetch_failed(self, error: Exception) -> None:
        self._each("fetch_failed", error)

    def batch(self, size: int, seconds: float) -> None:
        self._each("batch", size, seconds)

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        self._each("front_door", stored, rejected, duplicates)

    def planned(self, ticks: int, missed: int) -> None:
        if ticks or missed:
            self._each("planned", ticks, missed)

    async def round_ended(self) -> None:
        for observer in self._all:
            try:
                await observer.round_ended()
            except Exception:
                log.exception("observer %s failed after a round", type(observer).__name__)
