"""The one way duetime's async stores and queues are made: a blocking implementation on a thread.

Every backend is written once, blocking (producers, web apps and Spark executors use that directly);
the async side runs the same calls on a small thread pool, so the event loop never waits on a
driver. A store's cross-process wake-up (SQLite's change counter, PostgreSQL's LISTEN, a Redis
channel, a MariaDB poll) is a hook the bridge starts with the first subscriber and stops on close.
Measured against the hand-written async PostgreSQL store it replaced (bench/RESULTS.md): exactly-once
dispatch and scheduling as fast, at-least-once dispatch about a tenth slower.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from duetime.api_keys import ApiKey
from duetime.audit import AuditEntry, AuditQuery
from duetime.backends._schedules import PLAN_AHEAD, PLAN_BATCH
from duetime.backends._shared_commit import AsyncSharedCommits, Outcome, store_round
from duetime.backends._store import RESEAL_BATCH, StoreRules, closed
from duetime.errors import ConfigurationError, TransportUnavailable
from duetime.interfaces import (
    AsyncClosing,
    Claimed,
    IfExists,
    ListQuery,
    MoveOutcome,
    Page,
    Put,
    ReceivedMessage,
    Resealed,
    StoreCounts,
    WakeupCallback,
)
from duetime.limits import Limit, Pause, Rate, RateGrant
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import DelayedMessage
from duetime.recurring.schedule import PlanReport, Schedule
from duetime.settings import TransactionMode
from duetime.webhooks import WebhookEndpoint

T = TypeVar("T")
log = logging.getLogger("duetime.store")


class Subscribers:
    """Wake-up callbacks; a failing callback is never allowed to fail a store call."""

    def __init__(self) -> None:
        self._callbacks: list[WakeupCallback] = []

    def add(self, callback: WakeupCallback) -> Callable[[], None]:
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def __bool__(self) -> bool:
        return bool(self._callbacks)

    def notify(self, due: datetime | None) -> None:
        for callback in list(self._callbacks):
            try:
                callback(due)
            except Exception:  # a subscriber's bug must not fail a store that already committed
                log.exception("a wake-up subscriber failed")


#: A store's cross-process wake-up: runs until cancelled, telling subscribers what changed.
WatchHook = Callable[[Subscribers], Coroutine[Any, Any, None]]


async def poll_next_due(
    next_due: Callable[[], datetime | None], every: float, subscribers: Subscribers
) -> None:
    """The wake-up of a store that cannot be told (MariaDB; PostgreSQL behind a pooler in
    transaction mode): ask ``next_due()`` (blocking, on a thread) every ``every`` seconds and
    tell the subscribers when it changed. A message another process stores is
    then found at most ``every`` seconds late; a failing question is left to the dispatcher's own
    calls, whose breakers report the database's trouble."""
    last: datetime | None = None
    while True:
        await asyncio.sleep(every)
        try:
            current = await asyncio.to_thread(next_due)
        except Exception:
            continue
        # any change, not only an earlier one: after what was next has gone, a later message may
        # be the next, and the loop may sleep toward nothing (its wake-up keeps what matters)
        if current is not None and current != last:
            subscribers.notify(current)
        last = current


#: How long closing a store or a transport waits for the calls in flight on its thread (see
#: :meth:`BlockingCalls.closing`).
CLOSE_WITHIN = 5.0


