"""What the dispatcher and the front door tell observers as they work.

Every sink of the engine is an observer (Dramatiq's middleware idea): the stats, the lateness
histogram, the trace, the delivery log, the summary line, the Prometheus metrics. The engine tells
them what it already has in hand and knows none of them; each overrides only the events it needs,
the rest are no-ops. ``duetime.observability.metrics`` is one; a test or a custom exporter can be
another (``Dispatcher(..., observer=...)`` or ``dispatcher.observer.add(...)``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from duetime.clock import handed_over_at
from duetime.errors import CriticalError
from duetime.interfaces import Moved
from duetime.message import DelayedMessage
from duetime.tracing import traced

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
    #: Why it went to the error queue (for one dead-lettered).
    reason: str | None = None
    #: A flow-control limit or pause governs its destination (:mod:`duetime.limits`): its wait
    #: from its due time is measured as held, never as lateness.
    held: bool = False
    #: When it counts as delivered, where that is not the time the observer is told: a message
    #: moved ahead of its due time is put in its queue early, and visible to receivers from its
    #: due time on.
    delivered_at: datetime | None = None

    @classmethod
    def moved(cls, moved: Moved, at: datetime, budget: timedelta = timedelta(0)) -> Settled:
        """A message an exactly-once move delivered at ``at``, or, moved ahead of its due time,
        when it shows in its queue (its due time rounded up to a whole lateness ``budget``): it is
        read back without its failures, so its try is counted as its first."""
        ahead = max(at, handed_over_at(moved.due_at, budget)) if moved.due_at > at else None
        return cls(moved.message_id, moved.destination, moved.due_at, 1, moved.trace, delivered_at=ahead)

    @classmethod
    def of(cls, message: DelayedMessage, *, reason: str | None = None, held: bool = False) -> Settled:
        """``message`` as settled now: delivered by this try (its failures so far plus this one),
        or dead-lettered with ``reason`` (its failures, this one counted already, at least one)."""
        attempts = max(message.failure_count, 1) if reason is not None else message.failure_count + 1
        return cls(
            message.message_id,
            message.destination,
            message.due_at,
            attempts,
            traced(message.headers),
            reason,
            held,
        )

    def lateness(self, at: datetime) -> float:
        """Seconds from its due time to ``at`` (or to ``delivered_at``, if set; negative: early,
        which the engine never is)."""
        return ((self.delivered_at or at) - self.due_at).total_seconds()


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

    def held_back(self, destinations: Sequence[str]) -> None:
        """Claimed messages a flow-control limit or pause held back in the store (one
        destination each): they wait there for their turn, unchanged."""

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        """Front-door messages stored, sent to the error queue as unreadable, already stored."""

    def planned(self, ticks: int, missed: int) -> None:
        """Recurring schedules' ticks stored by a planning step, and ticks their catch-up policy
        left out (missed while no dispatcher ran)."""

    def planning_behind(self, seconds: float) -> None:
        """After each planning step: how long the longest-waiting schedule waited to be planned
        (about a second when planning keeps up; more, and its ticks go late)."""

    def schedules_set_aside(self, count: int) -> None:
        """Recurring schedules a planning step set aside because they cannot be planned (a zone
        this host cannot read, ticks no message can carry); the others go on."""

    def parked(self, message: DelayedMessage, reason: BaseException, until: datetime) -> None:
        """Neither its destination nor the error queue can carry ``message``: it stays stored,
        its failure counted, and is tried again at ``until``."""

    def breaker_armed(self, name: str, error: BaseException) -> None:
        """The circuit breaker ``name`` saw a first failure: it trips if failures go on."""

    def breaker_disarmed(self, name: str, failures: int) -> None:
        """The circuit breaker ``name`` saw a success after ``failures`` failures."""

    def breaker_tripped(self, name: str, failures: int, error: CriticalError) -> None:
        """The circuit breaker ``name`` tripped: the dispatcher stops with ``error``."""

    def critical(self, error: CriticalError) -> None:
        """The critical error that stops the dispatcher (told once)."""

    async def round_ended(self) -> None:
        """Awaited after every round, found or not: the place for I/O (a log written elsewhere)."""


class Observers(DispatchObserver):
    """Every observer of one dispatcher, told each event in the order they were added. Its
    methods are made from :class:`DispatchObserver`'s own list (below), so an event is declared
    once; an event that says nothing happened (an empty batch, counts of zero) is not told.

    Each event goes only to the observers that override it, looked up when one is added: a
    round tells several events, and calling every observer's no-op for each cost more than the
    observers' own work at a few hundred rounds a second."""

    def __init__(self, observers: Iterable[DispatchObserver] = ()) -> None:
        #: Per event, the observers that override it and their bound methods, in order.
        self._told: dict[str, list[tuple[DispatchObserver, Callable[..., Any]]]] = {
            event: [] for event in (*EVENTS, "round_ended")
        }
        for observer in observers:
            self.add(observer)

    def add(self, observer: DispatchObserver) -> None:
        """Tell ``observer`` of every event from now on."""
        for event, told in self._told.items():
            method = getattr(observer, event, None)
            if method is not None and getattr(type(observer), event, None) is not getattr(
                DispatchObserver, event
            ):
                told.append((observer, method))

    def _emit(
        self, event: str, told: list[tuple[DispatchObserver, Callable[..., Any]]], args: tuple[object, ...]
    ) -> None:
        for observer, method in told:
            try:
                method(*args)
            except Exception:
                log.exception("observer %s failed on %s", type(observer).__name__, event)

    async def round_ended(self) -> None:
        for observer, method in self._told["round_ended"]:
            try:
                await method()
            except Exception:
                log.exception("observer %s failed after a round", type(observer).__name__)


def _teller(event: str) -> Callable[..., None]:
    def tell(self: Observers, *args: object) -> None:
        told = self._told[event]
        if told and not (args and _nothing(args)):
            self._emit(event, told, args)

    tell.__name__ = event
    return tell


def _nothing(args: tuple[object, ...]) -> bool:
    """Whether an event's arguments say nothing happened: an empty batch, counts of zero. Asked
    several times a round, so the common answers come first and cheaply (an ABC's isinstance
    was a tenth of a round's observing)."""
    first = args[0]
    if type(first) is int:
        return first == 0 and all(type(a) is int and a == 0 for a in args)
    if type(first) is list or type(first) is tuple:
        return not first
    return isinstance(first, Sequence) and not isinstance(first, str) and not first


#: The synchronous events, read off DispatchObserver: the one list of them.
EVENTS = [
    name
    for name, member in vars(DispatchObserver).items()
    if callable(member) and not name.startswith("_") and not inspect.iscoroutinefunction(member)
]
for _event in EVENTS:
    setattr(Observers, _event, _teller(_event))
