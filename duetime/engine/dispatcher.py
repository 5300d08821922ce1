"""The dispatcher: a loop that claims what is due, sends it, settles it, and sleeps until the next.

This is NServiceBus's delayed-delivery poller (``FetchNextDueTimeout`` / ``Next`` / ``Remove`` /
``IncrementFailureCount``) done in batches, woken early by stores, with every sleep capped, with the
same circuit breakers, and with a critical error that always reaches its callback.

The loop is this module; each round is a strategy's (:mod:`duetime.engine.strategies`: at-least-once
or exactly-once), a failed forward is the failure policy's (:mod:`duetime.engine.failures`), and
everything counted, charted, traced, recorded or reported is an observer's
(:mod:`duetime.engine.observe`, :mod:`duetime.engine.sinks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from duetime.clock import TIMER_LATENESS, ServerAlignedClock, SystemClock
from duetime.engine.calls import Breakers, EngineCalls
from duetime.engine.circuit import FailureRateCircuitBreaker, RepeatedFailuresOverTimeCircuitBreaker
from duetime.engine.deadline import within
from duetime.engine.failures import FailurePolicy
from duetime.engine.flow import REFRESH_SECONDS as FLOW_REFRESH_SECONDS
from duetime.engine.flow import FlowControl
from duetime.engine.observe import DispatchObserver, Observers
from duetime.engine.outages import Outages
from duetime.engine.planning import Planner
from duetime.engine.sinks import DeliveryLogSink, DispatchStats, LogSink, StatsSink, SummarySink, TracingSink
from duetime.engine.strategies import AtLeastOnce, DeliveryStrategy, ExactlyOnce, Progress, StrategyParts
from duetime.engine.summary import LatenessHistogram
from duetime.engine.wakeups import WakeUps
from duetime.errors import (
    ConfigurationError,
    CriticalError,
    StoreNotReady,
    UnsupportedTransactionMode,
    one_line,
    refused_for_good,
)
from duetime.inputs.identifiers import check_name
from duetime.interfaces import (
    ClaimPolicy,
    Clock,
    DelayedMessageStore,
    DeliveryLog,
    FlowControlStore,
    ReadsFromStore,
    RecurringStore,
    ServerClock,
    StoreCounts,
    TransactionalStore,
    Transport,
    require,
)
from duetime.settings import DEFAULT_ENDPOINT, DelayedDeliverySettings, TransactionMode

log = logging.getLogger("duetime.dispatcher")

#: A host clock further than this from the store server's is logged; the server's is looked at
#: again every SKEW_RECHECK seconds (a host clock can be stepped while it runs).
SKEW_WARNING, SKEW_RECHECK = 1.0, 60.0
#: A skew this small (plus half the round trip that measured it) is measuring noise, not a wrong
#: clock: the host's clock is kept as it is, so its own readings and the dispatcher's agree.
SKEW_IGNORED = 0.05

CriticalErrorCallback = Callable[[CriticalError], Awaitable[None] | None]


def safest_mode(store: DelayedMessageStore, transport: Transport) -> TransactionMode:
    """Exactly-once where the pair can keep it (one transaction moves a message), else at-least-once:
    the mode of a dispatcher whose settings name none."""
    if isinstance(store, TransactionalStore) and store.shares_transaction_with(transport):
        return TransactionMode.EXACTLY_ONCE
    return TransactionMode.AT_LEAST_ONCE


class Dispatcher:
    """Forwards due messages from ``store`` through ``transport``.

    ``run()`` serves until ``stop()`` (or a critical error, which it raises after the callback has
    run); ``run_burst()`` forwards what is due now and returns, for tests and cron-style use.
    ``observer`` is told of everything it does (more can be added: ``dispatcher.observer.add``).
    """

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings | None = None,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        clock: Clock | None = None,
        on_critical_error: CriticalErrorCallback | None = None,
        delivery_log: DeliveryLog | None = None,
        observer: DispatchObserver | None = None,
    ) -> None:
        check_dispatcher_inputs(store, transport)
        s = settings or DelayedDeliverySettings()
        #: The mode in force: the settings', else the safest the pair keeps.
        if isinstance(transport, ReadsFromStore):
            transport.attach_store(store)
        self.mode: TransactionMode = s.transaction_mode or safest_mode(store, transport)
        self.settings = s = s.with_changes(transaction_mode=self.mode)
        self.endpoint = check_name("endpoint", endpoint)
        #: Without a clock of the caller's, the system clock, moved onto the store server's time
        #: where the store has one (measured at start and every SKEW_RECHECK seconds).
        self._aligned = ServerAlignedClock() if clock is None else None
        self.clock: Clock = clock or self._aligned or SystemClock()
        self._skew_checked_at: float | None = None
        self._on_critical_error = on_critical_error
        self.wakeups = WakeUps()
        #: Set once by a stop request or a critical error; companions (the front door, the
        #: heartbeat, the metrics refresher) wait on it instead of sleeping through a stop.
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._critical: CriticalError | None = None
        self._critical_reported = False
        self._started = False
        #: set once the store is ready and the transport connected (see :meth:`connected`)
        self._connected = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        #: The last round took all it could, so more is probably due: go again without asking.
        self._full_round = False
        #: When the loop last turned (a round began or a sleep began), on the monotonic clock:
        #: ``/healthz`` says the dispatcher is stuck when this is older than :attr:`stuck_after`.
        self.turned_at = self.clock.monotonic()

        counts = StatsSink()
        self._log_sink = DeliveryLogSink(delivery_log)
        self.summary = SummarySink(counts, self.clock, s.summary_interval.total_seconds(), self._backlog)
        #: Every observer: the dispatcher's own sinks first, then the caller's.
        self.observer = Observers([counts, TracingSink(self.clock), self._log_sink, self.summary, LogSink()])
        if observer is not None:
            self.observer.add(observer)
        #: What it did since it started, and every delivery's lateness (the heartbeat carries it).
        self.stats: DispatchStats = counts.stats
        self.lateness: LatenessHistogram = counts.lateness

        self.breakers = Breakers(s, self.trip, self.clock.monotonic, self.observer)
        self.calls = EngineCalls(store, transport, s, self.breakers)
        self.outages = Outages(s, self.breakers.dispatch, self.clock, self.observer, self.wakeups.event)
        self.progress = Progress()
        self.failures = FailurePolicy(
            self.calls, self.outages, self.observer, self.clock, self.endpoint, lambda: self._stopping
        )
        #: The flow-control limits, for a store that keeps them.
        self.flow = FlowControl(store, self.clock) if isinstance(store, FlowControlStore) else None
        self._parts = engine = StrategyParts(
            self.calls,
            self.failures,
            self.outages,
            self.observer,
            self.wakeups,
            self.clock,
            self.progress,
            self.endpoint,
            lambda: self._stopping,
            self._fetch_failed,
            self.back_off,
            self.flow,
        )
        self.strategy: DeliveryStrategy = (
            ExactlyOnce(engine, store)
            if self.exactly_once and isinstance(store, TransactionalStore)
            else AtLeastOnce(
                engine, claim_ahead=store.parallel_claims if isinstance(store, ClaimPolicy) else True
            )
        )

        #: Keeps the ticks of recurring schedules stored ahead (a store that keeps schedules).
        self.planner = (
            Planner(store, self.clock.now, self.observer) if isinstance(store, RecurringStore) else None
        )

    @property
    def store(self) -> DelayedMessageStore:
        return self.calls.store

    @property
    def transport(self) -> Transport:
        return self.calls.transport

    # The breakers by name, as health checks, metrics and the front door read them.

    @property
    def fetch_breaker(self) -> RepeatedFailuresOverTimeCircuitBreaker:
        return self.breakers.fetch

    @property
    def store_breaker(self) -> RepeatedFailuresOverTimeCircuitBreaker:
        return self.breakers.store

    @property
    def dispatch_breaker(self) -> RepeatedFailuresOverTimeCircuitBreaker:
        return self.breakers.dispatch

    @property
    def recovery_breaker(self) -> FailureRateCircuitBreaker:
        return self.breakers.recovery

    @property
    def delivery_log(self) -> DeliveryLog | None:
        """Opt-in record of every delivery (for ``duetime bulk report``); never delays one."""
        return self._log_sink.log

    @delivery_log.setter
    def delivery_log(self, value: DeliveryLog | None) -> None:
        self._log_sink.log = value

    @property
    def last_batch_at(self) -> datetime | None:
        """The last round that reached the store without failing (wall clock)."""
        return self.progress.last_batch_at

    @property
    def in_flight(self) -> int:
        """Messages this dispatcher holds claimed right now."""
        return self.progress.in_flight

    @property
    def claims_end_by(self) -> datetime | None:
        """When the claims held now end at the latest."""
        return self.progress.claims_end_by

    @property
    def exactly_once(self) -> bool:
        return self.mode is TransactionMode.EXACTLY_ONCE

    async def start(self) -> None:
        """Initialize the store for the endpoint, connect the transport, check the mode."""
        if self._started:
            return
        if self.exactly_once and not (
            isinstance(self.store, TransactionalStore) and self.store.shares_transaction_with(self.transport)
        ):
            raise UnsupportedTransactionMode(
                f"exactly-once needs a transport that shares the store's transaction (e.g. a SQLite "
                f"store and a SQLite queue on the same file); {type(self.store).__name__} with "
                f"{type(self.transport).__name__} cannot. Use at-least-once (what such a pair gets by default) and "
                "deduplicate by message id at the receiver."
            )
        if not await self.reach_store(lambda: self.store.initialize(self.endpoint, self.mode), "starting"):
            return
        await self._align_clock(starting=True)
        await self._connect()
        self._unsubscribe = self.store.subscribe(self.wakeups.on_stored)
        self._started = True
        self._connected.set()

    async def reach_store(self, call: Callable[[], Awaitable[object]], doing: str) -> bool:
        """``call`` the store as a dispatcher starts (setting it up, binding the endpoint). A
        store that does not answer then is an outage like any other: waited out with a back-off
        until the fetch breaker's time ends it (a critical error, exit code 3), as a running
        dispatcher rides it out. A store that refuses this user or database, or wrong settings,
        are said at once. False when a stop was asked for meanwhile."""
        while True:
            try:
                await call()
                if self.fetch_breaker.armed:
                    log.info("the store answers again")
                self.fetch_breaker.success()
                return True
            except (CriticalError, StoreNotReady):
                raise
            except Exception as error:
                if refused_for_good(error):
                    raise
                self.observer.fetch_failed(error)
                log.warning(
                    "the store does not answer while %s (%s); retrying (critical after %g s)",
                    doing,
                    one_line(error),
                    self.fetch_breaker.time_to_trigger,
                )
                self.fetch_breaker.failure(error)
                if self._critical is not None:
                    raise self._critical from None
                if self._stopping:
                    return False
                await self.back_off()

    async def _align_clock(self, *, starting: bool = False) -> None:
        """Follow the store server's clock: measure how far this host's is from it (half a round
        trip's error) and say so at start if it is over SKEW_WARNING. A failed look keeps the
        last offset: the claim that follows meets the same outage and counts it."""
        if self._aligned is None or not isinstance(self.store, ServerClock):
            return
        self._skew_checked_at = self.clock.monotonic()
        before, started = self._aligned.host_now(), self.clock.monotonic()
        try:
            server = await within(
                self.store.server_time(), self.calls.deadline(self.fetch_breaker), "reading the store's clock"
            )
        except Exception as error:
            log.debug("could not read the store's clock: %s", one_line(error))
            return
        if server is None:
            return
        trip = self.clock.monotonic() - started
        offset = server - (before + timedelta(seconds=trip / 2))
        if abs(offset.total_seconds()) <= SKEW_IGNORED + trip / 2:
            offset = timedelta(0)  # agreement within what can be measured: the host's clock is right
        changed = abs((offset - self._aligned.offset).total_seconds()) > SKEW_WARNING
        self._aligned.offset = offset
        if abs(offset.total_seconds()) > SKEW_WARNING and (starting or changed):
            seconds = offset.total_seconds()
            log.warning(
                "this host's clock is %.1f s %s the store's; due times and claims follow the store's "
                "clock (set this host's clock right: NTP)",
                abs(seconds),
                "behind" if seconds > 0 else "ahead of",
            )

    async def _connect(self) -> None:
        """Connect the transport. A transport that is down (a broker restarting) is an outage like
        any other: retry with a back-off, and only the dispatch breaker's time ends it."""
        while True:
            try:
                await self.calls.connect()
            except (ConfigurationError, CriticalError):
                raise  # wrong credentials or settings: waiting will not fix them
            except Exception as error:
                self.outages.down(error, "connecting")
                if self._critical is not None:
                    raise self._critical from None
                if self._stopping:
                    return
                await self.outages.pause()
            else:
                self.outages.up()
                return

    async def connected(self) -> None:
        """Return once the dispatcher has started: its store answered and its transport connected
        (a broker that is down at start is waited for; wrong credentials never get here)."""
        await self._connected.wait()

    def stop(self) -> None:
        """Ask for a graceful stop: the batch in flight is finished, nothing is abandoned."""
        self._stopping = True
        self._stop_requested.set()
        self.wakeups.event.set()

    async def wait_for_stop(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until a stop is asked for (True then)."""
        return await self.clock.wait(self._stop_requested, seconds)

    @property
    def stuck_after(self) -> float:
        """Seconds without a turn of the loop after which it is stuck: the longest sleep, plus a
        call that times out, plus the longest back-off, with room to spare."""
        s = self.settings
        return (
            s.max_sleep.total_seconds()
            + 2 * s.operation_timeout.total_seconds()
            + s.max_failure_backoff.total_seconds()
        )

    def breakers_armed(self) -> dict[str, float | None]:
        """Each breaker's name and, while it is armed, for how many seconds it has been."""
        now = self.clock.monotonic()
        return {b.name: None if b.armed_at is None else now - b.armed_at for b in self.breakers.timed()}

    @property
    def transport_reachable(self) -> bool:
        return self.outages.reachable

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def critical_error(self) -> CriticalError | None:
        """The critical error that stopped it (a tripped breaker), if one did."""
        return self._critical

    @property
    def started(self) -> bool:
        """Whether the store is initialized and the transport connected (and still are)."""
        return self._started

    def trip(self, error: CriticalError) -> None:
        """Stop with ``error`` as the critical error (its callback runs once): what a breaker
        calls when it trips, and what a companion (the front door) calls for its own."""
        if self._critical is None:
            self._critical = error
        self.stop()

    async def _report_critical(self) -> None:
        """Run the critical-error callback exactly once; its own failure is logged, never hidden."""
        if self._critical is None or self._critical_reported:
            return
        self._critical_reported = True
        self.observer.critical(self._critical)
        if self._on_critical_error is None:
            return
        try:
            result = self._on_critical_error(self._critical)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("the critical-error callback failed")

    async def run(self) -> None:
        """Serve until stopped. Raises :class:`CriticalError` if a circuit breaker tripped."""
        planning: asyncio.Future[None] | None = None
        try:
            await self.start()
            self.summary.restart()
            if self.planner is not None:
                planning = asyncio.ensure_future(self.planner.run(self.wait_for_stop))
            while not self._stopping:
                found = await self.dispatch_once()
                if not self._stopping and not (found and self._full_round):
                    # A round that took less than a batch left nothing due behind it: one question
                    # (when is the next due?) instead of another round finding nothing. A message
                    # due by then, or stored meanwhile, makes the wait zero.
                    await self._sleep_until_next_due()
        finally:
            if planning is not None:
                planning.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await planning
            await self._finish()

    async def run_burst(self) -> DispatchStats:
        """Forward everything due now, then return (raises CriticalError like ``run``)."""
        self._parts.burst = True
        try:
            await self.start()
            if self.planner is not None:  # what the schedules have due now is stored first
                await self.planner.plan_once()
            while not self._stopping and await self.dispatch_once():
                pass
        finally:
            await self._finish()
        return self.stats

    async def _finish(self) -> None:
        await self.strategy.finish()
        await self._log_sink.finish()
        self.wakeups.forget_ahead()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._started = False
        self._connected.clear()
        await self._report_critical()
        if self._critical is not None:
            raise self._critical

    async def dispatch_once(self) -> bool:
        """One round: the strategy delivers what is due; True if anything was."""
        self.wakeups.event.clear()
        self.turned_at = started = self.clock.monotonic()
        self.observer.round_started()
        if self._skew_checked_at is not None and started - self._skew_checked_at > SKEW_RECHECK:
            await self._align_clock()
        outcome = await self.strategy.round(self.clock.now())
        self._full_round = outcome.full
        await self.observer.round_ended()
        return outcome.found

    async def _fetch_failed(self, error: Exception) -> None:
        self.observer.fetch_failed(error)
        log.warning("fetching due messages failed: %s", one_line(error))
        self.fetch_breaker.failure(error)
        await self.back_off()

    async def back_off(self) -> None:
        """Back off after a failure (``failure_backoff``), but wake at once for a stop request:
        for the dispatcher's own loop and its companions alike."""
        await self.clock.wait(self.wakeups.event, self.settings.failure_backoff.total_seconds())

    async def _backlog(self) -> StoreCounts | None:
        """The store's counts for the summary line; None when it does not answer in time."""
        try:
            return await within(
                self.store.counts(self.clock.now()),
                self.calls.deadline(self.fetch_breaker),
                "counting the backlog",
            )
        except Exception:  # the summary must never hold up or fail delivery
            return None

    async def _sleep_until_next_due(self) -> None:
        wake = self.wakeups
        ahead = wake.take_ahead()
        try:
            if ahead is not None and ahead.done():  # answered already (by the round's own call)
                next_due = ahead.result()
            else:
                next_due = await within(
                    self.store.next_due() if ahead is None else ahead,
                    self.calls.deadline(self.fetch_breaker),
                    "next due time",
                )
        except Exception as error:
            await self._fetch_failed(error)
            return
        told = wake.take_told()
        if told is not None and (next_due is None or told < next_due):
            next_due = told
        cap = self.settings.max_sleep.total_seconds()
        if next_due is None:
            timeout = cap
        else:  # woken within the budget after it is due (or a claim's time before it, claiming
            # ahead): the round takes what came due meanwhile
            lead = self.strategy.lead
            wake_at = next_due - lead if lead else next_due + self.settings.lateness_budget
            timeout = min(max((wake_at - self.clock.now()).total_seconds(), 0.0), cap)
        owed = self.summary.due_in()
        if owed is not None:
            timeout = min(timeout, owed)
        if self.flow is not None and self.flow.active:
            # a resume or a changed limit gives back what is held: look for one at least this often
            timeout = min(timeout, FLOW_REFRESH_SECONDS)
        wake.target, wake.asleep = next_due, True
        self.turned_at = self.clock.monotonic()
        try:
            if isinstance(self.clock, SystemClock):  # (asyncio's own timer, within the budget)
                slack = min(self.settings.lateness_budget.total_seconds(), TIMER_LATENESS)
                await self.clock.wait(wake.event, timeout, slack=slack)
            else:
                await self.clock.wait(wake.event, timeout)
        finally:
            wake.target, wake.asleep = None, False


def check_dispatcher_inputs(store: object, transport: object) -> None:
    """A clear error when someone passes a URL or the wrong object where a backend belongs."""
    require(store, DelayedMessageStore, "the store", "duetime.open_store(url) opens one from a URL.")
    require(transport, Transport, "the transport", "duetime.open_transport(url) opens one from a URL.")
