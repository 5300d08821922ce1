"""The dispatcher on a fake clock: no sleeps, no network."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from duetime import (
    CriticalError,
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    UnsupportedTransactionMode,
)
from duetime import error_headers as eq
from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.testing import FlakyTransport, settle
from tests.unit.helpers import FailingStore, Rig


async def test_burst_forwards_what_is_due_and_nothing_early() -> None:
    rig = await Rig().setup("orders")
    await rig.store.store_many([rig.message(1, -1), rig.message(2, 0), rig.message(3, 0.001)])
    stats = await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m1", "m2"]  # m2 too: alone it would have waited until 10.009
    assert stats.forwarded == 2
    assert await rig.store.get("m3") is not None
    received = rig.queues.messages("orders")[0]
    assert received.headers["duetime-due-at"] == (rig.clock.now() - timedelta(seconds=1)).isoformat()


async def test_sleeps_until_the_next_due_time_then_delivers() -> None:
    rig = await Rig().setup("orders")
    await rig.store.store(rig.message(1, 10))
    await rig.start()
    await rig.tick(9.999)
    assert rig.delivered() == []
    await rig.tick(0.001)
    assert rig.delivered() == ["m1"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_an_earlier_message_wakes_the_sleeping_dispatcher() -> None:
    rig = await Rig().setup("orders")
    await rig.store.store(rig.message(1, 120))
    await rig.start()
    assert rig.clock.sleepers == 2  # the loop, and the recurring schedules' planner between steps
    await rig.store.store(rig.message(2, 1))  # stored while it sleeps toward 2 minutes
    await settle()
    await rig.tick(1)
    assert rig.delivered() == ["m2"]
    await rig.tick(119)
    assert rig.delivered() == ["m2", "m1"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_round_short_of_a_batch_is_not_followed_by_an_empty_one() -> None:
    """Full batches go again at once; a short one left nothing due, so the next question is when
    the next message is due, not another round that finds nothing."""
    rig = await Rig(batch_size=2).setup("orders")
    await rig.store.store_many([rig.message(i, 0) for i in range(5)] + [rig.message(9, 10)])
    await rig.start()
    await rig.tick(0)
    assert rig.delivered() == [f"m{i}" for i in range(5)]
    assert rig.dispatcher.stats.rounds == 3  # 2 + 2 + 1, then asleep toward m9
    await rig.tick(10)
    assert rig.delivered()[-1] == "m9" and rig.dispatcher.stats.rounds == 4
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


class _StoresWhileSending(FlakyTransport):
    """Stores ``later`` while the first batch is being sent: something stored mid-round."""

    def __init__(self, inner: MemoryTransport, store: MemoryStore, later: DelayedMessage) -> None:
        super().__init__(inner)
        self.store, self.later = store, [later]

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        if self.later:
            await self.store.store(self.later.pop())
        return await super().send_batch(messages)


class _LateToAnswer(FailingStore):
    """A store whose "next due?" answer misses what is committed while it is asked (a commit
    racing the question): the told due time is all the dispatcher has."""

    def __init__(self, hidden: set[str]) -> None:
        super().__init__()
        self.hidden = hidden

    async def next_due(self) -> datetime | None:
        due = [m.due_at for m in await self.peek(100) if m.message_id not in self.hidden]
        return min(due, default=None)


def _rig_with(rig: Rig, store: FailingStore, later: DelayedMessage) -> Rig:
    rig.store = store
    rig.transport = _StoresWhileSending(rig.queues, store, later)
    rig.dispatcher = Dispatcher(store, rig.transport, rig.settings, endpoint="unit", clock=rig.clock)
    return rig


async def test_a_message_stored_for_later_during_a_round_makes_no_empty_round() -> None:
    """Told mid-round of a message due later, the dispatcher waits for it; it used to wake at once
    for a round that found nothing (in a SQLite file shared with a consumer: two such rounds per
    message, a third of a core at 250 messages a second)."""
    rig = Rig()
    await _rig_with(rig, FailingStore(), rig.message(2, 10)).setup("orders")
    await rig.store.store(rig.message(1, 0))
    await rig.start()
    await rig.tick(0)
    assert rig.delivered() == ["m1"] and rig.dispatcher.stats.rounds == 1
    await rig.tick(10)
    assert rig.delivered() == ["m1", "m2"] and rig.dispatcher.stats.rounds == 2
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_due_time_told_mid_round_ends_the_wait_even_if_the_store_missed_it() -> None:
    rig = Rig()
    store = _LateToAnswer(hidden={"m2"})
    await _rig_with(rig, store, rig.message(2, 5)).setup("orders")
    await rig.store.store_many([rig.message(1, 0), rig.message(3, 60)])
    await rig.start()
    await rig.tick(0)
    assert rig.delivered() == ["m1"]
    await rig.tick(5)
    assert rig.delivered() == ["m1", "m2"]  # at 5 s, not at m3's 60 s
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


class _HeldSend(FlakyTransport):
    """Holds every send until ``go`` is set."""

    def __init__(self, inner: MemoryTransport) -> None:
        super().__init__(inner)
        self.go = asyncio.Event()

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        await self.go.wait()
        return await super().send_batch(messages)


class _CountsQuestions(FailingStore):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def next_due(self) -> datetime | None:
        self.asked += 1
        return await super().next_due()


class _AsksApart(_CountsQuestions):
    """A store that cannot read the next due time in its claim (no ``fetch_due_and_next``)."""

    fetch_due_and_next = None  # type: ignore[assignment]


async def _started_with_m1_due_now_and_m2_in_10_s(
    store: _CountsQuestions,
) -> tuple[Rig, _HeldSend]:
    """A dispatcher on ``store`` whose sends wait for ``go``, started with m1 due and m2 10 s on."""
    rig = Rig()
    transport = _HeldSend(rig.queues)
    rig.store, rig.transport = store, transport
    rig.dispatcher = Dispatcher(store, transport, rig.settings, endpoint="unit", clock=rig.clock)
    await rig.setup("orders")
    await store.store_many([rig.message(1, 0), rig.message(2, 10)])
    await rig.start()
    return rig, transport


async def test_the_next_due_time_is_read_in_the_claim_of_a_short_batch() -> None:
    """A store that reads it with the claim is not asked again: one call a round, not two."""
    store = _CountsQuestions()
    rig, transport = await _started_with_m1_due_now_and_m2_in_10_s(store)
    transport.go.set()
    await settle()
    assert rig.delivered() == ["m1"]
    await rig.tick(10)
    assert rig.delivered() == ["m1", "m2"] and store.asked == 0  # on time, and never asked apart
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_the_next_due_time_is_asked_while_a_short_batch_is_sent() -> None:
    """Where the claim cannot read it, the question the wait needs runs beside the send and
    removal, not after them."""
    store = _AsksApart()
    rig, transport = await _started_with_m1_due_now_and_m2_in_10_s(store)
    assert rig.delivered() == [] and store.asked == 1  # asked while m1 is being sent
    transport.go.set()
    await settle()
    assert rig.delivered() == ["m1"] and store.asked == 1  # and not again after it
    await rig.tick(10)
    assert rig.delivered() == ["m1", "m2"]  # m2 too: alone it would have waited until 10.009
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


class _OneBatchAtATime(_AsksApart):
    """A store that claims one batch at a time (SQLite's one writer): no claim beside a send."""

    parallel_claims = False


async def test_a_full_batch_asks_no_next_due_time() -> None:
    """After a full batch the next round claims at once: a question beside its send would be
    thrown away (and would hold a one-writer store's connection beside the removal). Only the
    short batch that follows asks."""
    rig = Rig(batch_size=2)
    store = _OneBatchAtATime()
    rig.store = store
    rig.build(store, rig.transport)
    await rig.setup("orders")
    await store.store_many([rig.message(1, 0), rig.message(2, 0), rig.message(3, 0), rig.message(4, 10)])
    await rig.start()
    await settle()
    assert rig.delivered() == ["m1", "m2", "m3"] and store.asked == 1  # the short batch's, only
    await rig.tick(10)
    assert rig.delivered() == ["m1", "m2", "m3", "m4"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_message_that_fails_is_not_left_to_an_answer_asked_before_it_failed() -> None:
    """Asked during the send, the next due time did not know m1 would be due again (a retry);
    that answer is dropped and the wait asks afresh."""
    rig = await Rig(number_of_retries=3, failure_backoff=timedelta(seconds=1)).setup("orders")
    rig.transport.fail = lambda m: TimeoutError("slow") if rig.transport.attempts == 1 else None
    await rig.store.store_many([rig.message(1, 0), rig.message(2, 3600)])
    await rig.start()
    await rig.tick(1, steps=3)
    assert rig.delivered() == ["m1"]  # again within seconds, not at m2's hour
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_every_sleep_is_capped() -> None:
    rig = await Rig(max_sleep=timedelta(seconds=60)).setup("orders")
    await rig.store.store(rig.message(1, 3600))
    await rig.start()
    rounds = rig.dispatcher.stats.rounds
    await rig.tick(60)
    assert rig.dispatcher.stats.rounds == rounds + 1  # woke after the cap, looked again
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_missing_destination_goes_to_the_error_queue_at_once_and_blocks_nobody() -> None:
    rig = await Rig(number_of_retries=5).setup("orders")
    await rig.store.store_many([rig.message(1, 0, "nowhere"), rig.message(2, 0)])
    await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m2"]
    [dead] = rig.queues.messages("error")
    assert dead.message_id == "m1"
    assert dead.headers[eq.ORIGINAL_DESTINATION] == "nowhere"
    assert "does not exist" in dead.headers[eq.ERROR_MESSAGE]
    assert await rig.store.get("m1") is None


async def test_retries_then_delivers() -> None:
    rig = await Rig(number_of_retries=2, failure_backoff=timedelta(0)).setup("orders")
    failures = iter([TimeoutError("slow"), TimeoutError("slow")])
    rig.transport.fail = lambda m: next(failures, None)
    await rig.store.store(rig.message(1, 0))
    stats = await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m1"]
    assert stats.retries == 2 and stats.forwarded == 1


async def test_exhausted_retries_send_the_message_to_the_error_queue_with_the_reason() -> None:
    rig = await Rig(number_of_retries=1, failure_backoff=timedelta(0)).setup("orders")
    rig.transport.fail = lambda m: ValueError("poison payload") if m.destination == "orders" else None
    await rig.store.store(rig.message(1, 0))
    await rig.dispatcher.run_burst()
    [dead] = rig.queues.messages("error")
    h = dead.headers
    assert h[eq.ERROR_TYPE] == "builtins.ValueError"
    assert h[eq.ERROR_MESSAGE] == "poison payload"
    assert "ValueError: poison payload" in h[eq.ERROR_STACKTRACE]
    assert h[eq.ERROR_ATTEMPTS] == "2"
    assert h[eq.ORIGINAL_DESTINATION] == "orders"
    assert h[eq.ERROR_TIME] == rig.clock.now().isoformat()
    assert await rig.store.get("m1") is None


async def test_default_is_no_retry() -> None:
    rig = await Rig(failure_backoff=timedelta(0)).setup("orders")
    rig.transport.fail = lambda m: ValueError("nope") if m.destination == "orders" else None
    await rig.store.store(rig.message(1, 0))
    await rig.dispatcher.run_burst()
    assert [m.headers[eq.ERROR_ATTEMPTS] for m in rig.queues.messages("error")] == ["1"]


async def test_fetch_breaker_trips_after_30_seconds_of_failures() -> None:
    rig = await Rig().setup("orders")
    rig.store.fail_fetch = True
    await rig.start()
    await rig.tick(1, steps=29)
    assert rig.criticals == [] and not rig.task.done()  # type: ignore[union-attr]
    await rig.tick(1, steps=2)
    assert len(rig.criticals) == 1
    assert "fetch due delayed messages" in str(rig.criticals[0])
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]


async def test_fetch_breaker_disarms_when_the_store_comes_back() -> None:
    rig = await Rig().setup("orders")
    rig.store.fail_fetch = True
    await rig.start()
    await rig.tick(1, steps=20)
    rig.store.fail_fetch = False
    await rig.store.store(rig.message(1, 0))
    await rig.tick(1, steps=3)
    assert rig.delivered() == ["m1"]
    assert not rig.dispatcher.fetch_breaker.armed
    rig.store.fail_fetch = True
    await rig.tick(1, steps=20)
    assert rig.criticals == []
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_dispatch_breaker_trips_when_the_transport_stays_down() -> None:
    rig = await Rig(number_of_retries=1_000_000).setup("orders")
    rig.transport.down = ConnectionError("broker unreachable")
    await rig.store.store(rig.message(1, 0))
    await rig.start()
    await rig.tick(1, steps=31)
    assert len(rig.criticals) == 1
    assert "dispatch delayed messages" in str(rig.criticals[0])
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]
    assert await rig.store.get("m1") is not None  # nothing lost


