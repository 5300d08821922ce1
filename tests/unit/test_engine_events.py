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
from duetime.errors import TransportUnavailable
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
