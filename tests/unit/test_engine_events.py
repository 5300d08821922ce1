"""The dispatcher as a loop that emits events: every sink an observer, both strategies alike."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher
from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.engine.observe import DispatchObserver, Settled
from duetime.engine.strategies import AtLeastOnce, DeliveryStrategy, ExactlyOnce
from duetime.errors import CriticalError, MessageRefused, TransportUnavailable
from tests.unit.helpers import Rig


class Journal(DispatchObserver):
    """Writes down every event it is told (only the ones it overrides; the rest are no-ops)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def claimed(self, count: int) -> None:
        self.events.append(("claimed", count))

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        self.events.append(("delivered", sorted(s.message_id for s in done)))

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        self.events.append(("dead_lettered", [(s.message_id, s.attempts) for s in done]))

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        self.events.append(("retried", (message.message_id, attempts)))

    def unreachable(self, error: BaseException, doing: str) -> None:
        self.events.append(("unreachable", doing))

    async def round_ended(self) -> None:
        self.events.append(("round_ended", None))

    def named(self, name: str) -> list[object]:
        return [what for event, what in self.events if event == name]


async def test_an_observer_is_told_deliveries_retries_dead_letters_and_outages() -> None:
    rig = await Rig(number_of_retries=1, failure_backoff=timedelta(0)).setup("orders", "error")
    journal = Journal()
    rig.dispatcher.observer.add(journal)
    tries: dict[str, int] = {}

    def fail(m: DelayedMessage) -> Exception | None:
        tries[m.message_id] = tries.get(m.message_id, 0) + 1
        return ConnectionResetError("reset") if m.message_id == "m2" and m.destination == "orders" else None

    rig.transport.fail = fail
    await rig.store.store_many([rig.message(1, 0), rig.message(2, 0)])
    await rig.dispatcher.run_burst()
    assert journal.named("delivered") == [["m1"]]
    assert journal.named("retried") == [("m2", 1)]
    assert journal.named("dead_lettered") == [[("m2", 2)]]
    assert journal.named("round_ended")  # after every round

    rig.transport.down = TransportUnavailable("broker gone")
    await rig.store.store(rig.message(3, 0))
    await rig.dispatcher.dispatch_once()
    assert journal.named("unreachable") == ["sending"]
    stats = rig.dispatcher.stats  # the dispatcher's own counts are an observer of the same events
    assert (stats.forwarded, stats.retries, stats.dead_lettered, stats.outages) == (1, 1, 1, 1)


async def test_an_observer_that_raises_costs_a_log_line_never_a_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(DispatchObserver):
        def delivered(self, done: Sequence[Settled], at: datetime) -> None:
            raise RuntimeError("observer bug")

    rig = await Rig().setup("orders")
    journal = Journal()
    rig.dispatcher.observer.add(Broken())
    rig.dispatcher.observer.add(journal)
    await rig.store.store(rig.message(1, 0))
    with caplog.at_level(logging.ERROR, "duetime.observe"):
        stats = await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m1"] and stats.forwarded == 1
    assert journal.named("delivered") == [["m1"]]  # observers after the broken one are still told
    assert "observer Broken failed on delivered" in caplog.text


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
async def test_both_strategies_tell_observers_the_same_events(mode: str) -> None:
    store, queues = MemoryStore(), MemoryTransport()
    await store.setup_infrastructure("duetime")
    await queues.declare("orders")
    await queues.declare("error")
    settings = DelayedDeliverySettings(transaction_mode=mode)  # type: ignore[arg-type]
    journal = Journal()
    d = Dispatcher(store, queues, settings, observer=journal)
    assert isinstance(d.strategy, ExactlyOnce if mode == "exactly-once" else AtLeastOnce)
    assert isinstance(d.strategy, DeliveryStrategy)
    await store.initialize("duetime", settings.transaction_mode)
    now = datetime.now(UTC)
    await store.store_many([DelayedMessage("a", "orders", now), DelayedMessage("b", "void", now)])
    await d.run_burst()
    assert journal.named("claimed")[0] == 2
    assert journal.named("delivered") == [["a"]]
    assert journal.named("dead_lettered") == [[("b", 1)]]
    assert (d.stats.forwarded, d.stats.dead_lettered) == (1, 1)


class Outcomes(DispatchObserver):
    """Writes down the outcome events, in the order they come."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        self.events += [("dead_lettered", f"{s.message_id}: {s.reason}") for s in done]

    def parked(self, message: DelayedMessage, reason: BaseException, until: datetime) -> None:
        self.events.append(("parked", message.message_id))

    def breaker_armed(self, name: str, error: BaseException) -> None:
        self.events.append(("armed", name))

    def breaker_disarmed(self, name: str, failures: int) -> None:
        self.events.append(("disarmed", name))

    def breaker_tripped(self, name: str, failures: int, error: CriticalError) -> None:
        self.events.append(("tripped", name))

    def critical(self, error: CriticalError) -> None:
        self.events.append(("critical", str(error).split(".")[0]))


async def test_every_outcome_is_an_event_told_once_in_order_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A message dead-lettered, one parked (neither its queue nor the error queue can carry it),
    then the broker down until the dispatch breaker arms and trips, and the critical error: each
    an event for every observer, once and in order, and each one line of the log observer's."""
    rig = await Rig(number_of_retries=0, failure_backoff=timedelta(0)).setup("orders", "error")
    outcomes = Outcomes()
    rig.dispatcher.observer.add(outcomes)
    rig.transport.fail = lambda m: (
        MessageRefused("over the broker's size limit") if m.body == b"huge" else None
    )
    huge = rig.message(2, 0).with_changes(body=b"huge")
    await rig.store.store_many([rig.message(1, 0, destination="nowhere"), huge])
    with caplog.at_level(logging.INFO, logger="duetime"):
        await rig.dispatcher.run_burst()
        rig.transport.down = ConnectionError("broker unreachable")
        await rig.store.store(rig.message(3, 0))
        await rig.start()
        await rig.tick(1, steps=31)
        with pytest.raises(CriticalError):
            await rig.task  # type: ignore[misc]
    assert [event for event, _ in outcomes.events] == [
        "dead_lettered",
        "parked",
        "armed",
        "tripped",
        "critical",
    ]
    assert outcomes.events[0][1].startswith("m1: ") and "nowhere" in outcomes.events[0][1]
    assert outcomes.events[-1] == ("critical", "Failed to dispatch delayed messages to destination")
    lines = [r.getMessage() for r in caplog.records]
    for said in (
        "message m1 sent to the error queue",
        "message m2 can be carried neither to orders nor to the error queue",
        "circuit breaker dispatch armed",
        "circuit breaker dispatch tripped",
        "Failed to dispatch delayed messages to destination",
    ):
        assert sum(said in line for line in lines) == 1, (said, lines)