async def test_recovery_breaker_trips_on_more_than_one_recovery_failure_per_second() -> None:
    rig = await Rig(number_of_retries=5, failure_backoff=timedelta(0)).setup("orders")
    rig.transport.fail = lambda m: ValueError("bad")
    rig.store.fail_increment = True
    await rig.store.store_many([rig.message(1, 0), rig.message(2, 0)])
    with pytest.raises(CriticalError, match="error handling"):
        await rig.dispatcher.run_burst()
    assert len(rig.criticals) == 1
    assert await rig.store.get("m1") is not None


async def test_front_door_outage_raises_seed_002s_critical_error_after_two_minutes() -> None:
    from duetime.nservicebus.frontdoor import OUTAGE_MESSAGE, FrontDoor, envelope_headers

    rig = await Rig().setup("orders")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()
    envelope = rig.message(7, 5).with_changes(
        destination="unit.Timeouts", headers=envelope_headers("orders", rig.clock.now())
    )
    await rig.queues.send_batch([envelope])
    rig.store.fail_store = True
    task = asyncio.create_task(door.process_once())
    for _ in range(60):  # well past the 30 s store breaker: the timeout manager waits 2 minutes
        await rig.tick(1)
    assert not rig.dispatcher.stopping and door.outage_breaker.armed
    for _ in range(61):
        await rig.tick(1)
    await task
    assert len(rig.criticals) == 0  # the breaker only records; the dispatcher reports
    assert rig.dispatcher.stopping
    with pytest.raises(CriticalError) as raised:
        await rig.dispatcher.run_burst()
    assert str(raised.value).startswith(
        "Repeated failures when fetching timeouts from storage, endpoint will be terminated."
    )
    assert OUTAGE_MESSAGE in str(rig.criticals[0]) and "cannot store" in str(rig.criticals[0])
    assert rig.queues.messages("unit.Timeouts") == []  # received, not acknowledged: comes back


