"""The flow-control rules on the memory store and a fake clock: what a batch may send, what is
held and until when, and what counts as held time rather than lateness."""

from __future__ import annotations

from datetime import timedelta

from duetime.backends.memory import MemoryStore
from duetime.engine.flow import PAUSE_HOLD, REFRESH_SECONDS, FlowControl
from duetime.limits import Limit, Pause, Rate
from duetime.message import DelayedMessage
from duetime.settings import TransactionMode
from duetime.testing import FakeClock


async def _ready() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.setup_infrastructure("duetime")
    await store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    return store, clock


async def test_a_rate_sends_its_turns_and_holds_the_rest_one_interval_apart() -> None:
    store, clock = await _ready()
    now = clock.now()
    await store.store_many([DelayedMessage(f"m{i}", "partner", now, b"x") for i in range(8)])
    await store.store(DelayedMessage("o", "other", now, b"x"))
    await store.set_limit(Limit("partner", Rate.parse("10/s")))
    flow = FlowControl(store, clock)
    batch = await store.fetch_due(now, 10)
    admitted = await flow.admit(batch)
    sent = sorted(m.message_id for m in admitted.send)
    assert sent == ["m0", "m1", "m2", "m3", "o"]  # one turn, and 0.3 s of them made up
    assert admitted.held == 4 and (await store.counts(now)).held == 4
    assert await store.fetch_due(now + timedelta(milliseconds=99), 10) == []
    later = await store.fetch_due(now + timedelta(milliseconds=201), 10)
    assert sorted(m.message_id for m in later) == ["m4", "m5"]  # their turns: 0.1 s and 0.2 s on
    assert flow.limited("partner", now) and not flow.limited("other", now)


async def test_a_resumed_destinations_backlog_is_held_time_and_the_holds_are_given_back() -> None:
    """After a resume the backlog is sent at once, and its wait still counts as held (it waited
    for the pause), while a message due after the resume is measured as lateness again."""
    store, clock = await _ready()
    now = clock.now()
    await store.store(DelayedMessage("b", "billing", now, b"x"))
    await store.pause_destination(Pause("billing", "ann", now))
    flow = FlowControl(store, clock)
    admitted = await flow.admit(await store.fetch_due(now, 10))
    assert admitted.send == [] and admitted.held == 1
    assert await store.fetch_due(now + PAUSE_HOLD - timedelta(seconds=1), 10) == []
    await store.resume_destination("billing")
    clock.advance(REFRESH_SECONDS)
    await flow.refresh()  # sees the resume: what it held is claimable at once
    [back] = await store.fetch_due(clock.now(), 10)
    assert back.message_id == "b" and not flow.active
    assert flow.limited("billing", now)  # due before the pause ended: held time
    assert not flow.limited("billing", clock.now() + timedelta(seconds=1))


async def test_a_store_that_keeps_no_limits_is_asked_once() -> None:
    class NoLimits(MemoryStore):
        async def limits(self) -> list[Limit]:
            from duetime.errors import ConfigurationError

            raise ConfigurationError("NoLimits keeps no flow-control limits")

    clock = FakeClock()
    store = NoLimits(clock=clock)
    await store.setup_infrastructure("duetime")
    await store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    flow = FlowControl(store, clock)
    await flow.refresh()
    assert flow.unkept and not flow.stale and not flow.needed
