"""Claiming ahead on a fake clock: what comes due within ``claim_window`` is claimed in one round
and sent from memory at its due time, never before, and removed in one call; a message claimed
ahead cannot be cancelled; a stop gives back what was not sent; a message stored meanwhile, due
sooner than the next, is claimed into the same window."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from duetime import DelayedMessage, Dispatcher
from duetime.errors import MessageInFlight
from tests.unit.helpers import Rig


class Counting(Rig):
    def __init__(self, **settings: object) -> None:
        super().__init__(**settings)
        self.claims = 0
        self.removals: list[list[str]] = []
        store, fetch, remove = self.store, self.store.fetch_due_and_next, self.store.remove_many

        async def counted_fetch(at, limit):  # type: ignore[no-untyped-def]
            self.claims += 1
            return await fetch(at, limit)

        async def counted_remove(ids: Sequence[str]) -> int:
            self.removals.append(list(ids))
            return await remove(ids)

        store.fetch_due_and_next = counted_fetch  # type: ignore[method-assign]
        store.remove_many = counted_remove  # type: ignore[method-assign]


async def test_one_claim_takes_the_window_and_each_goes_at_its_due_time_never_before() -> None:
    rig = await Counting(claim_window=timedelta(milliseconds=50)).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.010), rig.message(3, 10.030)])
    await rig.start()
    claims = rig.claims
    await rig.tick(9.999)
    assert rig.delivered() == [] and rig.claims == claims, "woken early while messages come far apart"
    await rig.tick(0.001)  # due: claimed with what comes due within 50 ms, and sent
    assert rig.delivered() == ["m1"] and rig.claims == claims + 1
    with pytest.raises(MessageInFlight):
        await rig.store.cancel("m2")  # claimed ahead: being delivered
    await rig.tick(0.009)
    assert rig.delivered() == ["m1"], "sent before it was due"
    await rig.tick(0.001)
    assert rig.delivered() == ["m1", "m2"]
    await rig.tick(0.020)
    assert rig.delivered() == ["m1", "m2", "m3"]
    assert rig.claims == claims + 1, "one claim for the window"
    assert rig.removals == [["m1", "m2", "m3"]], "one removal for the window"
    assert (await rig.store.counts(rig.clock.now())).total == 0
    # messages closer than the window: the next wake is a claim's time early, so the first is
    # in memory when it comes due
    await rig.store.store_many([rig.message(4, 0.970), rig.message(5, 0.980)])  # at 11.000, 11.010
    await rig.tick(0.968)
    assert rig.delivered() == ["m1", "m2", "m3"] and rig.claims == claims + 2
    await rig.tick(0.002)
    assert rig.delivered() == ["m1", "m2", "m3", "m4"]
    await rig.tick(0.010)
    assert rig.delivered() == ["m1", "m2", "m3", "m4", "m5"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_stop_while_a_window_waits_gives_back_what_was_not_sent() -> None:
    rig = await Rig(claim_window=timedelta(milliseconds=50)).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.040)])
    await rig.start()
    await rig.tick(10)
    assert rig.delivered() == ["m1"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]
    assert rig.delivered() == ["m1"]
    assert await rig.store.get("m1") is None, "what was sent is removed at the stop"
    assert await rig.store.cancel("m2"), "given back: unclaimed, so a cancel reaches it"


async def test_a_message_stored_during_a_window_due_sooner_is_claimed_into_it_on_time() -> None:
    rig = await Rig(claim_window=timedelta(milliseconds=50)).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.040)])
    await rig.start()
    await rig.tick(10)
    assert rig.delivered() == ["m1"]
    await rig.store.store(rig.message(3, 0.010))  # due at 10.010, before m2
    await rig.tick(0.010)
    assert rig.delivered() == ["m1", "m3"]
    await rig.tick(0.030)
    assert rig.delivered() == ["m1", "m3", "m2"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_burst_claims_nothing_ahead() -> None:
    rig = await Rig(claim_window=timedelta(milliseconds=50)).setup("orders")
    await rig.store.store_many([rig.message(1, 0), rig.message(2, 0.010)])
    await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m1"]
    assert await rig.store.cancel("m2")


async def test_a_window_never_holds_more_than_a_batch_so_a_kill_sends_one_batch_again_at_most() -> None:
    rig = await Rig(claim_window=timedelta(milliseconds=50), batch_size=2).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.040)])
    await rig.start()
    await rig.tick(10)
    await rig.store.store(rig.message(3, 0.010))  # due sooner than m2, but the window is full
    assert await rig.store.cancel("m3"), "claimed into a full window"
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_batchs_duration_leaves_out_the_wait_for_due_times_claimed_ahead() -> None:
    from duetime import DispatchObserver

    class Durations(DispatchObserver):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def batch(self, size: int, seconds: float) -> None:
            self.seen.append(seconds)

    durations = Durations()
    rig = await Rig(claim_window=timedelta(milliseconds=50)).setup("orders")
    rig.dispatcher = Dispatcher(
        rig.store, rig.transport, rig.settings, endpoint="unit", clock=rig.clock, observer=durations
    )
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.040)])
    await rig.start()
    await rig.tick(10)
    await rig.tick(0.040)
    assert rig.delivered() == ["m1", "m2"]
    assert durations.seen and max(durations.seen) < 0.001, durations.seen  # not the 40 ms waited
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_message_stored_during_a_window_due_after_what_it_holds_is_not_forgotten() -> None:
    """Stored while the window waits for m2, due after m2 but long before what the claim saw next
    (m3): the wait after the window ends by it, instead of sleeping until m3."""
    rig = await Rig(claim_window=timedelta(milliseconds=50)).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.040), rig.message(3, 20)])
    await rig.start()
    await rig.tick(10)
    assert rig.delivered() == ["m1"]
    await rig.store.store(rig.message(4, 0.045))  # due at 10.045: after m2, before m3
    await rig.tick(0.040)
    assert rig.delivered() == ["m1", "m2"]
    await rig.tick(0.005)
    assert rig.delivered() == ["m1", "m2", "m4"], "slept toward m3 with m4 due"
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_budget_sends_a_step_at_a_time_each_at_most_the_budget_late_never_early() -> None:
    """With a lateness budget of 20 ms, the messages claimed ahead go at their due time rounded up
    to a whole 20 ms: one send for each step, none before its due time."""
    rig = await Counting(
        claim_window=timedelta(milliseconds=50), lateness_budget=timedelta(milliseconds=20)
    ).setup("orders")
    sends: list[list[str]] = []
    send = rig.transport.send_batch

    async def counted(messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        sends.append([m.message_id for m in messages])
        return await send(messages)

    rig.transport.send_batch = counted  # type: ignore[method-assign]
    # the fake clock starts on a whole second: the steps end at 10.020 and 10.040
    dues = [10.001, 10.005, 10.012, 10.025, 10.039]
    await rig.store.store_many([rig.message(i, d) for i, d in enumerate(dues, 1)])
    await rig.start()
    await rig.tick(10.001)  # m1 due: the claim takes the window
    assert rig.delivered() == [], "sent before its step ended"
    await rig.tick(0.018)  # 10.019
    assert rig.delivered() == [], "sent before its step ended"
    # (the wait may end up to asyncio's millisecond late: the fake clock ends it there)
    await rig.tick(0.002)  # 10.021
    assert rig.delivered() == ["m1", "m2", "m3"]
    await rig.tick(0.018)  # 10.039: m5 due, its step not ended
    assert rig.delivered() == ["m1", "m2", "m3"]
    await rig.tick(0.002)  # 10.041
    assert rig.delivered() == ["m1", "m2", "m3", "m4", "m5"]
    assert sends == [["m1", "m2", "m3"], ["m4", "m5"]], "one send for each step"
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


def test_the_step_a_message_is_handed_over_in() -> None:
    from datetime import UTC, datetime

    from duetime.clock import handed_over_at

    base = datetime(2030, 1, 1, tzinfo=UTC)
    step = timedelta(milliseconds=20)
    for offset_us, expected_us in [(0, 0), (1, 20_000), (19_999, 20_000), (20_000, 20_000), (20_001, 40_000)]:
        due = base + timedelta(microseconds=offset_us)
        assert handed_over_at(due, step) == base + timedelta(microseconds=expected_us)
    assert handed_over_at(base + timedelta(microseconds=7), timedelta(0)) == base + timedelta(microseconds=7)
    before_1970 = datetime(1969, 12, 31, 23, 59, 59, 990_001, tzinfo=UTC)
    assert handed_over_at(before_1970, step) == datetime(1970, 1, 1, tzinfo=UTC)


def test_a_message_moved_ahead_counts_as_delivered_when_it_shows_in_its_queue() -> None:
    """The lateness a move made ahead reports: from the due time to the step's end it shows at
    (never negative, never the moment of the move)."""
    from datetime import UTC, datetime

    from duetime.engine.observe import Settled
    from duetime.interfaces import Moved

    due = datetime(2030, 1, 1, 0, 0, 10, 5_000, tzinfo=UTC)  # 10.005 s
    moved_at = due - timedelta(milliseconds=30)
    ahead = Settled.moved(Moved("m", "orders", due), moved_at, timedelta(milliseconds=20))
    assert ahead.lateness(moved_at) == 0.015  # shows at 10.020
    assert Settled.moved(Moved("m", "orders", due), moved_at).lateness(moved_at) == 0.0
    late = Settled.moved(Moved("m", "orders", due), due + timedelta(milliseconds=3))
    assert late.delivered_at is None and late.lateness(due + timedelta(milliseconds=3)) == 0.003