async def test_front_door_outage_wait_is_configurable() -> None:
    from duetime.nservicebus.frontdoor import FrontDoor

    rig = await Rig(
        time_to_wait_before_triggering_critical_error_on_timeout_outages=timedelta(seconds=5)
    ).setup("orders")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    assert door.outage_breaker.time_to_trigger == 5


async def test_store_breaker_trips_when_forwarded_messages_cannot_be_removed() -> None:
    rig = await Rig(claim_timeout=timedelta(seconds=5)).setup("orders")
    rig.store.fail_remove = True
    await rig.store.store(rig.message(1, 0))
    await rig.start()
    await rig.tick(1, steps=29)
    assert rig.criticals == [] and rig.dispatcher.store_breaker.armed
    await rig.tick(1, steps=8)
    assert len(rig.criticals) == 1
    assert "store the outcome" in str(rig.criticals[0])
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]
    assert await rig.store.get("m1") is not None  # still stored: it goes again (at-least-once)


async def test_critical_error_callback_failing_still_stops_with_the_error() -> None:
    rig = await Rig().setup("orders")

    def broken(_: CriticalError) -> None:
        raise RuntimeError("callback bug")

    rig.dispatcher._on_critical_error = broken
    rig.store.fail_fetch = True
    await rig.start()
    await rig.tick(1, steps=31)
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]


