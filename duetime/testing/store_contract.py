"""The store contract: every store (memory fake included) subclasses this suite."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from duetime.api_keys import ApiKey, Scope, new_key
from duetime.audit import Action, Actor, AuditEntry, AuditQuery, Via, made
from duetime.backends import ROUND_LIMIT, AsyncStoreBridge, StoreRules
from duetime.encryption import Keyring, Sealer, sealed_problem, sealed_with
from duetime.errors import (
    ApiKeyExists,
    ConfigurationError,
    DuplicateMessageId,
    InvalidMessage,
    InvalidSchedule,
    MessageInFlight,
    ScheduleExists,
    ScheduleNotFound,
    StoreNotReady,
    WebhookExists,
)
from duetime.interfaces import (
    ApiKeyStore,
    AuditStore,
    Claimed,
    ClaimsWithNextDue,
    DelayedMessageStore,
    DispatcherRegistry,
    DueCounter,
    FlowControlStore,
    IfExists,
    ListQuery,
    NewOnlyStore,
    Put,
    RecurringStore,
    ReplacingStore,
    RetryingStore,
    SealingStore,
    ServerClock,
    SyncDelayedMessageStore,
    WebhookStore,
)
from duetime.limits import Limit, Pause, Rate
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import MAX_BODY_BYTES, MAX_HEADERS_BYTES, DelayedMessage
from duetime.recurring.rules import Recurrence
from duetime.recurring.schedule import ScheduleRow, group_of, new_schedule
from duetime.settings import TransactionMode
from duetime.webhooks import WebhookEndpoint, new_secret

ENDPOINT = "contract"


def now() -> datetime:
    return datetime.now(UTC)


async def ticks_of(store: DelayedMessageStore, schedule_id: str) -> list[DelayedMessage]:
    """The stored ticks of a schedule, in due order."""
    found: list[DelayedMessage] = []
    after = None
    while True:
        page = await store.list(ListQuery(group=group_of(schedule_id), limit=500, after=after))
        found += page.messages
        if page.next_cursor is None:
            return found
        after = page.next_cursor


def msg(i: int, due: datetime, destination: str = "orders", **kw: object) -> DelayedMessage:
    return DelayedMessage(f"m-{i:05d}", destination, due, f"body {i}".encode(), {"n": str(i)}, **kw)  # type: ignore[arg-type]


def _rules_of(store: object) -> StoreRules:
    """The blocking rules under ``store``, for a case that writes a row as another host's duetime
    wrote it (through the primitive, past the rules' own checks)."""
    inner = store.sync if isinstance(store, (SyncSide, AsyncStoreBridge)) else store
    assert isinstance(inner, StoreRules), "this case writes a schedule row through StoreRules' primitive"
    return inner


class SyncSide:
    """The async contract driven straight through a blocking store's own methods (no thread,
    no bridge), so every rule is proven on the sync side as well."""

    def __init__(self, sync: SyncDelayedMessageStore) -> None:
        self.sync = sync
        # Each of the store's methods is an attribute of this object, not only an answer of
        # __getattr__: since Python 3.12 isinstance() against a Protocol looks attributes up
        # statically, so a capability the blocking store has must be found here the same way.
        # (Looked up statically too: reading a property here could raise before initialize.)
        for name in dir(sync):
            if name.startswith("__") or hasattr(SyncSide, name):
                continue
            if callable(inspect.getattr_static(sync, name)):
                self.__dict__[name] = self._awaitable(getattr(sync, name))

    @staticmethod
    def _awaitable(method: Callable[..., object]) -> Callable[..., Awaitable[object]]:
        async def call(*args: object, **options: object) -> object:
            return method(*args, **options)

        return call

    def __getattr__(self, name: str) -> Callable[..., Awaitable[object]]:
        return self._awaitable(getattr(self.sync, name))

    def subscribe(self, callback: object) -> Callable[[], None]:
        return lambda: None


class StoreContract:
    """Subclasses provide ``make_store`` (async) and ``make_sync_store`` over the same storage;
    every test runs on both sides."""

    claim_timeout = timedelta(seconds=30)
    #: Whether the store reads the next due time in a short claim's own call (an optional
    #: capability: without it the dispatcher asks apart); True makes the contract require it.
    next_due_in_claim = False

    @pytest.fixture
    def make_store(self) -> Callable[[], DelayedMessageStore]:
        raise NotImplementedError

    @pytest.fixture
    def make_sync_store(self) -> Callable[[], SyncDelayedMessageStore]:
        raise NotImplementedError

    @pytest.fixture(params=["async", "sync"])
    def make_either(
        self,
        request: pytest.FixtureRequest,
        make_store: Callable[[], DelayedMessageStore],
        make_sync_store: Callable[[], SyncDelayedMessageStore],
    ) -> Callable[[], DelayedMessageStore]:
        if request.param == "async":
            return make_store
        return lambda: cast(DelayedMessageStore, SyncSide(make_sync_store()))

    @pytest.fixture
    async def store(
        self, make_either: Callable[[], DelayedMessageStore]
    ) -> AsyncIterator[DelayedMessageStore]:
        s = make_either()
        await s.setup_infrastructure(ENDPOINT)
        await s.setup_infrastructure(ENDPOINT)  # idempotent
        await s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        yield s
        await s.close()

    async def test_initialize_before_setup_says_what_to_do(
        self, make_either: Callable[[], DelayedMessageStore]
    ) -> None:
        s = make_either()
        with pytest.raises(StoreNotReady, match="setup"):
            await s.initialize("never-set-up", TransactionMode.AT_LEAST_ONCE)
        await s.close()

    async def test_a_closed_store_says_so_and_closing_twice_is_harmless(
        self, make_either: Callable[[], DelayedMessageStore]
    ) -> None:
        """Not the driver's words about a closed pool or connection, nor the executor's "cannot
        schedule new futures after shutdown" (nor, on Redis, a silent reconnect)."""
        s = make_either()
        await s.setup_infrastructure(ENDPOINT)
        await s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        await s.close()
        for call in (
            lambda: s.store(msg(1, now())),
            lambda: s.get("m-00001"),
            lambda: s.fetch_due(now(), 10),
            lambda: s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE),
        ):
            with pytest.raises(StoreNotReady, match="The store is closed"):
                await call()
        await s.close()

    async def test_an_endpoint_name_as_long_as_allowed_is_set_up_and_used(
        self, make_either: Callable[[], DelayedMessageStore]
    ) -> None:
        """Endpoint names may be 100 characters: longer than a PostgreSQL (63 bytes) or MariaDB
        (64) table name may be. Each of two that differ only at the end is set up (and a
        second set-up finds it there), stores and reads back its message."""
        opened: list[DelayedMessageStore] = []
        try:
            for i, name in enumerate(["e" * 99 + "1", "e" * 99 + "2"]):
                opened.append(s := make_either())
                await s.setup_infrastructure(name)
                await s.setup_infrastructure(name)
                await s.initialize(name, TransactionMode.AT_LEAST_ONCE)
                await s.store(msg(i, now() + timedelta(hours=1)))
                found = await s.get(f"m-{i:05d}")
                assert found is not None and found.body == f"body {i}".encode()
        finally:
            for s in opened:  # a store of one's own may hand out one object: closed at the end
                await s.close()

    async def test_round_trip_keeps_every_field_exactly(self, store: DelayedMessageStore) -> None:
        due = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
        original = DelayedMessage("id/ü", "dest.é", due, b"\x00\x01\xffbody", {"k": "v", "ü": "ß"})
        await store.store(original)
        got = await store.get("id/ü")
        assert got == original
        assert got is not None and got.due_at.tzinfo is not None
        assert await store.get("missing") is None

    async def test_duplicate_id_is_rejected_and_never_overwrites(self, store: DelayedMessageStore) -> None:
        first = msg(1, now())
        await store.store(first)
        with pytest.raises(DuplicateMessageId, match="m-00001"):
            await store.store(first.with_changes(body=b"other"))
        with pytest.raises(DuplicateMessageId):
            await store.store_many([msg(2, now()), msg(1, now())])
        assert await store.get("m-00002") is None  # all or nothing
        assert (await store.get("m-00001")) == first

    async def test_a_round_and_a_bulk_load_keep_every_field_and_are_all_or_nothing(
        self, store: DelayedMessageStore
    ) -> None:
        """Stores write a shared commit's round (up to ROUND_LIMIT) in one statement and a larger
        load another way: both keep every field, and one duplicate id stores none of either."""
        due = datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)

        def varied(i: int) -> DelayedMessage:
            return DelayedMessage(
                f"r-{i:05d}/ü",
                f"dest.{i % 3}",
                due + timedelta(microseconds=i),
                bytes([i % 256, 0, 255]) + b"\x00body",
                {"k": f"v{i}", "ü": 'ß\n"quoted"'} if i % 2 else {},
                failure_count=i % 4,
                group=f"saga-{i % 7}" if i % 5 else None,
            )

        for size in (2, ROUND_LIMIT, ROUND_LIMIT + 1):
            first = 100_000 * size
            batch = [varied(first + i) for i in range(size)]
            with pytest.raises(DuplicateMessageId):
                await store.store_many([*batch, batch[0]])
            assert await store.get(batch[0].message_id) is None, size  # none of it
            await store.store_many(batch)
            for m in (batch[0], batch[1], batch[-1]):
                assert await store.get(m.message_id) == m, size
        assert (await store.counts(now())).total == 2 + 2 * ROUND_LIMIT + 1

    async def test_store_new_stores_only_the_ids_not_stored_and_never_overwrites(
        self, store: DelayedMessageStore
    ) -> None:
        """Resuming an interrupted load: the ids stored (claimed or not) are skipped and kept as
        they are, the first of an id repeated in the batch is stored, the rest go in together."""
        assert isinstance(store, (NewOnlyStore, SyncSide))
        new_only = cast(NewOnlyStore, store)
        t = now()
        await store.store_many([msg(1, t - timedelta(seconds=1)), msg(2, t + timedelta(hours=1))])
        assert [m.message_id for m in await store.fetch_due(t, 10)] == ["m-00001"]  # claimed
        batch = [
            msg(1, t).with_changes(body=b"other"),
            msg(3, t + timedelta(hours=1)),
            msg(3, t).with_changes(body=b"repeated"),
            msg(2, t).with_changes(body=b"other"),
            msg(4, t + timedelta(hours=2)),
        ]
        assert await new_only.store_new(batch) == 2
        assert await new_only.store_new(batch) == 0
        assert await new_only.store_new([]) == 0
        for i in (1, 2, 3, 4):
            got = await store.get(f"m-{i:05d}")
            assert got is not None and got.body == f"body {i}".encode(), i
        large = [msg(i, t + timedelta(hours=1)) for i in range(10, 10 + 2 * ROUND_LIMIT)]
        await store.store_many(large[::2])
        assert await new_only.store_new(large) == ROUND_LIMIT
        assert (await store.counts(now())).total == 4 + 2 * ROUND_LIMIT

    async def test_a_message_over_the_size_limits_is_refused_and_nothing_of_its_batch_stored(
        self, store: DelayedMessageStore
    ) -> None:
        """The limits are checked where messages come in, so nothing a store holds can make a
        dispatcher, ``show`` or the dashboard hold gigabytes; headers at their limit are kept."""
        t = now() + timedelta(hours=1)
        at_limit = msg(1, t).with_changes(headers={"h": "x" * (MAX_HEADERS_BYTES - len('{"h":""}'))})
        big_body = msg(2, t).with_changes(body=b"b" * (MAX_BODY_BYTES + 1))
        many = msg(3, t).with_changes(headers={f"h{i}": "" for i in range(MAX_HEADERS_BYTES // 6)})
        for bad, said in ((big_body, "the body is 16,777,217 bytes"), (many, "the headers are")):
            with pytest.raises(InvalidMessage, match=said):
                await store.store(bad)
            with pytest.raises(InvalidMessage, match=said):
                await store.store_many([msg(4, t), bad])
            if isinstance(store, (NewOnlyStore, SyncSide)):
                with pytest.raises(InvalidMessage, match=said):
                    await cast(NewOnlyStore, store).store_new([msg(4, t), bad])
            assert await store.get(bad.message_id) is None and await store.get("m-00004") is None
        await store.store(at_limit)
        assert await store.get(at_limit.message_id) == at_limit

    async def test_a_message_may_not_carry_the_headers_only_dispatchers_write(
        self, store: DelayedMessageStore
    ) -> None:
        """``duetime-error-*`` say which endpoint a message failed in and why: scheduled with
        them, a message would land on an error queue as another endpoint's failure (listed and
        retried as that). Every way in refuses it and stores nothing."""
        t = now()
        forged = DelayedMessage(
            "forged", "error", t, b"x", {"duetime-error-endpoint": "payments", "duetime-error-message": "?"}
        )
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.store(forged),
            lambda: store.store_many([msg(1, t), forged]),
        ]
        if isinstance(store, (NewOnlyStore, SyncSide)):
            calls.append(lambda: cast(NewOnlyStore, store).store_new([msg(1, t), forged]))
        for call in calls:
            with pytest.raises(InvalidMessage, match="written by dispatchers only"):
                await call()
        assert await store.get("forged") is None and await store.get("m-00001") is None
        assert isinstance(store, (RecurringStore, SyncSide))
        with pytest.raises(InvalidMessage, match="written by dispatchers only"):
            new_schedule(
                "forged", "error", Recurrence(every=timedelta(seconds=1)), t, headers=dict(forged.headers)
            )

    # --- recurring schedules ------------------------------------------------------------------
    async def test_a_schedule_is_kept_and_its_ticks_stored_once_whoever_plans(
        self, store: DelayedMessageStore
    ) -> None:
        """Ticks are stored as planned, never twice: planning again, or from many threads at once
        (each a dispatcher), stores each planned tick exactly once and none out of turn."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        every_second = Recurrence(every=timedelta(seconds=1))
        made = await s.add_schedule(new_schedule("ping", "health", every_second, t0, body=b"hi"), t0)
        assert made.schedule_id == "ping" and made.state() == "active"
        with pytest.raises(ScheduleExists):
            await s.add_schedule(new_schedule("ping", "other", every_second, t0), t0)
        first = await ticks_of(store, "ping")
        assert [m.due_at for m in first] == [
            t0 + timedelta(seconds=k) for k in range(1, 32)
        ]  # 30 s ahead, and the next
        assert first[0].message_id == "ping@2030-01-01T12:00:01Z" and first[0].body == b"hi"
        assert first[0].headers["duetime-schedule"] == "ping"
        assert (await s.plan_schedules(t0)).ticks == 0  # planned already
        for i in range(10):
            await s.add_schedule(new_schedule(f"s{i}", "q", every_second, t0), t0)

        async def planner(step: int) -> None:
            for k in range(step, 60, 3):
                at = t0 + timedelta(seconds=k)
                if isinstance(store, SyncSide):  # blocking callers: threads
                    await asyncio.to_thread(cast(Any, store.sync).plan_schedules, at)
                else:
                    await s.plan_schedules(at)

        await asyncio.gather(*(planner(step) for step in range(3)))
        await s.plan_schedules(t0 + timedelta(seconds=60))
        for sid in ("ping", *(f"s{i}" for i in range(10))):
            due = [m.due_at for m in await ticks_of(store, sid)]
            assert due == [t0 + timedelta(seconds=k) for k in range(1, 92)], sid  # each once, none missing
        assert [x.schedule_id for x in await s.list_schedules()] == ["ping", *(f"s{i}" for i in range(10))]
        assert [x.schedule_id for x in await s.list_schedules("s4", 2)] == ["s5", "s6"]
        with pytest.raises(InvalidSchedule, match="without NUL"):  # no id holds one: a careless caller
            await s.list_schedules("s\x00", 2)

    async def test_pause_resume_change_trigger_backfill_and_remove(self, store: DelayedMessageStore) -> None:
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        minutely = Recurrence(cron="* * * * *")
        await s.add_schedule(new_schedule("m", "q", minutely, t0), t0)
        assert [m.due_at for m in await ticks_of(store, "m")] == [t0 + timedelta(minutes=1)]
        paused = await s.pause_schedule("m", t0)
        assert paused.state() == "paused" and await ticks_of(store, "m") == []
        assert (await s.plan_schedules(t0 + timedelta(hours=1))).ticks == 0
        resumed = await s.resume_schedule("m", t0 + timedelta(minutes=10, seconds=30))
        assert resumed.state() == "active" and resumed.ticks_missed == 0  # a pause misses nothing
        # 30 s ahead of 12:10:30 and the first tick past that
        assert [m.due_at for m in await ticks_of(store, "m")] == [t0 + timedelta(minutes=k) for k in (11, 12)]
        hourly = Recurrence(cron="0 * * * *")
        changed = await s.change_schedule(
            "m", lambda x: x.with_changes(recurrence=hourly, body=b"new"), t0 + timedelta(minutes=20)
        )
        assert changed.recurrence == hourly and changed.state() == "active"
        now_ticks = await ticks_of(store, "m")
        assert [(m.due_at, m.body) for m in now_ticks] == [(t0 + timedelta(hours=1), b"new")]
        extra = await s.trigger_schedule("m", t0 + timedelta(minutes=21))
        assert extra.headers["duetime-tick"] == "trigger" and extra.message_id != now_ticks[0].message_id
        stored = await s.backfill_schedule("m", t0 - timedelta(hours=3), t0, t0 + timedelta(minutes=22))
        assert stored == 4  # 09:00, 10:00, 11:00 and 12:00, due now
        assert await s.backfill_schedule("m", t0 - timedelta(hours=3), t0, t0 + timedelta(minutes=22)) == 0
        assert len(await ticks_of(store, "m")) == 1  # the trigger and backfill ticks are a group of their own
        await s.pause_schedule("m", t0 + timedelta(minutes=23))  # a pause leaves those asked for
        assert await s.resume_schedule("m", t0 + timedelta(minutes=24))
        assert await s.remove_schedule("m") == 6
        assert await ticks_of(store, "m") == []
        for call in (
            lambda: s.get_schedule("m"),
            lambda: s.pause_schedule("m"),
            lambda: s.remove_schedule("m"),
        ):
            with pytest.raises(ScheduleNotFound):
                await call()

    async def test_a_schedule_that_cannot_be_planned_is_set_aside_and_the_others_go_on(
        self, store: DelayedMessageStore
    ) -> None:
        """A schedule this host cannot plan (a zone another host's files had) stops no other: it
        is set aside once, says why, and is listed, shown, changed and removed as any other."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        await s.add_schedule(new_schedule("good", "q", Recurrence(every=timedelta(seconds=1)), t0), t0)
        daily = Recurrence(cron="0 9 * * *", zone="Europe/Paris")
        for sid, zone in (("elsewhere", "right/Europe/Paris"), ("local", "localtime")):
            text = new_schedule(sid, "q", daily, t0).to_text().replace('"Europe/Paris"', json.dumps(zone))
            assert _rules_of(store)._schedule_insert(ScheduleRow(sid, text, t0, 0))
        report = await s.plan_schedules(t0 + timedelta(seconds=40))
        assert sorted(sid for sid, _ in report.set_aside) == ["elsewhere", "local"]
        assert all("time zone" in why for _, why in report.set_aside)
        assert [m.due_at for m in await ticks_of(store, "good")][-1] == t0 + timedelta(seconds=71)
        aside = await s.get_schedule("local")
        assert aside.state() == "set aside" and "localtime" in (aside.set_aside or "")
        assert aside.next_planned(t0) is None
        assert [x.state() for x in await s.list_schedules()] == ["set aside", "active", "set aside"]
        assert (await s.plan_schedules(t0 + timedelta(seconds=41))).set_aside == ()  # said once
        with pytest.raises(InvalidSchedule, match=r"set aside: .*time zone"):
            await s.resume_schedule("elsewhere", t0 + timedelta(seconds=42))
        fixed = await s.change_schedule(
            "local", lambda x: x.with_changes(recurrence=daily), t0 + timedelta(seconds=43)
        )
        assert fixed.state() == "active" and fixed.set_aside is None
        assert [m.due_at for m in await ticks_of(store, "local")] == [datetime(2030, 1, 2, 8, tzinfo=UTC)]
        assert await s.remove_schedule("elsewhere") == 0

    async def test_a_schedule_with_no_tick_to_come_is_refused_and_leaves_nothing(
        self, store: DelayedMessageStore
    ) -> None:
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        far = datetime(9999, 12, 31, tzinfo=UTC)
        for when in (
            Recurrence(every=timedelta(days=1), start=far),
            Recurrence(cron="0 0 1 1 *", start=datetime(9999, 6, 1, tzinfo=UTC)),
            Recurrence(every=timedelta(days=1), end=t0 - timedelta(days=1)),
        ):
            with pytest.raises(InvalidSchedule, match="no tick to come"):
                await s.add_schedule(new_schedule("far", "q", when, t0), t0)
            with pytest.raises(ScheduleNotFound):
                await s.get_schedule("far")
        last = await s.add_schedule(
            new_schedule(
                "last", "q", Recurrence(every=timedelta(days=1), start=datetime(9998, 12, 31, tzinfo=UTC)), t0
            ),
            t0,
        )
        assert last.state() == "active" and last.next_planned(t0) == datetime(9998, 12, 31, tzinfo=UTC)

    async def test_schedules_whose_ids_share_a_start_keep_their_ticks_apart(
        self, store: DelayedMessageStore
    ) -> None:
        """``report`` and ``report+extra`` are two schedules: removing or pausing one removes
        none of the other's ticks (its own, its trigger's or its backfill's)."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        hourly = Recurrence(cron="0 * * * *")
        for sid in ("report", "report+extra"):
            await s.add_schedule(new_schedule(sid, "q", hourly, t0), t0)
            await s.trigger_schedule(sid, t0)
        await s.pause_schedule("report+extra", t0)
        assert len(await ticks_of(store, "report")) == 1  # its own next tick
        report = await store.list(ListQuery(limit=50))
        assert sorted(m.message_id for m in report.messages) == sorted(
            [
                "report@2030-01-01T13:00:00Z",
                "report@2030-01-01T12:00:00Z+trigger",
                "report+extra@2030-01-01T12:00:00Z+trigger",
            ]
        )
        assert await s.remove_schedule("report") == 2
        assert (await s.get_schedule("report+extra")).state() == "paused"
        left = await store.list(ListQuery(limit=50))
        assert [m.message_id for m in left.messages] == ["report+extra@2030-01-01T12:00:00Z+trigger"]

    async def test_catch_up_holds_for_the_whole_absence(self, store: DelayedMessageStore) -> None:
        """A dispatcher away for a day: ``latest`` sends one missed tick (not one per planning
        step), ``none`` sends none, and every tick left out is counted, for a cron expression and
        an interval alike."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        cases = {
            "cron-latest": Recurrence(cron="* * * * *"),
            "cron-none": Recurrence(cron="* * * * *", catch_up="none"),
            "every-latest": Recurrence(every=timedelta(seconds=1)),
            "cron-window": Recurrence(cron="* * * * *", catch_up="all", catch_up_window=timedelta(minutes=5)),
        }
        for sid, when in cases.items():
            await s.add_schedule(new_schedule(sid, "q", when, t0), t0)
            for tick in await ticks_of(store, sid):
                assert await store.cancel(tick.message_id)  # delivered before the dispatchers left
        back = t0 + timedelta(days=1, seconds=30)
        for _ in range(100):
            if not (await s.plan_schedules(back)).more:
                break
        late = back - timedelta(seconds=2)
        stale = {sid: [m for m in await ticks_of(store, sid) if m.due_at < late] for sid in cases}
        assert [m.due_at for m in stale["cron-latest"]] == [t0 + timedelta(days=1)]
        assert stale["cron-none"] == []
        assert [m.due_at for m in stale["every-latest"]] == [late - timedelta(seconds=1)]
        assert [m.due_at for m in stale["cron-window"]] == [
            t0 + timedelta(days=1, minutes=-k) for k in (4, 3, 2, 1, 0)
        ]
        missed = {sid: (await s.get_schedule(sid)).ticks_missed for sid in cases}
        assert missed == {
            "cron-latest": 1439 - 1,  # 12:02 to 12:00 the next day, less the one sent
            "cron-none": 1439,
            "every-latest": 86396 - 1,  # 12:00:32 to 12:00:27 the next day, less the one sent
            "cron-window": 1439 - 5,
        }

    async def test_a_change_while_a_tick_goes_out_sends_that_tick_once(
        self, store: DelayedMessageStore
    ) -> None:
        """A tick delivered while ``change`` runs (claimed ahead of its time, or delivered before
        the change could remove it) is not planned again for the changed schedule."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        t0 = datetime(2030, 1, 1, 12, tzinfo=UTC)
        await s.add_schedule(
            new_schedule("tick", "q", Recurrence(every=timedelta(seconds=1)), t0, body=b"old"), t0
        )
        first = (await ticks_of(store, "tick"))[0]
        claimed = await store.fetch_due(first.due_at, 1)
        assert [m.message_id for m in claimed] == [first.message_id]
        await store.remove_many([first.message_id])  # delivered, as the change began
        changed = await s.change_schedule("tick", lambda x: x.with_changes(body=b"new"), t0)
        assert changed.state() == "active"
        after = await ticks_of(store, "tick")
        assert first.message_id not in {m.message_id for m in after}
        assert after[0].due_at == t0 + timedelta(seconds=2) and {m.body for m in after} == {b"new"}
        # a tick held by a dispatcher through a pause is not planned again on resuming
        second = after[0]
        assert [m.message_id for m in await store.fetch_due(second.due_at, 1)] == [second.message_id]
        await s.pause_schedule("tick", t0)
        await store.remove_many([second.message_id])
        await s.resume_schedule("tick", t0)
        assert (await ticks_of(store, "tick"))[0].due_at == t0 + timedelta(seconds=3)

    async def test_schedule_commands_follow_the_stores_clock(self, store: DelayedMessageStore) -> None:
        """Without a time given, a schedule is made, paused, resumed and triggered at the store's
        time (its server's, where it has one), not at the time the caller's host thinks it is."""
        assert isinstance(store, (RecurringStore, SyncSide))
        s = cast(RecurringStore, store)
        store_now = (await store.server_time() if isinstance(store, ServerClock) else None) or now()
        host_an_hour_fast = store_now + timedelta(hours=1)
        made = await s.add_schedule(
            new_schedule("clock", "q", Recurrence(every=timedelta(seconds=1)), host_an_hour_fast)
        )
        assert made.created_at is not None and abs(made.created_at - store_now) < timedelta(seconds=10)
        ticks = await ticks_of(store, "clock")
        assert ticks[0].due_at - store_now < timedelta(seconds=10)  # no hour skipped
        resumed = await s.resume_schedule("clock")
        assert resumed.changed_at is not None and abs(resumed.changed_at - store_now) < timedelta(seconds=10)
        extra = await s.trigger_schedule("clock")
        assert abs(extra.due_at - store_now) < timedelta(seconds=10)

    async def test_ids_are_exact_strings(self, store: DelayedMessageStore) -> None:
        """No collation may fold case or trailing spaces: these are four different messages."""
        ids = ["order-a", "ORDER-A", "order-a ", "order-\u00e1"]
        await store.store_many([DelayedMessage(i, "orders", now(), i.encode()) for i in ids])
        for i in ids:
            got = await store.get(i)
            assert got is not None and got.message_id == i and got.body == i.encode()

    async def test_fetch_due_claims_oldest_first_and_only_due(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store_many(
            [msg(i, t - timedelta(seconds=i)) for i in range(5)] + [msg(9, t + timedelta(hours=1))]
        )
        batch = await store.fetch_due(t, 3)
        assert [m.message_id for m in batch] == ["m-00004", "m-00003", "m-00002"]
        rest = await store.fetch_due(t, 10)
        assert [m.message_id for m in rest] == ["m-00001", "m-00000"]
        assert await store.fetch_due(t, 10) == []

    async def test_due_exactly_now_is_due_and_a_microsecond_later_is_not(
        self, store: DelayedMessageStore
    ) -> None:
        t = now()
        await store.store_many([msg(1, t), msg(2, t + timedelta(microseconds=1))])
        assert [m.message_id for m in await store.fetch_due(t, 10)] == ["m-00001"]

    async def test_claim_expires_after_claim_timeout(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store(msg(1, t))
        assert len(await store.fetch_due(t, 10)) == 1
        assert await store.fetch_due(t + self.claim_timeout / 2, 10) == []
        again = await store.fetch_due(t + self.claim_timeout + timedelta(seconds=1), 10)
        assert [m.message_id for m in again] == ["m-00001"]

    async def test_next_due(self, store: DelayedMessageStore) -> None:
        assert await store.next_due() is None
        t = now() + timedelta(minutes=5)
        await store.store_many([msg(1, t + timedelta(seconds=1)), msg(2, t)])
        assert await store.next_due() == t

    async def test_next_due_skips_claimed_messages_until_their_claim_expires(
        self, store: DelayedMessageStore
    ) -> None:
        t = now()
        await store.store(msg(1, t))
        await store.store(msg(2, t + timedelta(hours=1)))
        await store.fetch_due(t, 1)
        nxt = await store.next_due()
        assert nxt is not None and t < nxt <= t + self.claim_timeout + timedelta(seconds=1)

    async def test_a_short_claim_reads_the_next_due_time_as_next_due_would(
        self, store: DelayedMessageStore
    ) -> None:
        """The next due time read in the claim's own call leaves the claimed batch out and is
        what :meth:`next_due` answers just after: never later (a message slept past), and not
        earlier either (a round that finds nothing)."""
        assert isinstance(store, (ClaimsWithNextDue, SyncSide))
        t = now()
        soon = t + timedelta(seconds=10)
        await store.store_many([msg(i, t - timedelta(seconds=i)) for i in range(3)] + [msg(9, soon)])
        full = cast(Claimed, await store.fetch_due_and_next(t, 2))
        assert [m.message_id for m in full.messages] == ["m-00002", "m-00001"]
        assert full.next_due is None or full.next_due.at == await store.next_due()
        short = cast(Claimed, await store.fetch_due_and_next(t, 5))
        assert [m.message_id for m in short.messages] == ["m-00000"]
        assert short.next_due is not None or not self.next_due_in_claim
        assert short.next_due is None or short.next_due.at == soon == await store.next_due()
        assert await store.remove_many(["m-00000", "m-00001", "m-00002", "m-00009"]) == 4
        empty = cast(Claimed, await store.fetch_due_and_next(t, 5))
        assert empty.messages == []
        assert empty.next_due is not None or not self.next_due_in_claim
        assert empty.next_due is None or empty.next_due.at is None

    async def test_a_message_that_came_due_after_the_claims_time_is_the_next_due_time(
        self, store: DelayedMessageStore
    ) -> None:
        """At a thousand messages a second the next one comes due while a claim runs: not due
        at the claim's own time, it is the next due time the claim reads (in the past by then,
        so the next round starts at once), not a question left to the dispatcher every round."""
        assert isinstance(store, (ClaimsWithNextDue, SyncSide))
        t = now() - timedelta(seconds=10)
        await store.store_many([msg(1, t), msg(2, t + timedelta(seconds=1))])
        claimed = cast(Claimed, await store.fetch_due_and_next(t + timedelta(milliseconds=500), 10))
        assert [m.message_id for m in claimed.messages] == ["m-00001"]
        assert claimed.next_due is not None or not self.next_due_in_claim
        assert claimed.next_due is None or claimed.next_due.at == t + timedelta(seconds=1)

    async def test_a_claim_that_takes_a_lapsed_lease_reads_no_lapsed_time(
        self, store: DelayedMessageStore
    ) -> None:
        """A message whose lease ran out and is claimed again counts from its new lease: the
        next due time read with that claim is not the old lease's end (a round at once, for
        nothing), nor later than the other messages."""
        assert isinstance(store, (ClaimsWithNextDue, SyncSide))
        t = now()
        later = t + self.claim_timeout + timedelta(minutes=5)
        await store.store_many([msg(1, t), msg(2, later)])
        assert len(await store.fetch_due(t, 10)) == 1
        again = t + self.claim_timeout + timedelta(seconds=1)
        claimed = cast(Claimed, await store.fetch_due_and_next(again, 10))
        assert [m.message_id for m in claimed.messages] == ["m-00001"]
        assert claimed.next_due is not None or not self.next_due_in_claim
        if claimed.next_due is not None:
            assert claimed.next_due.at is not None and again < claimed.next_due.at <= later

    async def test_remove(self, store: DelayedMessageStore) -> None:
        await store.store_many([msg(1, now()), msg(2, now()), msg(3, now())])
        assert await store.remove("m-00001") is True
        assert await store.remove("m-00001") is False
        assert await store.remove_many(["m-00002", "m-00003", "nope"]) == 2
        assert await store.next_due() is None

    async def test_increment_failure_count_counts_and_releases_the_claim(
        self, store: DelayedMessageStore
    ) -> None:
        t = now()
        await store.store(msg(1, t))
        await store.fetch_due(t, 10)
        assert await store.increment_failure_count("m-00001") is True
        again = await store.fetch_due(t, 10)
        assert [m.failure_count for m in again] == [1]
        assert await store.increment_failure_count("missing") is False

    async def test_release_gives_claims_back(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store_many([msg(1, t), msg(2, t)])
        await store.fetch_due(t, 10)
        assert await store.release(["m-00001", "m-00002", "gone"]) == 2
        assert len(await store.fetch_due(t, 10)) == 2

    async def test_cancel(self, store: DelayedMessageStore) -> None:
        await store.store(msg(1, now() + timedelta(hours=1)))
        assert await store.cancel("m-00001") is True
        assert await store.cancel("m-00001") is False
        assert await store.get("m-00001") is None

    async def test_cancel_and_reschedule_refuse_a_message_in_flight(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store(msg(1, t))
        await store.fetch_due(t, 10)
        with pytest.raises(MessageInFlight):
            await store.cancel("m-00001")
        with pytest.raises(MessageInFlight):
            await store.reschedule("m-00001", t + timedelta(hours=1))
        assert await store.get("m-00001") is not None

    async def test_put_refuses_keeps_replaces_or_debounces_a_waiting_message(
        self, store: DelayedMessageStore
    ) -> None:
        """Each ``if_exists`` on an id that is waiting, and each on one that is not (stored)."""
        assert isinstance(store, (ReplacingStore, SyncSide))
        put = cast(ReplacingStore, store).put
        t = now() + timedelta(hours=1)
        first = msg(1, t, group="cart-1")
        for how in IfExists:
            fresh = msg(10 + len(how), t)
            assert await put(fresh, how) == Put(fresh, "stored")
        assert await put(first, IfExists.REFUSE) == Put(first, "stored")
        other = DelayedMessage(
            "m-00001", "emails", t + timedelta(minutes=5), b"\x00new", {"v": "2"}, group="cart-2"
        )
        with pytest.raises(DuplicateMessageId, match="m-00001"):
            await put(other, IfExists.REFUSE)
        assert await put(other, IfExists.KEEP) == Put(first, "kept")
        assert await store.get("m-00001") == first
        assert await put(other, IfExists.REPLACE) == Put(other, "replaced")
        assert await store.get("m-00001") == other
        # the group, the destination and the due time are the new one's everywhere they are read
        assert await store.count_group("cart-1") == 0 and await store.count_group("cart-2") == 1
        listed = await store.list(ListQuery(destination="emails", limit=10))
        assert [m.message_id for m in listed.messages] == ["m-00001"]
        later = other.with_changes(due_at=t + timedelta(minutes=10), group=None)
        assert await put(later, IfExists.DEBOUNCE) == Put(later, "replaced")
        assert await store.get("m-00001") == later and await store.count_group("cart-2") == 0
        # the same content again is a replace too (a store that counts changed rows says 0)
        assert await put(later, IfExists.REPLACE) == Put(later, "replaced")
        assert await store.reschedule("m-00001", later.due_at) is True
        with pytest.raises(ConfigurationError, match="if_exists must be one of refuse, keep"):
            await put(later, "overwrite")  # type: ignore[arg-type]
        assert (await store.counts(now())).total == 5

    async def test_put_never_replaces_a_message_a_dispatcher_holds(self, store: DelayedMessageStore) -> None:
        """Refused in one line while claimed (the claim, and the old content, stand), even once
        the claim has lapsed (its dispatcher may still be sending, and its settle would remove
        the new content); replaced once the claim is released (a send that failed), and then
        claimed with its new due time."""
        put = cast(ReplacingStore, store).put
        t = now()
        await store.store(msg(1, t))
        [claimed] = await store.fetch_due(t, 10)
        newer = msg(1, t).with_changes(body=b"newer")
        for how in (IfExists.REPLACE, IfExists.DEBOUNCE):
            with pytest.raises(MessageInFlight, match=r"m-00001.*not replaced"):
                await put(newer, how)
        assert await put(newer, IfExists.KEEP) == Put(claimed, "kept")
        assert await store.get("m-00001") == claimed
        await store.store(msg(2, t - timedelta(minutes=2)))
        [lapsed] = await store.fetch_due(t - timedelta(minutes=1), 10)  # its claim ended 30 s ago
        with pytest.raises(MessageInFlight, match="not replaced"):
            await put(lapsed.with_changes(body=b"newer"), IfExists.REPLACE)
        assert await store.remove("m-00002") is True  # the slow sender settles what it sent
        assert await store.release(["m-00001"]) == 1  # a send that failed: claimable again
        moved = newer.with_changes(due_at=t + timedelta(hours=1))
        assert await put(moved, IfExists.REPLACE) == Put(moved, "replaced")
        assert await store.fetch_due(t, 10) == []  # not due any more: its due time is the new one
        due_now = moved.with_changes(due_at=t - timedelta(seconds=1), body=b"newest")
        assert await put(due_now, IfExists.DEBOUNCE) == Put(due_now, "replaced")
        assert await store.fetch_due(t, 10) == [due_now]

    async def test_debounces_of_one_id_at_once_leave_one_message(self, store: DelayedMessageStore) -> None:
        """Ten producers debouncing one id at the same moment: one message stays, with one of
        their contents, each producer told "stored" (one of them) or "replaced"; a debounce after
        them all decides what goes."""
        put = cast(ReplacingStore, store).put
        t = now() + timedelta(hours=1)
        wave = [
            msg(1, t + timedelta(milliseconds=i)).with_changes(body=f"event {i}".encode()) for i in range(10)
        ]
        if isinstance(store, SyncSide):  # blocking callers: threads
            sync_put = cast(Any, store.sync).put
            with ThreadPoolExecutor(10) as pool:
                outcomes = [f.result() for f in [pool.submit(sync_put, m, IfExists.DEBOUNCE) for m in wave]]
        else:
            outcomes = list(await asyncio.gather(*(put(m, IfExists.DEBOUNCE) for m in wave)))
        assert sorted(o.outcome for o in outcomes) == ["replaced"] * 9 + ["stored"]
        assert (await store.counts(now())).total == 1
        assert await store.get("m-00001") in wave
        last = msg(1, t + timedelta(minutes=10)).with_changes(body=b"the last event")
        assert (await put(last, IfExists.DEBOUNCE)).outcome == "replaced"
        assert await store.get("m-00001") == last

    async def test_a_group_is_kept_listed_and_cancelled_together(self, store: DelayedMessageStore) -> None:
        t = now() + timedelta(hours=1)
        saga = "9f1c2a64-0000-4000-8000-00000000abcd"
        await store.store_many(
            [msg(i, t + timedelta(seconds=i), group=saga if i < 3 else None) for i in range(5)]
            + [msg(9, t, group="other")]
        )
        got = await store.get("m-00001")
        assert got is not None and got.group == saga
        assert (await store.get("m-00004")) is not None and (await store.get("m-00004")).group is None  # type: ignore[union-attr]
        listed = await store.list(ListQuery(group=saga, limit=100))
        assert [m.message_id for m in listed.messages] == ["m-00000", "m-00001", "m-00002"]
        paged = await store.list(ListQuery(group=saga, limit=2))
        assert len(paged.messages) == 2 and paged.next_cursor is not None
        assert await store.cancel_group(saga) == 3
        assert await store.cancel_group(saga) == 0  # idempotent: a redelivered request is harmless
        assert await store.get("m-00001") is None
        assert {m.message_id for m in (await store.list(ListQuery(limit=100))).messages} == {
            "m-00003",
            "m-00004",
            "m-00009",
        }
        assert await store.cancel_group("never-used") == 0

    async def test_a_large_group_is_counted_and_cancelled_in_batches_each_whole(
        self, store: DelayedMessageStore
    ) -> None:
        """``cancel --group`` of a large group: counted for the question, then cancelled a batch
        at a time (each batch one transaction), so it can be stopped between batches and resumed;
        a message in flight is counted, never cancelled."""
        t = now()
        await store.store_many([msg(i, t + timedelta(hours=1, seconds=i), group="big") for i in range(25)])
        await store.store_many([msg(90, t - timedelta(seconds=1), group="big"), msg(91, t, group="small")])
        assert [m.message_id for m in await store.fetch_due(t, 1)] == ["m-00090"]  # in flight
        assert await store.count_group("big") == 26 and await store.count_group("none") == 0
        assert [await store.cancel_group("big", 10) for _ in range(4)] == [10, 10, 5, 0]
        assert await store.count_group("big") == 1 and await store.get("m-00090") is not None
        assert await store.count_group("small") == 1  # another group untouched
        with pytest.raises(ConfigurationError, match="limit must be a whole number"):
            await store.cancel_group("big", 0)

    async def test_cancel_group_leaves_a_message_in_flight_and_forgets_delivered_ones(
        self, store: DelayedMessageStore
    ) -> None:
        t = now()
        await store.store_many([msg(1, t, group="g"), msg(2, t + timedelta(hours=1), group="g")])
        await store.store(msg(3, t - timedelta(seconds=1), group="g"))
        claimed = await store.fetch_due(t, 1)  # m-00003 is being forwarded
        assert [m.message_id for m in claimed] == ["m-00003"] and claimed[0].group == "g"
        await store.remove("m-00003")  # delivered
        [in_flight] = await store.fetch_due(t, 1)
        assert in_flight.message_id == "m-00001"
        assert await store.cancel_group("g") == 1  # m-00002; m-00001 goes on its way
        assert await store.get("m-00001") is not None and await store.get("m-00002") is None
        await store.store(msg(3, t + timedelta(hours=2), group="g"))  # the id is free again
        assert [m.message_id for m in (await store.list(ListQuery(group="g"))).messages] == [
            "m-00001",
            "m-00003",
        ]

    async def test_reschedule(self, store: DelayedMessageStore) -> None:
        t = now() + timedelta(hours=1)
        await store.store(msg(1, t))
        later = t + timedelta(days=1)
        assert await store.reschedule("m-00001", later) is True
        got = await store.get("m-00001")
        assert got is not None and got.due_at == later
        assert await store.reschedule("missing", later) is False
        with pytest.raises(InvalidMessage, match="naive"):
            await store.reschedule("m-00001", datetime(2030, 1, 1))

    async def test_list_pages_and_filters(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store_many([msg(i, t + timedelta(seconds=i), "a" if i % 2 else "b") for i in range(25)])
        seen: list[str] = []
        after = None
        while True:
            page = await store.list(ListQuery(limit=10, after=after))
            seen += [m.message_id for m in page.messages]
            if page.next_cursor is None:
                break
            after = page.next_cursor
        assert seen == [f"m-{i:05d}" for i in range(25)]
        only_a = await store.list(ListQuery(destination="a", limit=100))
        assert len(only_a.messages) == 12 and only_a.next_cursor is None
        early = await store.list(ListQuery(due_before=t + timedelta(seconds=5), limit=100))
        assert [m.message_id for m in early.messages] == [f"m-{i:05d}" for i in range(5)]

    async def test_messages_due_at_one_moment_page_through_whole(self, store: DelayedMessageStore) -> None:
        """A bulk load gives thousands the same due time: pages (whole, and of one destination)
        walk through them by id, none lost, none twice, past any batch a store reads at once."""
        t = now() + timedelta(hours=1)
        await store.store_many([msg(i, t, "b" if i % 3 == 0 else "a") for i in range(1, 601)])
        for destination, expected in ((None, range(1, 601)), ("b", range(3, 601, 3))):
            seen: list[str] = []
            after = None
            while True:
                page = await store.list(ListQuery(destination=destination, limit=250, after=after))
                seen += [m.message_id for m in page.messages]
                if page.next_cursor is None:
                    break
                after = page.next_cursor
            assert seen == [f"m-{i:05d}" for i in expected], destination

    async def test_a_destination_of_any_text_is_listed_and_counted_as_itself(
        self, store: DelayedMessageStore
    ) -> None:
        """Names a store must escape where it keeps them as text (quotes, backslashes, its own
        format's separators, other scripts) are found by their own name, and by no other's."""
        t = now() + timedelta(hours=1)
        odd = ['a"b', "back\\slash", 'x","h":{"', "ünïcødé ✓", "a", "A"]
        await store.store_many([DelayedMessage(f"o-{i}", d, t, b"") for i, d in enumerate(odd)])
        for i, destination in enumerate(odd):
            page = await store.list(ListQuery(destination=destination, limit=10))
            assert [m.message_id for m in page.messages] == [f"o-{i}"], destination
            assert page.messages[0].destination == destination
        assert (await store.counts(now())).by_destination == dict.fromkeys(odd, 1)

    async def test_counts(self, store: DelayedMessageStore) -> None:
        t = now()
        await store.store_many(
            [
                msg(1, t - timedelta(seconds=1)),
                msg(2, t - timedelta(seconds=1), "x"),
                msg(3, t + timedelta(hours=1)),
            ]
        )
        await store.fetch_due(t, 1)
        await store.release([])
        counts = await store.counts(t)
        assert (counts.total, counts.due, counts.claimed) == (3, 2, 1)
        assert counts.by_destination == {"orders": 2, "x": 1}

    async def test_counts_by_destination_sum_up_the_rest_never_cut_silently(
        self, store: DelayedMessageStore
    ) -> None:
        """The backlog by destination stopped at 1,000 destinations without a word."""
        t = now() + timedelta(hours=1)
        many = [DelayedMessage(f"d-{i:05}", f"q{i:04}", t, b"") for i in range(1003)]
        big = [DelayedMessage(f"b-{i:05}", "big", t, b"") for i in range(3)]
        await store.store_many([*many, *big])
        counts = await store.counts(now())
        if counts.estimated:  # a store that estimates (from a sample, say) must say so, and
            # still account for every message, roughly, not show a part as if it were the whole
            assert "big" in counts.by_destination and counts.total == 1006, counts
            assert abs(sum(counts.by_destination.values()) + counts.more_messages - 1006) < 100, counts
            return
        assert len(counts.by_destination) == 1000 and counts.by_destination["big"] == 3
        assert counts.more_destinations == 4 and counts.more_messages == 4
        assert sum(counts.by_destination.values()) + counts.more_messages == counts.total == 1006

    async def test_stores_made_at_once_share_commits_and_each_hears_its_own_answer(
        self, store: DelayedMessageStore
    ) -> None:
        t = now()
        await store.store(msg(0, t))
        wave = [msg(i, t) for i in range(1, 41)] + [msg(0, t)]  # the last: an id already stored
        if isinstance(store, SyncSide):  # blocking callers: threads
            with ThreadPoolExecutor(8) as pool:
                outcomes: list[object] = [
                    f.exception() for f in [pool.submit(store.sync.store, m) for m in wave]
                ]
        else:
            outcomes = list(await asyncio.gather(*(store.store(m) for m in wave), return_exceptions=True))
        assert outcomes[:-1] == [None] * 40
        assert isinstance(outcomes[-1], DuplicateMessageId)
        assert (await store.counts(t)).total == 41
        stored = await store.get("m-00017")
        assert stored is not None and stored.body == b"body 17"

    async def test_count_due_counts_only_what_is_due_by_then(self, store: DelayedMessageStore) -> None:
        assert isinstance(store, (DueCounter, SyncSide))
        t = now()
        await store.store_many(
            [
                msg(1, t - timedelta(seconds=1)),
                msg(2, t + timedelta(minutes=30)),
                msg(3, t + timedelta(days=2)),
            ]
        )
        await store.fetch_due(t, 1)  # claimed is still due
        assert [
            await store.count_due(t + ahead)
            for ahead in (timedelta(0), timedelta(hours=1), timedelta(days=3))
        ] == [1, 2, 3]

    async def test_dispatchers_say_they_are_there_and_are_forgotten_when_long_gone(
        self, store: DelayedMessageStore
    ) -> None:
        assert isinstance(store, (DispatcherRegistry, SyncSide))
        registry = cast(DispatcherRegistry, store)
        t = now().replace(microsecond=0)
        run = uuid.uuid4().hex[:8]
        first = DispatcherInfo.new(ENDPOINT, "at-least-once", "memory://", t - timedelta(seconds=30))
        first = first.with_changes(dispatcher_id=f"a-{run}", last_seen=t - timedelta(seconds=20))
        second = first.with_changes(dispatcher_id=f"b-{run}", started_at=t, last_seen=t)
        await registry.beat(first)
        await registry.beat(second)
        await registry.beat(second.with_changes(forwarded=7, last_batch_at=t))  # a refresh replaces
        mine = {d.dispatcher_id: d for d in await registry.dispatchers() if d.dispatcher_id.endswith(run)}
        assert set(mine) == {f"a-{run}", f"b-{run}"}
        assert mine[f"b-{run}"] == second.with_changes(forwarded=7, last_batch_at=t)
        assert mine[f"a-{run}"].status(t) == "gone" and mine[f"b-{run}"].status(t) == "live"
        later = t + timedelta(days=1, seconds=1)
        await registry.beat(second.with_changes(last_seen=later))  # a day later: the gone one goes
        left = [d.dispatcher_id for d in await registry.dispatchers() if d.dispatcher_id.endswith(run)]
        assert left == [f"b-{run}"]

    async def test_api_keys_are_kept_without_their_secret_refused_twice_and_revoked(
        self, store: DelayedMessageStore
    ) -> None:
        """The HTTP API's keys (:mod:`duetime.api_keys`): a store keeps each by name, the secret's
        hash and never the secret; a name in use is refused; a revoked key opens nothing and its
        name may be taken again. A store that keeps no keys says so in one line."""
        assert isinstance(store, (ApiKeyStore, SyncSide))
        keys = cast(ApiKeyStore, store)
        run = uuid.uuid4().hex[:8]
        t = now().replace(microsecond=0)
        key, secret = new_key(f"k-{run}", {Scope.SCHEDULE, Scope.READ}, t, rate=5)
        try:
            await keys.add_api_key(key)
        except ConfigurationError as error:
            assert "keeps no API keys" in str(error)
            return
        with pytest.raises(ApiKeyExists):
            await keys.add_api_key(new_key(key.name, {Scope.READ}, t)[0])

        async def mine() -> list[ApiKey]:
            return [k for k in await keys.api_keys() if k.name == key.name]

        assert await mine() == [key]
        assert (await mine())[0].opens(secret) and secret not in key.to_json()
        assert await keys.revoke_api_key(key.name, t + timedelta(seconds=1))
        assert not await keys.revoke_api_key(key.name, t)  # no key of that name in use
        [revoked] = await mine()
        assert revoked.revoked_at == t + timedelta(seconds=1) and not revoked.opens(secret)
        again, _ = new_key(key.name, {Scope.MANAGE}, t)
        await keys.add_api_key(again)
        assert await mine() == [again]

    async def test_the_audit_trail_keeps_each_entry_exact_pages_newest_first_and_prunes_by_age(
        self, store: DelayedMessageStore
    ) -> None:
        """The audit trail (:mod:`duetime.audit`): every entry comes back as written (an actor's
        markup and non-ASCII text too), newest first a page at a time without a gap or a repeat,
        oldest first for an export, filtered by actor and action; entries before a time are
        forgotten and the rest kept. A store that keeps none says so in one line."""
        assert isinstance(store, (AuditStore, SyncSide))
        trail = cast(AuditStore, store)
        run = uuid.uuid4().hex[:8]
        # far in the past, at a moment of this run's own: other runs' entries never mix in
        base = datetime(1971, 1, 1, tzinfo=UTC) + timedelta(days=int(run, 16) % 10_000)
        alice = Actor(f"<b>alice</b> \u00e9 {run}", Via.DASHBOARD, "10.0.0.1")
        key = Actor(f"key:{run}", Via.HTTP_API, "::1")
        written = [
            made(alice if i % 3 else key, Action.CANCEL if i % 2 else Action.RESCHEDULE, f"m-{i}",
                 ids=[f"m-{i}"], detail=f"due \u2192 {i}", at=base + timedelta(seconds=i))
            for i in range(12)
        ]  # fmt: skip
        try:
            for entry in written:
                await trail.audit(entry)
        except ConfigurationError as error:
            assert "keeps no" in str(error)
            return
        window = AuditQuery(since=base, until=base + timedelta(minutes=1))
        seen: list[AuditEntry] = []
        cursor: str | None = None
        while True:
            page, cursor = await trail.audit_entries(replace(window, limit=5, after=cursor))
            seen += page
            if cursor is None:
                break
        assert seen == written[::-1]
        oldest, _ = await trail.audit_entries(replace(window, limit=100, oldest_first=True))
        assert oldest == written
        by_key, _ = await trail.audit_entries(replace(window, actor=key.name, action="cancel"))
        assert by_key == [e for e in written[::-1] if e.actor == key.name and e.action == "cancel"]
        assert await trail.prune_audit(base + timedelta(seconds=4)) >= 4
        left, _ = await trail.audit_entries(replace(window, limit=100, oldest_first=True))
        assert left == written[4:]

    async def test_a_retry_put_off_is_counted_released_and_due_later_in_one_change(
        self, store: DelayedMessageStore
    ) -> None:
        """What a destination's "not now" (RetryLater) does: the claimed message is released
        with one more failure and its new due time at once, so neither this dispatcher's next
        claim nor another's takes it before then."""
        assert isinstance(store, (RetryingStore, SyncSide))
        retrying = cast(RetryingStore, store)
        t = now()
        await store.store(msg(1, t - timedelta(seconds=1)))
        [claimed] = await store.fetch_due(t, 10)
        later = t + timedelta(hours=1)
        assert await retrying.retry_later(claimed.message_id, later)
        assert await store.fetch_due(t + timedelta(minutes=59), 10) == []
        got = await store.get(claimed.message_id)
        assert got is not None and got.failure_count == 1 and got.due_at == later
        assert [m.message_id for m in await store.fetch_due(later, 10)] == [claimed.message_id]
        assert not await retrying.retry_later("no-such-message", later)

    async def test_webhook_endpoints_are_kept_changed_and_removed_with_their_secrets(
        self, store: DelayedMessageStore
    ) -> None:
        """Webhook endpoints (:mod:`duetime.webhooks`): kept by name with every field as given
        (the secrets too: they sign), a name in use refused, a change in place, a remove that
        forgets the secrets and frees the name. A store that keeps none says so in one line."""
        assert isinstance(store, (WebhookStore, SyncSide))
        hooks = cast(WebhookStore, store)
        run = uuid.uuid4().hex[:8]
        t = now().replace(microsecond=0)
        hook = WebhookEndpoint(
            f"w-{run}", "https://hooks.example/in?a=1&b=é", (new_secret(),), t,
            headers=("customer-id",), allow=("10.0.0.0/8",), retry_schedule=(1.0, 2.5),
        )  # fmt: skip
        try:
            await hooks.add_webhook(hook)
        except ConfigurationError as error:
            assert "keeps no named records" in str(error)
            return

        async def mine() -> list[WebhookEndpoint]:
            return [w for w in await hooks.webhooks() if w.name == hook.name]

        assert await mine() == [hook]
        with pytest.raises(WebhookExists):
            await hooks.add_webhook(hook)
        rotated = hook.rotated(new_secret())
        assert await hooks.change_webhook(rotated) and await hooks.change_webhook(rotated)
        assert await mine() == [rotated] and rotated.secrets[1] == hook.secrets[0]
        assert await hooks.remove_webhook(hook.name)
        assert not await hooks.remove_webhook(hook.name)
        assert not await hooks.change_webhook(rotated)  # a removed one is not brought back
        assert await mine() == []
        await hooks.add_webhook(hook)
        assert await mine() == [hook]
        assert await hooks.remove_webhook(hook.name)

    async def _flow(self, store: DelayedMessageStore) -> FlowControlStore | None:
        """The store as a flow-control store; None (the case passes) if it says in one line
        that it keeps no limits."""
        assert isinstance(store, (FlowControlStore, SyncSide))
        flow = cast(FlowControlStore, store)
        try:
            await flow.limits()
        except ConfigurationError as error:
            assert "keeps no named records" in str(error) or "keeps no flow-control limits" in str(error)
            return None
        return flow

    async def test_a_held_message_waits_unclaimed_for_its_turn_with_nothing_of_it_changed(
        self, store: DelayedMessageStore
    ) -> None:
        """A flow-control hold (:meth:`FlowControlStore.hold`): the claimed message comes back
        hidden from every claim until its time, then claimable as it was (due time, failures,
        content). It is no claim: counted apart, and a cancel, reschedule or replace reaches it.
        A release of every hold makes them claimable at once."""
        flow = await self._flow(store)
        if flow is None:
            return
        t = now()
        for i in range(4):
            await store.store(msg(i, t - timedelta(seconds=1)))
        claimed = await store.fetch_due(t, 10)
        assert len(claimed) == 4
        turn = t + timedelta(minutes=10)
        assert (
            await flow.hold({m.message_id: turn + timedelta(seconds=i) for i, m in enumerate(claimed)}) == 4
        )
        assert await store.fetch_due(t + timedelta(minutes=9), 10) == []
        counts = await store.counts(t + timedelta(seconds=1))
        assert (counts.held, counts.claimed, counts.total) == (4, 0, 4)
        nxt = await store.next_due()
        assert nxt is not None and abs((nxt - turn).total_seconds()) < 0.01  # it wakes for the turn
        got = await store.get("m-00000")
        assert got is not None and got.due_at == claimed[0].due_at and got.failure_count == 0
        assert got.body == claimed[0].body and got.headers == claimed[0].headers
        assert await store.cancel("m-00001")
        later = t + timedelta(hours=1)
        assert await store.reschedule("m-00002", later)
        if isinstance(store, (ReplacingStore, SyncSide)):
            put = await cast(ReplacingStore, store).put(
                msg(3, t - timedelta(seconds=1)).with_changes(body=b"new"), IfExists.REPLACE
            )
            assert put.outcome == "replaced"
        taken = await store.fetch_due(turn + timedelta(seconds=5), 10)
        ids = sorted(m.message_id for m in taken)
        assert "m-00000" in ids and "m-00001" not in ids and "m-00002" not in ids
        for m in taken:
            if m.message_id == "m-00000":
                assert m.due_at == claimed[0].due_at
            if m.message_id == "m-00003":
                assert m.body == b"new"
        await store.release([m.message_id for m in taken])
        again = await store.fetch_due(turn + timedelta(seconds=5), 10)
        assert sorted(m.message_id for m in again) == ids
        assert await flow.hold({m.message_id: later for m in again}) == len(again)
        assert await flow.release_held() == len(again)
        assert sorted(m.message_id for m in await store.fetch_due(t, 10)) == ids
        assert (await store.counts(t)).held == 0

    async def test_limits_and_pauses_are_kept_replaced_and_removed(self, store: DelayedMessageStore) -> None:
        """Limits and pauses by destination or pattern: a limit replaces the one it names, a
        second pause keeps the first (and who made it), a remove says whether there was one."""
        flow = await self._flow(store)
        if flow is None:
            return
        t = now().replace(microsecond=0)
        first = Limit("partner-*", Rate.parse("50/s", burst=5), 4, "customer-id", "ops@host", t)
        await flow.set_limit(first)
        await flow.set_limit(Limit("billing", concurrency=2))
        assert [x for x in await flow.limits() if x.destination == "partner-*"] == [first]
        changed = Limit("partner-*", Rate.parse("10/min"))
        await flow.set_limit(changed)
        assert {x.destination: x for x in await flow.limits()}["partner-*"] == changed
        assert await flow.remove_limit("partner-*") and not await flow.remove_limit("partner-*")
        assert [x.destination for x in await flow.limits()] == ["billing"]
        assert await flow.remove_limit("billing")
        pause = Pause("billing", "ann@ops", t, "receiver down: INC-42")
        assert await flow.pause_destination(pause)
        assert not await flow.pause_destination(Pause("billing", "bob", t))
        assert await flow.paused() == [pause]
        assert await flow.resume_destination("billing") and not await flow.resume_destination("billing")
        assert await flow.paused() == []
        long = "q." + "x" * 190  # longer than a record's name: kept by a digest of it
        await flow.set_limit(Limit(long, concurrency=1))
        assert await flow.pause_destination(Pause(long, "ann", t))
        assert [x.destination for x in await flow.limits()] == [long]
        assert [p.destination for p in await flow.paused()] == [long]
        assert await flow.remove_limit(long) and await flow.resume_destination(long)

    async def test_a_rate_is_shared_by_every_store_object_at_once(
        self, store: DelayedMessageStore, make_sync_store: Callable[[], SyncDelayedMessageStore]
    ) -> None:
        """The shared state of a rate is changed by compare-and-set: four store objects taking
        turns from one bucket on four threads at once are given no more than the rate allows
        between them (a burst of 50, then one turn for each 10 ms)."""
        flow = await self._flow(store)
        if flow is None:
            return
        bucket, rate = f"b-{uuid.uuid4().hex[:12]}", Rate.parse("100/s", burst=50)
        start = now()
        stores = [make_sync_store() for _ in range(4)]
        for s in stores:
            s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)

        def take(s: Any) -> int:
            got = 0
            for i in range(50):
                got += s.take_rate(bucket, rate, 3, start + timedelta(milliseconds=i)).granted
            return got

        try:
            with ThreadPoolExecutor(4) as pool:
                granted = sum(pool.map(take, stores))
            later = await flow.take_rate(bucket, rate, 3, start + timedelta(seconds=1))
        finally:
            for s in stores:
                s.close()
        assert granted == 50 + 4  # the burst, and 49 ms of turns at one per 10 ms
        assert later.granted == 3 and later.interval_seconds == 0.01

    async def test_concurrency_slots_are_shared_given_back_and_lapse(
        self, store: DelayedMessageStore
    ) -> None:
        """Concurrency slots: never more taken than the limit between holders, given back by
        count, and a holder that never gives them back loses them when its lease ends."""
        flow = await self._flow(store)
        if flow is None:
            return
        bucket, t = f"s-{uuid.uuid4().hex[:12]}", now()
        assert await flow.take_slots(bucket, "a", 3, 4, t) == 3
        assert await flow.take_slots(bucket, "b", 3, 4, t) == 1
        await flow.give_slots(bucket, "a", 2, t)
        assert await flow.take_slots(bucket, "b", 5, 4, t) == 2
        assert await flow.take_slots(bucket, "c", 1, 4, t) == 0
        assert await flow.take_slots(bucket, "c", 4, 4, t + timedelta(minutes=2)) == 4  # a, b lapsed

    async def test_sync_twin_sees_the_same_messages(
        self, store: DelayedMessageStore, make_sync_store: Callable[[], SyncDelayedMessageStore]
    ) -> None:
        sync = make_sync_store()
        sync.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        sync.store(msg(1, now()))
        assert await store.get("m-00001") is not None
        await store.store(msg(2, now()))
        assert sync.get("m-00002") is not None
        assert [m.message_id for m in sync.fetch_due(now(), 10)] == ["m-00001", "m-00002"]
        sync.close()

    async def test_concurrent_claimers_never_share_a_message(
        self, store: DelayedMessageStore, make_sync_store: Callable[[], SyncDelayedMessageStore]
    ) -> None:
        t = now()
        await store.store_many([msg(i, t) for i in range(400)])
        claimed: list[list[str]] = [[] for _ in range(4)]
        # Closing a store gives back what it holds unsettled (as a process that ends does), so
        # every claimer holds its claims until all are done.
        done = threading.Barrier(4)

        def claimer(slot: int) -> None:
            s = make_sync_store()
            s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
            while batch := s.fetch_due(t, 7):
                claimed[slot] += [m.message_id for m in batch]
            done.wait(timeout=60)
            s.close()

        threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        everything = [i for part in claimed for i in part]
        assert len(everything) == 400 and len(set(everything)) == 400

    # --- encryption at rest (duetime.encryption): the store's rules seal and open -------------
    @staticmethod
    def _seal_with(store: object, keyring: Keyring | None) -> StoreRules:
        rules = _rules_of(store)
        rules.sealer = None if keyring is None else Sealer(keyring)
        return rules

    async def test_sealed_messages_hold_no_plaintext_at_rest_and_come_back_exact(
        self, store: DelayedMessageStore
    ) -> None:
        """Every way in seals (store, store_many, store_new, a replace) and every way out opens
        (get, list, a claim), byte for byte; duetime's own headers stay readable."""
        rules = self._seal_with(store, Keyring.new())
        t = now()
        secret = {"card": "4111-1111-SECRET", "ü": "ß-SECRET", "duetime-note": "kept"}

        def made(i: int, body: bytes) -> DelayedMessage:
            return DelayedMessage(f"sealed-{i}", "orders", t, body, secret)

        originals = [made(0, b"\x00SECRET-BODY\xff"), made(1, b""), made(2, b"SECRET" * 100)]
        await store.store(originals[0])
        await store.store_many([originals[1]])
        assert isinstance(store, NewOnlyStore) and isinstance(store, ReplacingStore)
        await store.store_new([originals[2]])
        replaced = made(0, b"SECRET-REPLACED")
        assert (await store.put(replaced, IfExists.REPLACE)).outcome == "replaced"
        originals[0] = replaced
        for m in originals:
            raw = rules._get(m.message_id)
            assert raw is not None and b"SECRET" not in raw.body
            assert not any("SECRET" in v for v in raw.headers.values())
            assert raw.headers["duetime-note"] == "kept" and sealed_with(raw.headers) is not None
            assert await store.get(m.message_id) == m
        assert sorted((await store.list(ListQuery())).messages, key=lambda m: m.message_id) == originals
        claimed = await store.fetch_due(t + timedelta(seconds=1), 10)
        assert sorted(claimed, key=lambda m: m.message_id) == originals

    async def test_a_sealed_message_that_does_not_open_says_why_and_is_never_given_as_plaintext(
        self, store: DelayedMessageStore
    ) -> None:
        """A row moved to another id, a changed byte, a key the keyring lacks: each comes out
        still sealed with the reason, and a dispatcher would refuse to deliver it."""
        ring = Keyring.new()
        rules = self._seal_with(store, ring)
        t = now()
        await store.store(DelayedMessage("a", "orders", t, b"SECRET-A", {"k": "SECRET"}))
        raw = rules._get("a")
        assert raw is not None
        rules._insert(
            [raw.with_changes(message_id="moved"), raw.with_changes(message_id="b", destination="other")]
        )
        flipped = bytes([raw.body[0] ^ 1]) + raw.body[1:]
        rules._insert([raw.with_changes(message_id="c", body=flipped)])
        for message_id in ("moved", "b", "c"):
            got = await store.get(message_id)
            assert got is not None and b"SECRET" not in got.body
            why = sealed_problem(got)
            assert why is not None and "does not authenticate" in why
        self._seal_with(store, Keyring.new())  # another keyring: not the key "a" was sealed with
        got = await store.get("a")
        assert got is not None and "which the keyring does not hold" in (sealed_problem(got) or "")
        self._seal_with(store, None)  # no keyring at all
        got = await store.get("a")
        assert got is not None and "no keyring is set" in (sealed_problem(got) or "")
        self._seal_with(store, ring)
        assert await store.get("a") == DelayedMessage("a", "orders", t, b"SECRET-A", {"k": "SECRET"})

    async def test_a_rotation_seals_everything_again_with_the_primary_and_leaves_what_a_dispatcher_holds(
        self, store: DelayedMessageStore
    ) -> None:
        assert isinstance(store, SealingStore)
        t = now()
        self._seal_with(store, None)
        plain = [msg(i, t + timedelta(hours=1)) for i in range(5)]
        await store.store_many(plain)
        old = Keyring.new("old")
        rules = self._seal_with(store, old)
        sealed = [msg(i, t + timedelta(minutes=i - 5)) for i in range(5, 10)]
        await store.store_many(sealed)
        claimed = await store.fetch_due(t + timedelta(minutes=1), 2)  # a dispatcher holds these
        assert [m.message_id for m in claimed] == ["m-00005", "m-00006"]
        new = old.with_new_key("new")
        self._seal_with(store, new)
        looked = await store.reseal(None, 100, look_only=True)
        assert dict(looked.by_key) == {"": 5, "old": 5} and looked.resealed == 0
        first, after = await store.reseal(None, 4), None
        assert first.after is not None and first.seen == 4
        rest = await store.reseal(first.after, 100)
        assert rest.after is None and first.resealed + rest.resealed == 8 and first.busy + rest.busy == 2
        keys = {
            m.message_id: sealed_with(raw.headers)
            for m in plain + sealed
            if (raw := rules._get(m.message_id))
        }
        assert keys == {m.message_id: "old" if m in claimed else "new" for m in plain + sealed}
        await store.release([m.message_id for m in claimed])
        again = await store.reseal(after, 100)
        assert again.resealed == 2 and dict(again.by_key) == {"new": 8, "old": 2}
        assert dict((await store.reseal(None, 100, look_only=True)).by_key) == {"new": 10}
        self._seal_with(store, new.without("old"))
        assert sorted((await store.list(ListQuery())).messages, key=lambda m: m.message_id) == plain + sealed

    async def test_a_sealed_schedule_keeps_its_body_sealed_and_its_ticks_open_exact(
        self, store: DelayedMessageStore
    ) -> None:
        assert isinstance(store, RecurringStore) and isinstance(store, SealingStore)
        ring = Keyring.new()
        rules = self._seal_with(store, ring)
        t0 = now()
        every = Recurrence(every=timedelta(seconds=1))
        made = new_schedule("sealed", "health", every, t0, body=b"SECRET-TICK", headers={"k": "SECRET"})
        await store.add_schedule(made, t0)
        row = rules._schedule_get("sealed")
        assert row is not None and "SECRET" not in row.text
        shown = await store.get_schedule("sealed")
        assert shown.body == b"SECRET-TICK" and dict(shown.headers) == {"k": "SECRET"}
        ticks = await ticks_of(store, "sealed")
        assert ticks and all(m.body == b"SECRET-TICK" and m.headers["k"] == "SECRET" for m in ticks)
        raw = rules._get(ticks[0].message_id)
        assert raw is not None and b"SECRET" not in raw.body
        changed = await store.change_schedule("sealed", lambda s: s.with_changes(body=b"SECRET-NEW"), t0)
        assert changed.body == b"SECRET-NEW"
        self._seal_with(store, ring.with_new_key("next"))
        assert dict(await store.reseal_schedules()) == {"next": 1}
        assert (await store.get_schedule("sealed")).body == b"SECRET-NEW"
        self._seal_with(store, None)
        with pytest.raises(ConfigurationError, match="encrypted with key 'next'"):
            await store.change_schedule("sealed", lambda s: s.with_changes(body=b"garbled"), t0)
        assert (await store.pause_schedule("sealed", t0)).paused  # what it sends stays as it was

    async def test_headers_at_their_limit_are_kept_sealed_and_come_back_exact(
        self, store: DelayedMessageStore
    ) -> None:
        """Sealing adds a tag to the body and base64 to each header value: the sizes are checked
        on what was sent, so headers at their limit are kept sealed (a third larger), with a
        body of a few MiB (a 16 MiB body needs more than a MariaDB server's default packet in
        plaintext already: that store says so in one line)."""
        self._seal_with(store, Keyring.new())
        t = now() + timedelta(hours=1)
        biggest = msg(1, t).with_changes(
            body=b"\xff" * (4 * 1024 * 1024), headers={"h": "x" * (MAX_HEADERS_BYTES - len('{"h":""}'))}
        )
        await store.store(biggest)
        assert await store.get(biggest.message_id) == biggest