class BlockingCalls:
    """Runs blocking calls off the event loop (the one thread pool of every blocking driver) (inline when ``threads`` is 0, for the memory fake).
    After :meth:`shutdown` a call raises ``closed()``: what its owner says of itself once closed,
    not the executor's "cannot schedule new futures after shutdown"."""

    def __init__(self, threads: int, name: str, closed: Callable[[], Exception]) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=name) if threads else None
        self._closed = closed
        self._shut = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._shut:
            raise self._closed()
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def shut(self) -> bool:
        return self._shut

    async def closing(self, close: Callable[[], object], seconds: float | None = None) -> None:
        """The owner's ``close`` on its thread, after the calls in flight, waited for
        :data:`CLOSE_WITHIN` seconds at most. A call in flight blocked on a server that stopped
        answering (a network partition) never returns, and the close queued behind it held
        whatever was stopping (Ctrl-C on ``queues receive`` hung for good, printing nothing).
        Past that the close is left to run if the call ever returns; the process's own exit
        has a bound of its own (``duetime.cli.exit_watchdog``)."""
        if self._executor is None:
            close()
            return
        closed = asyncio.get_running_loop().run_in_executor(self._executor, close)
        closed.add_done_callback(lambda done: done.cancelled() or done.exception())  # read, never "lost"
        limit = CLOSE_WITHIN if seconds is None else seconds
        try:
            await asyncio.wait_for(asyncio.shield(closed), limit)
        except TimeoutError:
            log.warning(
                "closing did not finish within %g s: a call on its thread waits on a server that does "
                "not answer; leaving it to the connection's own end",
                limit,
            )

    def shutdown(self) -> None:
        """No new calls; the threads end once their call returns. Not waited for here: this runs
        on the event loop, and a call blocked on a partitioned server never returns (closing a
        queue whose consumer waited there hung the command for good)."""
        self._shut = True
        if self._executor is not None:
            self._executor.shutdown(wait=False)