async def test_async_critical_error_callback_is_awaited() -> None:
    rig = await Rig().setup("orders")
    seen: list[str] = []

    async def callback(error: CriticalError) -> None:
        await asyncio.sleep(0)
        seen.append(str(error))

    rig.dispatcher._on_critical_error = callback
    rig.store.fail_fetch = True
    await rig.start()
    await rig.tick(1, steps=31)
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]
    assert len(seen) == 1


async def test_stop_finishes_the_batch_in_flight() -> None:
    rig = await Rig().setup("orders")
    await rig.store.store_many([rig.message(i, 0) for i in range(10)])
    gate = asyncio.Event()
    original = rig.queues.send_batch

    async def slow_send(batch):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await original(batch)

    rig.transport.inner.send_batch = slow_send  # type: ignore[method-assign]
    await rig.start()
    rig.dispatcher.stop()
    gate.set()
    await rig.task  # type: ignore[misc]
    assert len(rig.delivered()) == 10


async def test_exactly_once_is_refused_when_the_transport_cannot_share_the_transaction(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore

    store = SqliteStore.from_url(f"sqlite:///{tmp_path}/a.db")
    await store.setup_infrastructure("duetime")
    settings = DelayedDeliverySettings(transaction_mode="exactly-once")  # type: ignore[arg-type]
    for transport in (MemoryTransport(), SqliteQueueTransport(tmp_path / "b.db")):
        with pytest.raises(UnsupportedTransactionMode, match="at-least-once"):
            await Dispatcher(store, transport, settings).start()
        await transport.close()
    shared = SqliteQueueTransport(tmp_path / "a.db")
    await Dispatcher(store, shared, settings).start()
    await shared.close()
    await store.close()


async def test_exactly_once_with_memory_moves_and_dead_letters() -> None:
    store, transport = MemoryStore(), MemoryTransport()
    await store.setup_infrastructure("duetime")
    await transport.declare("orders")
    d = Dispatcher(store, transport, DelayedDeliverySettings(transaction_mode="exactly-once"))  # type: ignore[arg-type]
    from datetime import UTC, datetime

    from duetime import DelayedMessage

    now = datetime.now(UTC)
    await store.initialize("duetime", d.settings.transaction_mode)  # stores refuse writes before this
    await store.store_many([DelayedMessage("a", "orders", now), DelayedMessage("b", "void", now)])
    stats = await d.run_burst()
    assert (stats.forwarded, stats.dead_lettered) == (1, 1)
    assert [m.message_id for m in transport.messages("error")] == ["b"]


async def test_exactly_once_moves_grow_while_a_backlog_lasts_and_start_small_again() -> None:
    """Each move is one commit (a disk flush on SQLite): a backlog goes in doubling moves up to
    four batches; the first move after it is a batch again."""
    from datetime import UTC, datetime

    from duetime import DelayedMessage
    from duetime.engine.observe import DispatchObserver
    from duetime.engine.strategies import MOVE_GROWTH

    class Sizes(DispatchObserver):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def batch(self, size: int, seconds: float) -> None:
            self.sizes.append(size)

    store, transport, sizes = MemoryStore(), MemoryTransport(), Sizes()
    await store.setup_infrastructure("duetime")
    await transport.declare("orders")
    settings = DelayedDeliverySettings(transaction_mode="exactly-once", batch_size=2)  # type: ignore[arg-type]
    d = Dispatcher(store, transport, settings, observer=sizes)
    await store.initialize("duetime", settings.transaction_mode)
    now = datetime.now(UTC)
    await store.store_many([DelayedMessage(f"a{i}", "orders", now) for i in range(40)])
    await d.run_burst()
    assert MOVE_GROWTH == 4 and sizes.sizes == [2, 4, 8, 8, 8, 8, 2]
    await store.store_many([DelayedMessage(f"b{i}", "orders", now) for i in range(3)])
    await d.run_burst()
    assert sizes.sizes[7:] == [2, 1]
    assert len(transport.messages("orders")) == 43


async def test_dispatcher_rejects_urls_in_place_of_backends() -> None:
    from duetime import ConfigurationError

    with pytest.raises(ConfigurationError, match="open_store"):
        Dispatcher("sqlite:///x.db", MemoryTransport())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="open_transport"):
        Dispatcher(MemoryStore(), "memory://")  # type: ignore[arg-type]


async def test_front_door_survives_a_queue_that_cannot_be_read() -> None:
    from duetime.nservicebus.frontdoor import FrontDoor

    rig = await Rig().setup("orders")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)

    async def broken(*_: object) -> list[object]:
        raise ConnectionError("queue unreachable")

    rig.queues.receive = broken  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(door.process_once())
    await settle()
    await rig.tick(1)
    assert await task == 0
    assert door.outage_breaker.armed and not rig.dispatcher.stopping


