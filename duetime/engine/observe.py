"""What the dispatcher and the front door tell an observer (metrics, traces) as they work.

Hooks with no-op defaults (Dramatiq's middleware idea): the engine calls them with what it already
has in hand, never waits on them, and imports no metrics library. ``duetime.observability.metrics`` turns them
into Prometheus metrics; a test or a custom exporter can implement the few it needs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

log = logging.getLogger("duetime.observe")


@runtime_checkable
class DispatchObserver(Protocol):
    """Called by the dispatcher and the front door; every call must be cheap and must not raise."""

    def claimed(self, count: int) -> None:
        """``count`` due messages were claimed (or, exactly-once, taken in a move)."""

    def forwarded(self, sent: Sequence[tuple[str, float]]) -> None:
        """Messages delivered: (destination, seconds between due time and delivery) each."""

    def dead_lettered(self, destinations: Sequence[str]) -> None:
        """Messages sent to the error queue, by the destination they were meant for."""

    def retried(self, destination: str) -> None:
        """A failed forward that will be tried again."""

    def batch(self, size: int, seconds: float) -> None:
        """One batch handled: how many messages, how long from claim to done."""

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        """Front-door messages stored, sent to the error queue as unreadable, already stored."""


class NoObserver:
    """The default: nothing observed, nothing spent."""

    def claimed(self, count: int) -> None:
        pass

    def forwarded(self, sent: Sequence[tuple[str, float]]) -> None:
        pass

    def dead_lettered(self, destinations: Sequence[str]) -> None:
        pass

    def retried(self, destination: str) -> None:
        pass

    def batch(self, size: int, seconds: float) -> None:
        pass

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        pass