class AsyncStoreBridge(AsyncClosing):
    """The async store contract over a blocking store, with an optional wake-up hook.

    ``reads_apart``: an operator's reads (counts, pages of messages, a group's count, one
    message, the dispatchers) run on a thread of their own, so a count that reads a million rows
    never waits in front of the dispatcher's claims on the one thread (on MariaDB it held
    deliveries up to 0.4 s every ten seconds, while the backlog gauge counted). Only for a
    blocking store whose methods may be called from two threads at once."""

    def __init__(
        self,
        sync: StoreRules,
        *,
        threads: int = 1,
        name: str,
        watch: WatchHook | None = None,
        reads_apart: bool = False,
    ) -> None:
        self.sync = sync
        self._threads = BlockingCalls(threads, name, closed)
        self._call = self._threads.call
        self._reads = BlockingCalls(1, f"{name}-reads", closed) if reads_apart and threads else self._threads
        self._read = self._reads.call
        self.subscribers = Subscribers()
        self._watch = watch
        self._watcher: asyncio.Task[None] | None = None
        #: Single stores from many coroutines at once share a commit (:mod:`._shared_commit`).
        self._shared = AsyncSharedCommits(self._store_round)

    @property
    def parallel_claims(self) -> bool:
        return self.sync.parallel_claims

    async def setup_infrastructure(self, endpoint: str) -> None:
        await self._call(self.sync.setup_infrastructure, endpoint)

    async def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        await self._call(self.sync.initialize, endpoint, mode)

    async def store(self, message: DelayedMessage) -> None:
        """Store one message; returns once it is durable. Calls made while another is being
        stored go together in the next transaction (each still gets its own answer)."""
        await self._shared.store(message)

    async def _store_round(self, messages: list[DelayedMessage]) -> list[Outcome]:
        outcomes = await self._call(store_round, messages, self.sync.store_many)
        stored = [m.due_at for m, outcome in zip(messages, outcomes, strict=True) if outcome is None]
        if stored:
            self.subscribers.notify(min(stored))
        return outcomes

    async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        count = await self._call(self.sync.store_many, list(messages))
        if messages:
            self.subscribers.notify(min(m.due_at for m in messages))
        return count

    async def store_new(self, messages: Sequence[DelayedMessage]) -> int:
        count = await self._call(self.sync.store_new, list(messages))
        if count:
            self.subscribers.notify(min(m.due_at for m in messages))
        return count

    async def put(self, message: DelayedMessage, if_exists: IfExists) -> Put:
        done = await self._call(self.sync.put, message, if_exists)
        if done.outcome != "kept":
            self.subscribers.notify(message.due_at)
        return done

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        return await self._call(self.sync.fetch_due, at, limit)

    async def fetch_due_and_next(self, at: datetime, limit: int) -> Claimed:
        return await self._call(self.sync.fetch_due_and_next, at, limit)

    async def next_due(self) -> datetime | None:
        return await self._call(self.sync.next_due)

    async def remove(self, message_id: str) -> bool:
        return await self._call(self.sync.remove, message_id)

    async def remove_many(self, message_ids: Sequence[str]) -> int:
        return await self._call(self.sync.remove_many, list(message_ids))

    async def increment_failure_count(self, message_id: str) -> bool:
        return await self._call(self.sync.increment_failure_count, message_id)

    async def retry_later(self, message_id: str, due_at: datetime) -> bool:
        return await self._call(self.sync.retry_later, message_id, due_at)

    async def release(self, message_ids: Sequence[str]) -> int:
        return await self._call(self.sync.release, list(message_ids))

    async def get(self, message_id: str) -> DelayedMessage | None:
        return await self._read(self.sync.get, message_id)

    async def cancel(self, message_id: str) -> bool:
        return await self._call(self.sync.cancel, message_id)

    async def cancel_group(self, group: str, limit: int | None = None) -> int:
        return await self._call(self.sync.cancel_group, group, limit)

    async def count_group(self, group: str) -> int:
        return await self._read(self.sync.count_group, group)

    async def reschedule(self, message_id: str, due_at: datetime) -> bool:
        done = await self._call(self.sync.reschedule, message_id, due_at)
        if done:
            self.subscribers.notify(due_at)
        return done

    async def beat(self, info: DispatcherInfo) -> None:
        await self._call(self.sync.beat, info)

    async def dispatchers(self) -> list[DispatcherInfo]:
        return await self._read(self.sync.dispatchers)

    async def add_api_key(self, key: ApiKey) -> None:
        await self._call(self.sync.add_api_key, key)

    async def api_keys(self) -> builtins.list[ApiKey]:
        return await self._read(self.sync.api_keys)

    async def revoke_api_key(self, name: str, at: datetime) -> bool:
        return await self._call(self.sync.revoke_api_key, name, at)

    async def audit(self, entry: AuditEntry) -> None:
        await self._call(self.sync.audit, entry)

    async def audit_entries(self, query: AuditQuery) -> tuple[builtins.list[AuditEntry], str | None]:
        return await self._read(self.sync.audit_entries, query)

    async def prune_audit(self, before: datetime) -> int:
        return await self._call(self.sync.prune_audit, before)

    async def add_webhook(self, webhook: WebhookEndpoint) -> None:
        await self._call(self.sync.add_webhook, webhook)

    async def change_webhook(self, webhook: WebhookEndpoint) -> bool:
        return await self._call(self.sync.change_webhook, webhook)

    async def webhooks(self) -> builtins.list[WebhookEndpoint]:
        return await self._read(self.sync.webhooks)

    async def remove_webhook(self, name: str) -> bool:
        return await self._call(self.sync.remove_webhook, name)

    async def set_limit(self, limit: Limit) -> None:
        await self._call(self.sync.set_limit, limit)

    async def limits(self) -> builtins.list[Limit]:
        return await self._read(self.sync.limits)

    async def remove_limit(self, destination: str) -> bool:
        return await self._call(self.sync.remove_limit, destination)

    async def pause_destination(self, pause: Pause) -> bool:
        return await self._call(self.sync.pause_destination, pause)

    async def resume_destination(self, destination: str) -> bool:
        return await self._call(self.sync.resume_destination, destination)

    async def paused(self) -> builtins.list[Pause]:
        return await self._read(self.sync.paused)

    async def take_rate(self, bucket: str, rate: Rate, wanted: int, now: datetime) -> RateGrant:
        return await self._call(self.sync.take_rate, bucket, rate, wanted, now)

    async def take_slots(self, bucket: str, holder: str, wanted: int, most: int, now: datetime) -> int:
        return await self._call(self.sync.take_slots, bucket, holder, wanted, most, now)

    async def give_slots(self, bucket: str, holder: str, count: int, now: datetime) -> None:
        await self._call(self.sync.give_slots, bucket, holder, count, now)

    async def hold(self, until: Mapping[str, datetime]) -> int:
        return await self._call(self.sync.hold, dict(until))

    async def release_held(self) -> int:
        return await self._call(self.sync.release_held)

    async def reseal(
        self, after: tuple[datetime, str] | None, limit: int = RESEAL_BATCH, *, look_only: bool = False
    ) -> Resealed:
        return await self._call(functools.partial(self.sync.reseal, after, limit, look_only=look_only))

    async def reseal_schedules(self, *, look_only: bool = False) -> dict[str, int]:
        return await self._call(functools.partial(self.sync.reseal_schedules, look_only=look_only))

    async def list(self, query: ListQuery) -> Page:
        return await self._read(self.sync.list, query)

    async def counts(self, at: datetime) -> StoreCounts:
        return await self._read(self.sync.counts, at)

    async def count_due(self, at: datetime) -> int:
        return await self._call(self.sync.count_due, at)

    async def server_time(self) -> datetime | None:
        return await self._call(self.sync.server_time)

    # --- recurring schedules (the rules in duetime.backends._schedules) -------------------------
    async def add_schedule(self, schedule: Schedule, now: datetime | None = None) -> Schedule:
        return await self._planned(self.sync.add_schedule, schedule, now)

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._call(self.sync.get_schedule, schedule_id)

    async def list_schedules(self, after: str = "", limit: int = 100) -> builtins.list[Schedule]:
        return await self._call(self.sync.list_schedules, after, limit)

    async def change_schedule(
        self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime | None = None
    ) -> Schedule:
        return await self._planned(self.sync.change_schedule, schedule_id, change, now)

    async def pause_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        return await self._call(self.sync.pause_schedule, schedule_id, now)

    async def resume_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        return await self._planned(self.sync.resume_schedule, schedule_id, now)

    async def remove_schedule(self, schedule_id: str) -> int:
        return await self._call(self.sync.remove_schedule, schedule_id)

    async def trigger_schedule(self, schedule_id: str, now: datetime | None = None) -> DelayedMessage:
        return await self._planned(self.sync.trigger_schedule, schedule_id, now)

    async def backfill_schedule(
        self, schedule_id: str, start: datetime, end: datetime, now: datetime | None = None
    ) -> int:
        return await self._planned(self.sync.backfill_schedule, schedule_id, start, end, now)

    async def plan_schedules(
        self,
        now: datetime | None = None,
        ahead: timedelta = PLAN_AHEAD,
        limit: int = PLAN_BATCH,
        *,
        steady_since: datetime | None = None,
    ) -> PlanReport:
        report = await self._call(
            functools.partial(self.sync.plan_schedules, now, ahead, limit, steady_since=steady_since)
        )
        if report.earliest is not None:
            self.subscribers.notify(report.earliest)
        return report

    async def _planned(self, call: Callable[..., T], *args: Any) -> T:
        """A schedule call that may have stored ticks: this process's dispatchers look again."""
        result = await self._call(call, *args)
        self.subscribers.notify(None)
        return result

    def subscribe(self, callback: WakeupCallback) -> Callable[[], None]:
        unsubscribe = self.subscribers.add(callback)
        if self._watch is not None and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(self.subscribers))
        return unsubscribe

    async def close(self) -> None:
        if self._threads.shut:  # closed already: a second close does nothing
            return
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        if self._reads is not self._threads:
            self._reads.shutdown()  # a read in flight ends on its own; its connection closes below
        await self._threads.closing(self.sync.close)
        self._threads.shutdown()