async def test_a_front_door_outage_is_logged_once_a_minute_and_its_end_disarms_the_breaker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker down for two minutes: three warnings (at once, then each minute), not one a second;
    once the queue answers, the breaker is disarmed even if nothing arrives (armed, it would turn
    the next single failure, hours later, into a critical error)."""
    import logging

    from duetime.nservicebus.frontdoor import FrontDoor

    rig = await Rig(failure_backoff=timedelta(seconds=1)).setup("orders")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    working = rig.queues.receive

    async def broken(*_: object) -> list[object]:
        raise ConnectionError("queue unreachable")

    rig.queues.receive = broken  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.DEBUG, "duetime.frontdoor"):
        for _ in range(120):
            task = asyncio.create_task(door.process_once())
            await settle()
            await rig.tick(1)
            await task
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert 2 <= len(warnings) <= 3, warnings  # not 120
        assert "failed attempts so far" in warnings[-1] and "nothing is lost" in warnings[-1]
        assert door.outage_breaker.armed
        rig.queues.receive = working  # type: ignore[method-assign]
        assert await door.process_once() == 0
    assert not door.outage_breaker.armed
    assert "the queue works again after 120 failed attempt(s)" in caplog.text, caplog.text[-300:]


async def test_a_batch_claimed_ahead_is_given_back_on_stop() -> None:
    rig = await Rig(batch_size=10).setup("orders")
    await rig.store.store_many([rig.message(i, 0) for i in range(25)])
    gate = asyncio.Event()
    original = rig.queues.send_batch

    async def slow_send(batch):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await original(batch)

    rig.transport.inner.send_batch = slow_send  # type: ignore[method-assign]
    await rig.start()  # first batch of 10 in flight, the next 10 claimed ahead
    assert (await rig.store.counts(rig.clock.now())).claimed == 20
    rig.dispatcher.stop()
    gate.set()
    await rig.task  # type: ignore[misc]
    assert len(rig.delivered()) == 10
    counts = await rig.store.counts(rig.clock.now())
    assert (counts.total, counts.claimed) == (15, 0)  # nothing left claimed, nothing lost


async def test_claiming_ahead_keeps_the_order_and_loses_nothing() -> None:
    rig = await Rig(batch_size=7).setup("orders")
    await rig.store.store_many([rig.message(i, -1 + i / 1000) for i in range(50)])
    await rig.dispatcher.run_burst()
    assert rig.delivered() == [f"m{i}" for i in range(50)]


async def test_front_door_rejects_an_envelope_whose_own_id_is_unusable() -> None:
    from duetime.nservicebus.frontdoor import FrontDoor

    rig = await Rig().setup("orders")
    await rig.dispatcher.start()  # declares the error queue
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()
    from duetime.interfaces import ReceivedMessage

    with rig.queues.lock:  # a broker message without a message id (RabbitMQ gives "")
        routing = {"duetime-route-to": "orders", "duetime-deliver-at": "2030-01-01T00:00:00+00:00"}
        envelope = ReceivedMessage("unit.Timeouts", "", routing, b"?", "k", 0)
        rig.queues._queues["unit.Timeouts"]["k"] = envelope
    assert await door.process_once() == 1
    [dead] = rig.queues.messages("error")
    assert dead.message_id and dead.headers["duetime-error-original-message-id"] == ""
    assert "message_id" in dead.headers["duetime-error-message"]
    assert rig.queues.messages("unit.Timeouts") == []


async def test_front_door_survives_an_error_queue_that_cannot_be_written() -> None:
    from duetime.nservicebus.frontdoor import FrontDoor

    rig = await Rig().setup("orders")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()
    malformed = rig.message(1, 0).with_changes(destination="unit.Timeouts", headers={"x": "no routing"})
    await rig.queues.send_batch([malformed])
    rig.transport.down = ConnectionError("broker gone")  # the error queue is on the same broker
    assert await door.process_once() == 1  # no crash
    assert door.rejected == 0 and rig.queues.messages("error") == []
    assert len(rig.queues._in_flight) == 1  # not acknowledged: the broker gives it back
    assert not rig.dispatcher.recovery_breaker.tripped  # one failure: counted, not yet critical


async def test_a_failing_delivery_log_costs_a_warning_never_a_message() -> None:
    from duetime.observability.deliverylog import Delivery

    class BrokenLog:
        def __init__(self) -> None:
            self.calls = 0

        async def record(self, entries: Sequence[Delivery]) -> None:
            self.calls += 1
            raise ConnectionError("log database down")

        async def close(self) -> None:
            return None

    rig = await Rig().setup("orders")
    broken = BrokenLog()
    rig.dispatcher.delivery_log = broken
    await rig.store.store(rig.message(1, 0))
    await rig.dispatcher.run_burst()
    assert rig.delivered() == ["m1"] and broken.calls == 1
    assert await rig.store.get("m1") is None  # removed before the log was tried


async def test_a_transport_down_is_one_outage_nothing_counted_nothing_dead_lettered() -> None:
    """Default settings (no retries): a send_batch that raises as a whole leaves the messages in
    the store untouched, fills no error queue, and trips only after the dispatch breaker's time."""
    rig = await Rig().setup("orders", "error")
    rig.transport.down = ConnectionError("broker unreachable")
    await rig.store.store_many([rig.message(1, 0), rig.message(2, 0)])
    await rig.start()
    await rig.tick(1, steps=29)
    assert rig.criticals == [] and rig.dispatcher.dispatch_breaker.armed
    assert rig.queues.messages("error") == [] and rig.dispatcher.stats.dead_lettered == 0
    assert [(await rig.store.get(f"m{i}")).failure_count for i in (1, 2)] == [0, 0]  # type: ignore[union-attr]
    assert rig.dispatcher.stats.outages > 1
    await rig.tick(1, steps=3)
    assert len(rig.criticals) == 1 and "dispatch delayed messages" in str(rig.criticals[0])
    with pytest.raises(CriticalError):
        await rig.task  # type: ignore[misc]
    assert rig.queues.messages("error") == []


