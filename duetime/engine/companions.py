"""What the dispatcher's companions see of it: each a narrow view, written down as a Protocol.

The heartbeat, the probes, the metrics and the NServiceBus front door run beside the dispatcher
(:class:`duetime.Service` starts them). Each takes the view below that names what it reads or
calls, never the whole :class:`~duetime.engine.dispatcher.Dispatcher`: what a companion depends
on is said in one place, the dispatcher may change the rest freely, and a companion can be tested
with a small object of its own. The dispatcher is each of them as it is (structural typing).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from duetime.engine.calls import Breakers
    from duetime.engine.circuit import FailureRateCircuitBreaker
    from duetime.engine.observe import Observers
    from duetime.engine.sinks import DispatchStats
    from duetime.engine.summary import LatenessHistogram
    from duetime.errors import CriticalError
    from duetime.interfaces import Clock, DelayedMessageStore, Transport
    from duetime.settings import DelayedDeliverySettings, TransactionMode


class Running(Protocol):
    """Which dispatcher, with what, and whether it runs: every companion's part."""

    @property
    def endpoint(self) -> str: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def settings(self) -> DelayedDeliverySettings: ...
    @property
    def store(self) -> DelayedMessageStore: ...
    @property
    def started(self) -> bool: ...
    @property
    def stopping(self) -> bool: ...
    async def wait_for_stop(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True as soon as the dispatcher is stopping."""
        ...


class Reported(Running, Protocol):
    """What the heartbeat and the metrics say of a dispatcher: its counts, claims and breakers,
    its observers, which the metrics join to count events as they happen, and its transport,
    whose own counts (a webhook's requests) the metrics read."""

    @property
    def mode(self) -> TransactionMode: ...
    @property
    def stats(self) -> DispatchStats: ...
    @property
    def lateness(self) -> LatenessHistogram: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def last_batch_at(self) -> datetime | None: ...
    @property
    def claims_end_by(self) -> datetime | None: ...
    @property
    def breakers(self) -> Breakers: ...
    @property
    def observer(self) -> Observers: ...
    @property
    def transport(self) -> Transport: ...
    def breakers_armed(self) -> dict[str, float | None]: ...


class Probed(Reported, Protocol):
    """What the health and readiness probes ask besides: is the loop turning, is the transport
    reachable."""

    @property
    def turned_at(self) -> float: ...
    @property
    def stuck_after(self) -> float: ...
    @property
    def transport_reachable(self) -> bool: ...


class FrontDoorHost(Running, Protocol):
    """What the NServiceBus front door uses of the dispatcher it stores for: its transport (to
    send what it rejects), its back-off after a failure, its observers, and the breakers that
    stop it (a storage outage trips the dispatcher, as its own would)."""

    @property
    def transport(self) -> Transport: ...
    @property
    def observer(self) -> Observers: ...
    @property
    def recovery_breaker(self) -> FailureRateCircuitBreaker: ...
    def trip(self, error: CriticalError) -> None: ...
    async def back_off(self) -> None: ...


async def until_started(dispatcher: Running) -> bool:
    """Wait until the dispatcher has started (its store initialized for the endpoint, its
    transport connected); False if it stops first. A companion that reads the store waits for
    this: a store not yet bound to the endpoint refuses every read, and a companion whose first
    read failed would otherwise show nothing until its next turn."""
    while not dispatcher.started:
        if dispatcher.stopping or await dispatcher.wait_for_stop(0.05):
            return False
    return True
