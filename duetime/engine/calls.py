"""The engine's calls to its store and transport: each within a deadline, each counted by its breaker.

The four circuit breakers are NServiceBus's (fetch, store, dispatch, recovery); a call's deadline
is ``operation_timeout`` but at most half its breaker's time, so a partition shows up as failures
in time to trip the breaker when it should.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from duetime.engine.circuit import (
    BreakerEvents,
    FailureRateCircuitBreaker,
    RepeatedFailuresOverTimeCircuitBreaker,
)
from duetime.engine.deadline import within
from duetime.engine.pinpoint import send_pinpointing
from duetime.errors import CriticalError, TransportError, one_line
from duetime.interfaces import DelayedMessageStore, Transport
from duetime.message import DelayedMessage
from duetime.settings import DelayedDeliverySettings

log = logging.getLogger("duetime.dispatcher")


class Breakers:
    """The dispatcher's circuit breakers; each calls ``trip`` with its critical error."""

    def __init__(
        self,
        settings: DelayedDeliverySettings,
        trip: Callable[[CriticalError], None],
        monotonic: Callable[[], float],
        events: BreakerEvents,
    ) -> None:
        s = settings

        def timed(name: str, seconds: float, message: str) -> RepeatedFailuresOverTimeCircuitBreaker:
            return RepeatedFailuresOverTimeCircuitBreaker(name, seconds, trip, monotonic, message, events)

        self.fetch = timed(
            "fetch",
            s.time_to_trigger_fetch_circuit_breaker.total_seconds(),
            "Failed to fetch due delayed messages from the storage.",
        )
        self.store = timed(
            "store",
            s.time_to_trigger_store_circuit_breaker.total_seconds(),
            "Failed to store the outcome of delayed message forwarding.",
        )
        self.dispatch = timed(
            "dispatch",
            s.time_to_trigger_dispatch_circuit_breaker.total_seconds(),
            "Failed to dispatch delayed messages to destination.",
        )
        self.recovery = FailureRateCircuitBreaker(
            "recovery",
            s.maximum_recovery_failures_per_second,
            trip,
            monotonic,
            "Failed to execute error handling for delayed message forwarding.",
            events,
        )

    def timed(self) -> tuple[RepeatedFailuresOverTimeCircuitBreaker, ...]:
        """The breakers that arm and trip after a time (the recovery breaker counts a rate)."""
        return (self.fetch, self.store, self.dispatch)


class EngineCalls:
    """The store and transport calls the strategies and the failure policy make."""

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings,
        breakers: Breakers,
    ) -> None:
        self.store = store
        self.transport = transport
        self.settings = settings
        self.breakers = breakers

    def deadline(self, breaker: RepeatedFailuresOverTimeCircuitBreaker) -> float:
        """A call's deadline: ``operation_timeout``, at most half ``breaker``'s time."""
        return min(self.settings.operation_timeout.total_seconds(), breaker.time_to_trigger / 2)

    async def connect(self) -> None:
        """Connect the transport and declare the error queue (what must work before any send)."""
        seconds = self.deadline(self.breakers.dispatch)
        await within(self.transport.start(), seconds, "connecting the transport")
        await within(self.transport.declare(self.settings.error_queue), seconds, "declaring the error queue")

    async def send(self, batch: Sequence[DelayedMessage], doing: str) -> list[Exception | None]:
        """One result per message, a connection lost mid-batch traced to the message that loses it
        (:mod:`duetime.engine.pinpoint`); raises when the transport fails as a whole."""
        seconds = self.deadline(self.breakers.dispatch)

        async def send(part: Sequence[DelayedMessage]) -> list[Exception | None]:
            results = await within(self.transport.send_batch(part), seconds, doing)
            if len(results) != len(part):
                raise TransportError(f"transport answered {len(results)} results for {len(part)} messages")
            return results

        return await send_pinpointing(batch, send, self.connect)

    async def remove(self, message_ids: Sequence[str]) -> bool:
        """Remove forwarded messages; a failure is the store's (their claims expire, they go again)."""
        breaker = self.breakers.store
        try:
            await within(
                self.store.remove_many(message_ids), self.deadline(breaker), "removing forwarded messages"
            )
        except Exception as error:
            log.warning("removing %d forwarded messages failed: %s", len(message_ids), one_line(error))
            breaker.failure(error)
            return False
        breaker.success()
        return True

    async def release(self, message_ids: Sequence[str], *, counted: bool = False) -> None:
        """Give claims back to the store. A failure is logged (the claims expire by themselves;
        nothing is lost) and, when ``counted``, is a store failure for its breaker."""
        if not message_ids:
            return
        try:
            await within(
                self.store.release(message_ids), self.deadline(self.breakers.store), "releasing claims"
            )
        except Exception as error:
            log.warning("releasing %d claims failed: %s", len(message_ids), one_line(error))
            if counted:
                self.breakers.store.failure(error)