async def test_a_transport_whose_disk_is_full_is_said_so_not_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`run` said "transport unreachable" for a SQLite queue on a full disk."""
    from duetime.errors import StorageFull

    rig = await Rig().setup("orders", "error")
    rig.transport.down = StorageFull("The disk holding the SQLite file q.db is full")
    await rig.store.store_many([rig.message(1, 0)])
    await rig.start()
    await rig.tick(1, steps=2)
    said = [r.getMessage() for r in caplog.records if r.name == "duetime.dispatcher"]
    assert any(
        m.startswith("transport full (it cannot write) while sending") and "The disk holding" in m
        for m in said
    )
    assert not any("unreachable" in m for m in said)
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_front_door_sends_a_message_the_store_refuses_to_the_error_queue() -> None:
    """A store refusing one message for what it holds costs that message, not the batch, and is
    not an outage; the rest is stored and acknowledged."""
    from duetime.nservicebus.frontdoor import FrontDoor, envelope_headers

    class PickyStore(FailingStore):
        async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
            if any(m.message_id == "m2" for m in messages):
                raise ValueError("the store cannot hold this value")
            return await super().store_many(messages)

    rig = await Rig().setup("orders", "error")
    rig.store = PickyStore()
    await rig.store.setup_infrastructure("unit")
    rig.build(rig.store, rig.transport)
    await rig.dispatcher.start()
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()
    envelopes = [
        rig.message(i, 60).with_changes(
            destination="unit.Timeouts", headers=envelope_headers("orders", rig.clock.now())
        )
        for i in (1, 2, 3)
    ]
    await rig.queues.send_batch(envelopes)
    assert await door.process_once() == 3
    assert [await rig.store.get(f"m{i}") is not None for i in (1, 2, 3)] == [True, False, True]
    [dead] = rig.queues.messages("error")
    assert dead.message_id == "m2" and "cannot hold this value" in dead.headers["duetime-error-message"]
    assert len(rig.queues._in_flight) == 2  # the stored two: acknowledged with the next receive
    assert await door.process_once() == 0
    assert rig.queues.messages("unit.Timeouts") == [] and not rig.queues._in_flight  # all acknowledged
    assert not door.outage_breaker.armed and door.stored == 2 and door.rejected == 1


async def test_a_summary_line_each_interval_while_working_and_none_while_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    rig = await Rig(summary_interval=timedelta(seconds=10)).setup("orders")
    await rig.store.store_many([rig.message(1, 1), rig.message(2, 2), rig.message(3, 40)])
    caplog.set_level(logging.INFO, logger="duetime")
    await rig.start()
    await rig.tick(1)
    await rig.tick(1)  # m1 on time, m2 on time
    await rig.tick(10)  # the next round after 10 s says what happened
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("last ")]
    assert len(lines) == 1
    assert lines[0].startswith("last 12 s: forwarded 2, dead-lettered 0, retried 0, outages 0")
    assert "lateness p50 under 1.0 ms, p99 under 1.0 ms" in lines[0]
    assert "backlog 1 stored, 0 due, 0 in flight" in lines[0]
    from duetime.observability.logs import JsonFormatter

    record = next(r for r in caplog.records if r.getMessage().startswith("last "))
    as_json = json.loads(JsonFormatter().format(record))
    assert (as_json["forwarded"], as_json["stored"], as_json["lateness_p99_ms"]) == (2, 1, 1.0)
    await rig.tick(15)  # nothing forwarded since: no line
    assert len([r for r in caplog.records if r.getMessage().startswith("last ")]) == 1
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


def test_lateness_quantiles_come_from_log_buckets() -> None:
    from duetime.engine.summary import LatenessHistogram

    h = LatenessHistogram()
    assert h.quantile(0.99) is None
    h.add([0.0005] * 98 + [0.020, 7200.0])
    assert h.quantile(0.5) == 0.001
    assert 0.020 <= (h.quantile(0.99) or 0) < 0.026
    assert h.quantile(1.0) == float("inf")


async def test_front_door_speaks_the_timeout_managers_headers() -> None:
    """N6: destination from RouteExpiredTimeoutTo, else ReplyToAddress; SagaId is the group;
    ClearTimeouts removes the saga's timeouts; one without a saga id, or without Expire, is an error."""
    from duetime.nservicebus.frontdoor import FrontDoor
    from duetime.nservicebus_wire import to_wire

    rig = await Rig().setup("orders", "replies", "error")
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()
    later = to_wire(rig.clock.now() + timedelta(hours=1))
    saga = "5d1a0f0e-0000-4000-8000-000000000001"

    def envelope(i: int, headers: dict[str, str]) -> DelayedMessage:
        return rig.message(i, 0).with_changes(destination="unit.Timeouts", headers=headers)

    await rig.queues.send_batch(
        [
            envelope(1, {"NServiceBus.Timeout.Expire": later, "NServiceBus.ReplyToAddress": "replies"}),
            envelope(
                2,
                {
                    "NServiceBus.Timeout.Expire": later,
                    "NServiceBus.Timeout.RouteExpiredTimeoutTo": "orders",
                    "NServiceBus.ReplyToAddress": "replies",
                    "NServiceBus.SagaId": saga,
                },
            ),
            envelope(3, {"NServiceBus.ReplyToAddress": "replies"}),  # not a timeout
            envelope(4, {"NServiceBus.ClearTimeouts": "True"}),  # no saga id
        ]
    )
    assert await door.process_once() == 4
    first, second = await rig.store.get("m1"), await rig.store.get("m2")
    assert first is not None and first.destination == "replies" and first.group is None
    assert second is not None and second.destination == "orders" and second.group == saga
    assert (
        second.headers["NServiceBus.Timeout.RouteExpiredTimeoutTo"] == "orders"
    )  # kept, as NServiceBus keeps it
    reasons = {m.message_id: m.headers["duetime-error-message"] for m in rig.queues.messages("error")}
    assert "not a delayed message" in reasons["m3"] and "without a saga id" in reasons["m4"]
    await rig.queues.send_batch(
        [
            envelope(
                5,
                {
                    "NServiceBus.ClearTimeouts": "True",
                    "NServiceBus.SagaId": saga,
                    "NServiceBus.ControlMessage": "True",
                },
            )
        ]
    )
    assert await door.process_once() == 1
    assert await rig.store.get("m2") is None and await rig.store.get("m1") is not None
    assert door.cleared == 1 and rig.queues.messages("unit.Timeouts") == []