class MovingStore(Protocol):
    """A blocking store that can move due messages into its own queue in one transaction."""

    def move_due(
        self,
        at: datetime,
        limit: int,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome: ...


class TransactionalBridge(AsyncStoreBridge):
    """A bridge over a store that can move due messages into its own queue tables in one
    transaction (exactly-once); a backend says which transports share that transaction."""

    sync: Any  # a StoreRules that is also a MovingStore

    #: Finishes "move_due needs ..." when the transport is not the store's own queue.
    needs = "the store's own queue transport"
    #: The transport last found to share the store's transaction. SQLite answers by resolving
    #: both paths on disk: a fifth of the dispatcher's own time when it was asked every round.
    _shares_with: object | None = None

    def shares_transaction_with(self, transport: object) -> bool:
        raise NotImplementedError

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
        until: datetime | None = None,
        budget: timedelta = timedelta(0),
    ) -> MoveOutcome:
        if transport is not self._shares_with:  # asked once per transport, not every round
            if not self.shares_transaction_with(transport):
                raise ConfigurationError(f"move_due needs {self.needs}.")
            self._shares_with = transport
        moving: MovingStore = self.sync
        return await self._call(moving.move_due, at, limit, error_queue, error_headers, until, budget)


class SyncQueue(Protocol):
    """A blocking queue table (SQLite, PostgreSQL): what :class:`AsyncQueueBridge` runs."""

    def declare(self, queue: str) -> None: ...
    def queues(self) -> dict[str, int]: ...
    def send(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]: ...
    def receive(
        self, queue: str, max_messages: int, wait: float, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]: ...
    def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int: ...
    def peek(self, queue: str, limit: int) -> list[ReceivedMessage]: ...
    def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]: ...
    def depth(self, queue: str) -> int: ...
    def close(self) -> None: ...


