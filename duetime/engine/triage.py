"""Sorting a transport's answers for a batch: one reading of send results for every send.

A transport answers one result per message (None: carried). What each answer means for the
message is decided here once, for a batch to its destinations and for copies to the error queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from duetime.errors import (
    DestinationNotFound,
    MessageRefused,
    RetryLater,
    RouteUnavailable,
    TransportUnavailable,
)
from duetime.message import DelayedMessage

#: Failures another try cannot mend: to the error queue at once, without retries.
NOT_RETRIED = (DestinationNotFound, MessageRefused)
#: Failures of one destination, not of the transport (a webhook answering 503): its schedule
#: retries them and no circuit breaker counts them, so the other destinations keep going.
DESTINATIONS_OWN = (*NOT_RETRIED, RetryLater)


@dataclass(slots=True)
class Triage:
    """A batch's messages by what their send came to."""

    #: Carried.
    carried: list[DelayedMessage] = field(default_factory=list)
    #: Not sent because the transport could not be reached: an outage, not theirs.
    unreachable: list[DelayedMessage] = field(default_factory=list)
    #: The first unreachable answer (what the outage is logged and counted with).
    outage: TransportUnavailable | None = None
    #: Not sent because their route is down while another can be reached: they wait for its
    #: next try (an outage of that route alone, not of the dispatcher).
    waiting: list[tuple[DelayedMessage, RouteUnavailable]] = field(default_factory=list)
    #: Failed, each with its error; :data:`NOT_RETRIED` among them will never go.
    failed: list[tuple[DelayedMessage, Exception]] = field(default_factory=list)

    @classmethod
    def of(cls, batch: Sequence[DelayedMessage], results: Sequence[Exception | None]) -> Triage:
        """Sort ``batch`` by ``results`` (one per message, in order)."""
        triage = cls()
        for message, result in zip(batch, results, strict=True):
            if result is None:
                triage.carried.append(message)
            elif isinstance(result, RouteUnavailable):
                triage.waiting.append((message, result))
            elif isinstance(result, TransportUnavailable):
                triage.unreachable.append(message)
                if triage.outage is None:
                    triage.outage = result
            else:
                triage.failed.append((message, result))
        return triage

    @property
    def transport_failures(self) -> list[tuple[DelayedMessage, Exception]]:
        """Failures that may be the transport's (another try may go): the dispatch breaker counts them."""
        return [(m, e) for m, e in self.failed if not isinstance(e, DESTINATIONS_OWN)]

    def split_refused(
        self,
    ) -> tuple[list[tuple[DelayedMessage, Exception]], list[tuple[DelayedMessage, Exception]]]:
        """The failures as (refused: the message itself cannot be carried, the rest)."""
        refused: list[tuple[DelayedMessage, Exception]] = []
        rest: list[tuple[DelayedMessage, Exception]] = []
        for message, error in self.failed:
            (refused if isinstance(error, MessageRefused) else rest).append((message, error))
        return refused, rest