class _DropsOn(FlakyTransport):
    """A broker that closes the connection on a poison body: that message and every one after it
    in the batch come back "unavailable", and the connection stays dead until ``start()``; with
    ``outage`` set, ``start()`` fails too (the broker went away for good)."""

    def __init__(self, inner: MemoryTransport) -> None:
        super().__init__(inner)
        self.connected = True
        self.outage = False
        self.sent: dict[str, int] = {}

    async def start(self) -> None:
        if self.outage:
            raise ConnectionError("connection refused")
        self.connected = True

    async def declare(self, queue: str) -> None:
        await self.start()
        await self.inner.declare(queue)

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        from duetime.errors import TransportUnavailable

        if not self.connected:
            raise TransportUnavailable("the connection was lost; reconnecting")
        results: list[Exception | None] = []
        for m in messages:
            self.sent[m.message_id] = self.sent.get(m.message_id, 0) + 1
            if m.body == b"poison" or self.outage:
                self.connected = False
            if not self.connected:
                results.append(TransportUnavailable("connection closed by the broker"))
            else:
                results.extend(await self.inner.send_batch([m]))
        return results


def _with_body(m: DelayedMessage, body: bytes) -> DelayedMessage:
    return m.with_changes(body=body)


@pytest.mark.parametrize("size", [1, 2, 7])
async def test_a_message_that_drops_the_connection_is_found_and_fails_alone(size: int) -> None:
    """No check saw it coming: the broker closes the connection on one message. What the batch
    lost goes again one at a time until that message has dropped it twice alone; every other message is delivered once,
    no breaker counts anything, and the message stays stored aside with a notice in the error
    queue (the error queue, on the same broker, cannot carry it either)."""
    rig = await Rig().setup("orders", "error")
    rig.build(rig.store, dropping := _DropsOn(rig.queues))
    poison = size // 2
    await rig.store.store_many(
        [_with_body(rig.message(i, 0), b"poison" if i == poison else b"b") for i in range(size)]
    )
    stats = await rig.dispatcher.run_burst()
    others = [f"m{i}" for i in range(size) if i != poison]
    assert sorted(rig.delivered()) == others and stats.forwarded == size - 1  # once each
    assert all(dropping.sent[i] <= 2 for i in others), dropping.sent  # once more at most
    kept = await rig.store.get(f"m{poison}")
    assert kept is not None and kept.failure_count == 1 and kept.body == b"poison"
    assert kept.due_at >= rig.clock.now() + timedelta(minutes=59)
    (notice,) = rig.queues.messages("error")
    assert notice.message_id == f"m{poison}" and eq.kept_in_store(notice.headers)
    assert "dropped its connection each time" in notice.headers[eq.ERROR_MESSAGE]
    assert stats.outages == 0 and not rig.dispatcher.dispatch_breaker.armed