def transport_closed() -> TransportUnavailable:
    """What a transport's call says once the transport is closed."""
    return TransportUnavailable("The transport is closed (it was closed after use); open a new one.")


class AsyncQueueBridge(AsyncClosing):
    """The async transport over a blocking queue, opened on first use.

    Waiting for messages happens on a thread of its own: a consumer waiting on one queue never
    holds up a send through the same transport.
    """

    def __init__(self, open_queue: Callable[[], SyncQueue], *, name: str) -> None:
        self._open = open_queue
        self._queue: SyncQueue | None = None
        self._opening = threading.Lock()
        self._threads = BlockingCalls(1, name, transport_closed)
        self._waits = BlockingCalls(1, f"{name}-wait", transport_closed)

    def _sync(self) -> SyncQueue:
        with self._opening:
            if self._queue is None:
                self._queue = self._open()
            return self._queue

    @property
    def queue(self) -> SyncQueue:
        """The blocking queue (opened now if it was not yet)."""
        return self._sync()

    async def _call(self, fn: Callable[[SyncQueue], T]) -> T:
        return await self._threads.call(lambda: fn(self._sync()))

    async def start(self) -> None:
        await self._call(lambda q: q)

    async def declare(self, queue: str) -> None:
        await self._call(lambda q: q.declare(queue))

    async def queues(self) -> dict[str, int]:
        return await self._call(lambda q: q.queues())

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        return await self._call(lambda q: q.send(messages))

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        if wait <= 0:
            return await self._call(lambda q: q.receive(queue, max_messages, 0.0, done))
        return await self._waits.call(lambda: self._sync().receive(queue, max_messages, wait, done))

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        return await self._call(lambda q: q.acknowledge(messages))

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        return await self._call(lambda q: q.peek(queue, limit))

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        return await self._call(lambda q: q.take(queue, message_ids))

    async def depth(self, queue: str) -> int:
        return await self._call(lambda q: q.depth(queue))

    async def has_queue(self, queue: str) -> bool:
        return queue in await self.queues()

    async def close(self) -> None:
        if self._threads.shut:  # closed already: a second close does nothing
            return
        if self._queue is not None:
            await self._threads.closing(self._queue.close)
        self._threads.shutdown()
        self._waits.shutdown()