async def test_a_connection_lost_mid_batch_to_an_outage_blames_no_message() -> None:
    """The broker goes away mid-batch and does not come back: an outage, nothing split or blamed."""
    rig = await Rig().setup("orders", "error")
    rig.build(rig.store, dropping := _DropsOn(rig.queues))
    await rig.store.store_many([rig.message(i, 0) for i in range(4)])

    async def goes_away(messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        dropping.outage = True
        return await _DropsOn.send_batch(dropping, messages)

    dropping.send_batch = goes_away  # type: ignore[method-assign]
    await rig.start()
    stats = rig.dispatcher.stats
    assert stats.forwarded == 0 and stats.outages == 1 and rig.queues.messages("error") == []
    assert [(await rig.store.get(f"m{i}")).failure_count for i in range(4)] == [0] * 4  # type: ignore[union-attr]
    assert sum(dropping.sent.values()) == 4  # sent once, not split: the broker did not answer again
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_destination_that_cannot_take_messages_now_blames_no_message() -> None:
    """A broker that answers but refuses every publish for a while (a RabbitMQ quorum queue
    electing its leader nacks them): one outage, the messages stay stored unblamed and go once
    the destination takes them again; none is sent alone to find a culprit."""
    from duetime.errors import DestinationUnavailable

    rig = await Rig().setup("orders", "error")
    refusing = _DropsOn(rig.queues)
    rig.build(rig.store, refusing)
    await rig.store.store_many([rig.message(i, 0) for i in range(4)])
    calls: list[int] = []

    async def nacks(messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        calls.append(len(messages))
        if len(calls) == 1:
            return [DestinationUnavailable("nack: the queue has no leader yet") for _ in messages]
        return await _DropsOn.send_batch(refusing, messages)

    refusing.send_batch = nacks  # type: ignore[method-assign]
    await rig.start()
    await rig.tick(6, steps=6)  # the back-off after the outage
    assert calls[0] == 4 and 1 not in calls[:2], calls  # never split to find a culprit
    assert sorted(rig.delivered()) == [f"m{i}" for i in range(4)] and rig.queues.messages("error") == []
    assert rig.dispatcher.stats.outages == 1
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_a_lateness_budget_takes_what_comes_due_within_it_in_one_round_and_nothing_early() -> None:
    """Woken the budget after the first is due, one round takes both; the third, due after
    that, waits for its own round."""
    rig = await Rig(lateness_budget=timedelta(milliseconds=5), claim_window=timedelta(0)).setup("orders")
    await rig.store.store_many([rig.message(1, 10), rig.message(2, 10.004), rig.message(3, 10.006)])
    await rig.start()
    await rig.tick(10.004)
    assert rig.delivered() == []  # not before the budget has passed
    await rig.tick(0.0015)
    assert rig.delivered() == ["m1", "m2"]  # m2 too: alone it would have waited until 10.009
    await rig.tick(0.010)
    assert rig.delivered() == ["m1", "m2", "m3"]
    rig.dispatcher.stop()
    await rig.task  # type: ignore[misc]


async def test_front_door_acknowledges_what_it_stored_with_its_next_receive_or_at_its_stop() -> None:
    """One call a batch: what a batch stored goes as ``done=`` with the queue's next receive (on
    the SQL queues, in the same statement); what waits for a receive that will not come is
    acknowledged when the front door finishes."""
    from duetime.interfaces import ReceivedMessage
    from duetime.nservicebus.frontdoor import FrontDoor, envelope_headers

    rig = await Rig().setup("orders", "error")
    await rig.dispatcher.start()
    calls: list[list[str]] = []
    receive = rig.queues.receive

    async def recording(
        queue: str, n: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        calls.append([m.message_id for m in done])
        return await receive(queue, n, wait, done=done)

    rig.queues.receive = recording  # type: ignore[method-assign]
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await door.start()

    def envelope(i: int) -> DelayedMessage:
        headers = envelope_headers("orders", rig.clock.now())
        return rig.message(i, 60).with_changes(destination="unit.Timeouts", headers=headers)

    await rig.queues.send_batch([envelope(1), envelope(2)])
    assert await door.process_once() == 2
    assert len(rig.queues._in_flight) == 2  # stored, not acknowledged yet
    await rig.queues.send_batch([envelope(3)])
    assert await door.process_once() == 1
    assert calls[-1] == ["m1", "m2"]  # acknowledged by the receive that took m3
    await door.finish()
    assert not rig.queues._in_flight and rig.queues.messages("unit.Timeouts") == []
    assert [await rig.store.get(f"m{i}") is not None for i in (1, 2, 3)] == [True, True, True]


async def test_the_front_door_stores_nothing_before_the_dispatcher_has_started() -> None:
    """Stored before the store is bound to the endpoint, every store refuses: an envelope waiting
    at the start was counted as a storage outage. The front door waits for the start."""
    from duetime.nservicebus.frontdoor import FrontDoor, envelope_headers

    rig = Rig()
    door = FrontDoor(rig.dispatcher, rig.queues, wait=0)
    await rig.queues.declare("orders")
    await rig.queues.declare(door.queue)
    envelope = rig.message(7, 5).with_changes(
        destination=door.queue, headers=envelope_headers("orders", rig.clock.now())
    )
    await rig.queues.send_batch([envelope])
    serving = asyncio.create_task(door.run())
    await settle()
    assert (door.stored, door.outage_breaker.armed) == (0, False)
    await rig.setup()
    await rig.start()
    await rig.tick(0.05, steps=3)
    assert door.stored == 1 and not door.outage_breaker.armed
    assert rig.delivered("orders") == ["m7"]  # stored, then due at once: delivered
    rig.dispatcher.stop()
    await rig.tick(1, steps=3)
    await asyncio.wait_for(serving, 5)
    assert rig.task is not None
    await rig.task
