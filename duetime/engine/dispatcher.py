"""The dispatcher: claim due messages in batches, forward them, remove them, sleep until the next.

This is NServiceBus's delayed-delivery poller (``FetchNextDueTimeout`` / ``Next`` / ``Remove`` /
``IncrementFailureCount``) done in batches, woken early by stores, with every sleep capped, with the
same circuit breakers, and with a critical error that always reaches its callback.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from duetime import tracing
from duetime.clock import ServerAlignedClock, SystemClock
from duetime.engine.circuit import FailureRateCircuitBreaker, RepeatedFailuresOverTimeCircuitBreaker
from duetime.engine.deadline import within
from duetime.engine.observe import DispatchObserver, NoObserver
from duetime.engine.pinpoint import send_pinpointing
from duetime.engine.summary import LatenessHistogram, Tally, summary_fields, summary_line
from duetime.errorqueue import KEPT_IN_STORE, error_headers
from duetime.errors import (
    ConfigurationError,
    CriticalError,
    DestinationNotFound,
    MessageInFlight,
    MessageRefused,
    StorageFull,
    TransportError,
    TransportUnavailable,
    UnsupportedTransactionMode,
    one_line,
)
from duetime.inputs.identifiers import check_name
from duetime.interfaces import (
    ClaimPolicy,
    Clock,
    DelayedMessageStore,
    Delivery,
    DeliveryLog,
    ServerClock,
    StoreCounts,
    TransactionalStore,
    Transport,
    require,
)
from duetime.message import DelayedMessage
from duetime.settings import DelayedDeliverySettings, TransactionMode

log = logging.getLogger("duetime.dispatcher")

#: A host clock further than this from the store server's is logged; the server's is looked at
#: again every SKEW_RECHECK seconds (a host clock can be stepped while it runs).
SKEW_WARNING, SKEW_RECHECK = 1.0, 60.0
#: A skew this small (plus half the round trip that measured it) is measuring noise, not a wrong
#: clock: the host's clock is kept as it is, so its own readings and the dispatcher's agree.
SKEW_IGNORED = 0.05
#: Failures another try cannot mend: straight to the error queue, without retries.
NOT_RETRIED = (DestinationNotFound, MessageRefused)
#: How long a message that no queue of its transport can carry waits before it is tried again.
PARKED_FOR = timedelta(hours=1)

#: While a backlog lasts, a transactional move (exactly-once) takes up to this many times
#: ``batch_size`` at once. Each move is one commit, and a commit is one disk flush: 5,000 due at
#: once into a SQLite queue with its consumer drained at 0.42x a bare timer in moves of 100, at
#: 0.84-1.04x growing to 400, 0.65-0.70x growing to 800 (the consumer waits longer for the lock;
#: bench/lateness.py). A crash rolls a move back whole, so its size doubles nothing; a short move
#: (the backlog is gone) brings the size back to ``batch_size``.
MOVE_GROWTH = 4
#: Never more than this in one move, whatever ``batch_size`` is.
MOVE_MOST = 10_000

CriticalErrorCallback = Callable[[CriticalError], Awaitable[None] | None]


class Settled(NamedTuple):
    """A message the dispatcher is done with (delivered, or put in the error queue), as its sinks
    are told of it, whichever way it went (a batch sent, or a transactional move)."""

    message_id: str
    destination: str
    due_at: datetime
    attempts: int
    #: Its W3C ``traceparent`` header, if it has one (the forward span links to it).
    trace: str | None = None


@dataclass(slots=True)
class DispatchStats:
    """What the dispatcher did since it started."""

    forwarded: int = 0
    dead_lettered: int = 0
    retries: int = 0
    rounds: int = 0
    fetch_failures: int = 0
    #: Batches given back to the store because the transport could not be reached.
    outages: int = 0


class Dispatcher:
    """Forwards due messages from ``store`` through ``transport``.

    ``run()`` serves until ``stop()`` (or a critical error, which it raises after the callback has
    run); ``run_burst()`` forwards what is due now and returns, for tests and cron-style use.
    """

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings | None = None,
        *,
        endpoint: str = "duetime",
        clock: Clock | None = None,
        on_critical_error: CriticalErrorCallback | None = None,
        delivery_log: DeliveryLog | None = None,
        observer: DispatchObserver | None = None,
    ) -> None:
        check_dispatcher_inputs(store, transport)
        #: Told what happens as it happens (``duetime.observability.metrics`` makes Prometheus metrics of it).
        self.observer: DispatchObserver = observer or NoObserver()
        #: Opt-in record of every delivery (for ``duetime bulk report``); never delays one.
        self.delivery_log = delivery_log
        self.store = store
        self.transport = transport
        self.settings = settings or DelayedDeliverySettings()
        self.endpoint = check_name("endpoint", endpoint)
        #: Without a clock of the caller's, the system clock, moved onto the store server's time
        #: where the store has one (measured at start and every SKEW_RECHECK seconds).
        self._aligned = ServerAlignedClock() if clock is None else None
        self.clock: Clock = clock or self._aligned or SystemClock()
        self._skew_checked_at: float | None = None
        self._on_critical_error = on_critical_error
        self.stats = DispatchStats()
        self._wake = asyncio.Event()
        #: Set once by a stop request or a critical error; companions (the front door, the
        #: heartbeat, the metrics refresher) wait on it instead of sleeping through a stop.
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._critical: CriticalError | None = None
        self._critical_reported = False
        self._target: datetime | None = None
        #: True while waiting for the next due time (``_target``, None: nothing stored).
        self._asleep = False
        #: The earliest due time told while not asleep: the next wait ends by it.
        self._told: datetime | None = None
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None
        #: The next batch, claimed while the current one is being sent (at-least-once only).
        self._prefetch: asyncio.Future[list[DelayedMessage]] | None = None
        #: The next due time, asked while a short batch is sent (at-least-once only); kept only
        #: if every message of the batch is delivered and removed.
        self._ahead: asyncio.Future[datetime | None] | None = None
        #: A store with one writer at a time (SQLite) would only queue the claim behind the send.
        self._claim_ahead = store.parallel_claims if isinstance(store, ClaimPolicy) else True
        #: How many messages the last transactional move took (for the batch observation).
        self._moved_last = 0
        #: How many the next transactional move may take: ``batch_size``, doubling while each
        #: move comes back full (a backlog), up to :data:`MOVE_GROWTH` times it.
        self._move_limit = self.settings.batch_size
        #: The last round took a whole batch, so more is probably due: go again without asking.
        self._full_round = False
        #: Consecutive rounds the transport could not be reached: the reconnect back-off doubles.
        self._unreachable = 0
        #: For the periodic summary line: lateness since the last one, and where the counts stood.
        #: Every forwarded message's lateness since the start (the heartbeat carries it, so the
        #: dashboard can chart lateness over time); the summary line reports the change.
        self.lateness = LatenessHistogram()
        self._lateness_base = self.lateness.copy()
        self._summary_at = 0.0
        self._summary_base = Tally()
        #: When the loop last turned (a round began or a sleep began), on the monotonic clock:
        #: ``/healthz`` says the dispatcher is stuck when this is older than :attr:`stuck_after`.
        self.turned_at = self._round_started = self.clock.monotonic()
        #: The last round that reached the store without failing (wall clock).
        self.last_batch_at: datetime | None = None
        #: Messages this dispatcher holds claimed right now, and when those claims end at the latest.
        self.in_flight = 0
        self.claims_end_by: datetime | None = None
        s = self.settings
        mono = self.clock.monotonic
        self.fetch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "fetch",
            s.time_to_trigger_fetch_circuit_breaker.total_seconds(),
            self.trip,
            mono,
            "Failed to fetch due delayed messages from the storage.",
        )
        self.store_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "store",
            s.time_to_trigger_store_circuit_breaker.total_seconds(),
            self.trip,
            mono,
            "Failed to store the outcome of delayed message forwarding.",
        )
        self.dispatch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "dispatch",
            s.time_to_trigger_dispatch_circuit_breaker.total_seconds(),
            self.trip,
            mono,
            "Failed to dispatch delayed messages to destination.",
        )
        self.recovery_breaker = FailureRateCircuitBreaker(
            "recovery",
            s.maximum_recovery_failures_per_second,
            self.trip,
            mono,
            "Failed to execute error handling for delayed message forwarding.",
        )

    @property
    def exactly_once(self) -> bool:
        return self.settings.transaction_mode is TransactionMode.EXACTLY_ONCE

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
                f"{type(self.transport).__name__} cannot. Use at-least-once (the default) and "
                "deduplicate by message id at the receiver."
            )
        await self.store.initialize(self.endpoint, self.settings.transaction_mode)
        await self._align_clock(starting=True)
        await self._connect()
        self._unsubscribe = self.store.subscribe(self._on_stored)
        self._started = True

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
                self.store.server_time(), self._deadline(self.fetch_breaker), "reading the store's clock"
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
        seconds = self._deadline(self.dispatch_breaker)
        while True:
            try:
                await within(self.transport.start(), seconds, "connecting the transport")
                await within(
                    self.transport.declare(self.settings.error_queue), seconds, "declaring the error queue"
                )
            except (ConfigurationError, CriticalError):
                raise  # wrong credentials or settings: waiting will not fix them
            except Exception as error:
                self._transport_unreachable(error, "connecting")
                if self._critical is not None:
                    raise self._critical from None
                if self._stopping:
                    return
                await self._reconnect_pause()
            else:
                self._transport_reachable()
                return

    def _deadline(self, breaker: RepeatedFailuresOverTimeCircuitBreaker) -> float:
        """A call's deadline: ``operation_timeout``, but at most half the breaker's time, so a
        partition shows up as failures in time to trip the breaker when it should."""
        return min(self.settings.operation_timeout.total_seconds(), breaker.time_to_trigger / 2)

    def _transport_unreachable(self, error: BaseException, doing: str) -> None:
        self._unreachable += 1
        self.stats.outages += 1
        log.warning(
            "transport %s while %s (%s); messages stay stored, retrying (critical after %g s)",
            "full (it cannot write)" if isinstance(error, StorageFull) else "unreachable",
            doing,
            one_line(error),
            self.dispatch_breaker.time_to_trigger,
        )
        self.dispatch_breaker.failure(error)

    def _transport_reachable(self) -> None:
        if self._unreachable:
            log.info("transport reachable again after %d failed attempt(s)", self._unreachable)
        self._unreachable = 0

    async def _reconnect_pause(self) -> None:
        """Back off while the transport is down: ``failure_backoff``, doubling to the maximum."""
        first = self.settings.failure_backoff.total_seconds()
        longest = self.settings.max_failure_backoff.total_seconds()
        pause = min(first * 2 ** max(self._unreachable - 1, 0), longest)
        breaker = self.dispatch_breaker
        if breaker.armed_at is not None:  # look again when the breaker is due, not later
            left = breaker.armed_at + breaker.time_to_trigger - self.clock.monotonic()
            pause = min(pause, max(left, 0.0) + 0.001)
        await self.clock.wait(self._wake, pause)

    def stop(self) -> None:
        """Ask for a graceful stop: the batch in flight is finished, nothing is abandoned."""
        self._stopping = True
        self._stop_requested.set()
        self._wake.set()

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

    def breakers(self) -> dict[str, float | None]:
        """Each breaker's name and, while it is armed, for how many seconds it has been."""
        now = self.clock.monotonic()
        return {
            b.name: None if b.armed_at is None else now - b.armed_at
            for b in (self.fetch_breaker, self.store_breaker, self.dispatch_breaker)
        }

    @property
    def transport_reachable(self) -> bool:
        return self._unreachable == 0

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

    def _on_stored(self, due: datetime | None) -> None:
        """A store's word that something changed: the earliest due time, or None (unknown).

        Asleep, the dispatcher wakes if that is before the time it sleeps until. Mid-round, a
        known due time is kept for the coming wait instead of waking it: waking made a second
        round that found nothing whenever something was stored for later while a round ran — and
        in a SQLite file shared with a consumer, every message's receipt and acknowledgement came
        in as such a word.
        """
        if due is not None and not self._asleep:
            self._told = due if self._told is None else min(self._told, due)
        elif due is None or self._target is None or due < self._target:
            self._wake.set()

    def trip(self, error: CriticalError) -> None:
        """Stop with ``error`` as the critical error (its callback runs once): what a breaker
        calls when it trips, and what a companion (the front door) calls for its own."""
        if self._critical is None:
            self._critical = error
        self._stopping = True
        self._stop_requested.set()
        self._wake.set()

    async def _report_critical(self) -> None:
        """Run the critical-error callback exactly once; its own failure is logged, never hidden."""
        if self._critical is None or self._critical_reported:
            return
        self._critical_reported = True
        log.critical("%s", self._critical)
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
        try:
            await self.start()
            self._summary_at = self.clock.monotonic()
            while not self._stopping:
                found = await self.dispatch_once()
                await self._maybe_summarize()
                if not self._stopping and not (found and self._full_round):
                    # A round that took less than a batch left nothing due behind it: one question
                    # (when is the next due?) instead of another round finding nothing. A message
                    # due by then, or stored meanwhile, makes the wait zero.
                    await self._sleep_until_next_due()
        finally:
            await self._finish()

    async def run_burst(self) -> DispatchStats:
        """Forward everything due now, then return (raises CriticalError like ``run``)."""
        try:
            await self.start()
            while not self._stopping and await self.dispatch_once():
                pass
        finally:
            await self._finish()
        return self.stats

    async def _finish(self) -> None:
        await self._release_prefetch()
        self._forget_ahead()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._started = False
        await self._report_critical()
        if self._critical is not None:
            raise self._critical

    async def dispatch_once(self) -> bool:
        """One round: claim a batch and handle it. True if anything was due."""
        self._wake.clear()
        self._full_round = False
        self.stats.rounds += 1
        self.turned_at = started = self._round_started = self.clock.monotonic()
        if self._skew_checked_at is not None and started - self._skew_checked_at > SKEW_RECHECK:
            await self._align_clock()
        now = self.clock.now()
        if self.exactly_once:
            limit = self._move_limit
            found = await self._move_once(now, limit)
            self._full_round = self._moved_last >= limit
            self._move_limit = (
                min(limit * 2, self.settings.batch_size * MOVE_GROWTH, MOVE_MOST)
                if self._full_round
                else self.settings.batch_size
            )
            if found:
                self.observer.batch(self._moved_last, self.clock.monotonic() - started)
            return found
        seconds = self._deadline(self.fetch_breaker)
        try:
            if self._prefetch is not None:
                prefetched, self._prefetch = self._prefetch, None
                batch = await within(prefetched, seconds, "claiming due messages")
            else:
                batch = await within(
                    self.store.fetch_due(now, self.settings.batch_size), seconds, "claiming due messages"
                )
        except Exception as error:
            await self._fetch_failed(error)
            return False
        self.fetch_breaker.success()
        self.last_batch_at = self.clock.now()
        if batch:
            self._full_round = len(batch) >= self.settings.batch_size
            self.observer.claimed(len(batch))
            self.in_flight = len(batch)
            self.claims_end_by = now + self.settings.claim_timeout
            if len(batch) == self.settings.batch_size and not self._stopping and self._claim_ahead:
                # More is probably due: claim the next batch while this one is sent. Its messages
                # were due when claimed (never early), and are sent only after this batch is
                # removed, so a kill still re-sends at most one batch.
                self._prefetch = asyncio.ensure_future(
                    self.store.fetch_due(self.clock.now(), self.settings.batch_size)
                )
            elif not self._stopping:
                # A short batch: nothing else is due, and the wait that follows needs the next
                # due time. Asked now, the question runs beside the send and removal instead of
                # after them — a fifth of each round, when messages come a few ms apart. The
                # batch is hidden from it (claimed or locked); anything stored meanwhile is told.
                self._forget_ahead()
                self._told = None
                self._ahead = asyncio.ensure_future(self.store.next_due())
            try:
                await self._forward(batch)
            finally:
                self.in_flight = 0
            self.observer.batch(len(batch), self.clock.monotonic() - started)
        return bool(batch)

    def _forget_ahead(self) -> None:
        """Drop the next due time asked ahead: a message given back or failed is due again, which
        that answer (asked while it was claimed) does not know."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            ahead.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _release_prefetch(self) -> None:
        """Give back a batch claimed ahead but not sent (a stop or a critical error came first)."""
        if self._prefetch is None:
            return
        prefetched, self._prefetch = self._prefetch, None
        seconds = self._deadline(self.store_breaker)
        try:
            batch = await within(prefetched, seconds, "claiming due messages")
            if batch:
                await within(self.store.release([m.message_id for m in batch]), seconds, "releasing claims")
        except Exception as error:  # its claims time out by themselves; nothing is lost
            log.warning("releasing a batch claimed ahead failed: %s", error)

    async def _move_once(self, now: datetime, limit: int) -> bool:
        assert isinstance(self.store, TransactionalStore)
        try:
            outcome = await within(
                self.store.move_due(
                    now,
                    limit,
                    self.transport,
                    self.settings.error_queue,
                    lambda m, reason: error_headers(m, reason, now, m.failure_count, endpoint=self.endpoint),
                ),
                self._deadline(self.fetch_breaker),
                "moving due messages",
            )
        except Exception as error:
            await self._fetch_failed(error)
            return False
        self.fetch_breaker.success()
        moved_at = self.last_batch_at = self.clock.now()
        self._moved_last = len(outcome.moved) + len(outcome.dead_lettered)
        if self._moved_last:
            self.observer.claimed(self._moved_last)
        await self._delivered(
            [Settled(m.message_id, m.destination, m.due_at, 1, m.trace) for m in outcome.moved], moved_at
        )
        for message, reason in outcome.dead_lettered:
            log.warning("message %s sent to the error queue: %s", message.message_id, reason)
        await self._dead_lettered([m for m, _ in outcome.dead_lettered], moved_at)
        return bool(outcome.moved or outcome.dead_lettered)

    async def _fetch_failed(self, error: Exception) -> None:
        self.stats.fetch_failures += 1
        log.warning("fetching due messages failed: %s", one_line(error))
        self.fetch_breaker.failure(error)
        await self.back_off()

    async def back_off(self) -> None:
        """Back off after a failure (``failure_backoff``), but wake at once for a stop request:
        for the dispatcher's own loop and its companions alike."""
        await self.clock.wait(self._wake, self.settings.failure_backoff.total_seconds())

    async def _forward(self, batch: Sequence[DelayedMessage]) -> None:
        try:
            results = await self._send(batch, "sending a batch")
        except Exception as error:
            # The transport failed as a whole (its contract answers per message otherwise): an
            # outage, not a failure of these messages. They go back to the store untouched.
            self._forget_ahead()
            await self._give_back(batch, error, "sending")
            return
        sent_at = self.clock.now()
        delivered = [m.message_id for m, r in zip(batch, results, strict=True) if r is None]
        unreachable = [m for m, r in zip(batch, results, strict=True) if isinstance(r, TransportUnavailable)]
        failed = [
            (m, r)
            for m, r in zip(batch, results, strict=True)
            if r is not None and not isinstance(r, TransportUnavailable)
        ]
        if delivered:
            if not await self._remove(delivered):
                self._forget_ahead()
            await self._delivered(  # after the removal: no sink ever delays it
                [
                    Settled(
                        m.message_id, m.destination, m.due_at, m.failure_count + 1, tracing.traced(m.headers)
                    )
                    for m, r in zip(batch, results, strict=True)
                    if r is None
                ],
                sent_at,
            )
        if len(delivered) < len(batch):
            self._forget_ahead()
        transport_failures = [(m, e) for m, e in failed if not isinstance(e, NOT_RETRIED)]
        if unreachable:
            first = next(r for r in results if isinstance(r, TransportUnavailable))
            assert first is not None
            await self._give_back(unreachable, first, "sending", pause=False)
        elif transport_failures:
            self.dispatch_breaker.failure(transport_failures[-1][1])
        elif delivered:
            self.dispatch_breaker.success()
            self._transport_reachable()
        if failed:
            await self._handle_failures(failed)
        if (transport_failures or unreachable) and not self._stopping:
            await (self._reconnect_pause() if unreachable else self.back_off())

    async def _send(self, batch: Sequence[DelayedMessage], doing: str) -> list[Exception | None]:
        """One result per message, a connection lost mid-batch traced to the message that loses it
        (:mod:`duetime.engine.pinpoint`); raises when the transport fails as a whole."""
        seconds = self._deadline(self.dispatch_breaker)

        async def send(part: Sequence[DelayedMessage]) -> list[Exception | None]:
            results = await within(self.transport.send_batch(part), seconds, doing)
            if len(results) != len(part):
                raise TransportError(f"transport answered {len(results)} results for {len(part)} messages")
            return results

        async def probe() -> None:
            await within(self.transport.start(), seconds, "connecting the transport")
            await within(
                self.transport.declare(self.settings.error_queue), seconds, "declaring the error queue"
            )

        return await send_pinpointing(batch, send, probe)

    async def _remove(self, message_ids: Sequence[str]) -> bool:
        """Remove forwarded messages; a failure is the store's (their claims expire, they go again)."""
        try:
            await within(
                self.store.remove_many(message_ids),
                self._deadline(self.store_breaker),
                "removing forwarded messages",
            )
        except Exception as error:
            log.warning("removing %d forwarded messages failed: %s", len(message_ids), one_line(error))
            self.store_breaker.failure(error)
            return False
        self.store_breaker.success()
        return True

    async def _give_back(
        self, batch: Sequence[DelayedMessage], error: BaseException, doing: str, *, pause: bool = True
    ) -> None:
        """The transport is down: count one outage, release the claims, back off."""
        self._transport_unreachable(error, doing)
        try:
            await within(
                self.store.release([m.message_id for m in batch]),
                self._deadline(self.store_breaker),
                "releasing claims",
            )
        except Exception as release_error:  # the claims expire by themselves; nothing is lost
            log.warning("releasing %d claims failed: %s", len(batch), one_line(release_error))
        if pause and not self._stopping:
            await self._reconnect_pause()

    async def _handle_failures(self, failed: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        """Count each failure; dead-letter what is out of retries or has nowhere to go."""
        dead: list[tuple[DelayedMessage, Exception]] = []
        for message, error in failed:
            if isinstance(error, NOT_RETRIED):  # another try cannot go otherwise
                dead.append((message, error))
                continue
            attempts = message.failure_count + 1
            if attempts > self.settings.number_of_retries:
                # Still claimed: dead-letter it before anyone else can take it again.
                dead.append((message.with_changes(failure_count=attempts), error))
                continue
            try:
                counted = await within(
                    self.store.increment_failure_count(message.message_id),
                    self._deadline(self.store_breaker),
                    "counting a failure",
                )
            except Exception as recovery_error:  # the recovery breaker counts exactly these
                self.recovery_breaker.failure(recovery_error)
                continue
            if not counted:
                continue  # cancelled meanwhile
            self.stats.retries += 1
            self.observer.retried(message.destination)
            log.info("forwarding %s failed (attempt %d), will retry: %s", message.message_id, attempts, error)
        if dead:
            await self._dead_letter(dead)

    async def _dead_letter(self, dead: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        now = self.clock.now()
        copies = [
            m.with_changes(
                destination=self.settings.error_queue,
                headers=error_headers(m, e, now, max(m.failure_count, 1), endpoint=self.endpoint),
            )
            for m, e in dead
        ]
        try:
            results = await self._send(copies, "sending to the error queue")
        except Exception as error:  # the transport as a whole is down: an outage, not these messages'
            await self._give_back([m for m, _ in dead], error, "sending to the error queue", pause=False)
            return
        sent = [(m, e) for (m, e), r in zip(dead, results, strict=True) if r is None]
        unreachable = [
            m for (m, _), r in zip(dead, results, strict=True) if isinstance(r, TransportUnavailable)
        ]
        refused = [
            (m, r)
            for (m, _), r in zip(dead, results, strict=True)
            if r is not None and not isinstance(r, TransportUnavailable)
        ]
        for message, reason in sent:
            log.warning("message %s sent to the error queue: %s", message.message_id, one_line(reason))
        if sent and await self._remove([m.message_id for m, _ in sent]):
            await self._dead_lettered([m for m, _ in sent], now)
        if unreachable:
            first = next(r for r in results if isinstance(r, TransportUnavailable))
            assert first is not None
            await self._give_back(unreachable, first, "sending to the error queue", pause=False)
        uncarriable = [(m, r) for m, r in refused if isinstance(r, MessageRefused)]
        if uncarriable:  # the error queue is on the same server, with the same limits
            await self._park(uncarriable)
        refused = [(m, r) for m, r in refused if not isinstance(r, MessageRefused)]
        for _, result in refused:  # the error queue refused these: error handling failed for them
            self.recovery_breaker.failure(result)
        if refused:
            try:
                await within(
                    self.store.release([m.message_id for m, _ in refused]),
                    self._deadline(self.store_breaker),
                    "releasing claims",
                )
            except Exception as error:
                self.store_breaker.failure(error)

    async def _park(self, parked: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        """Messages that neither their destination nor the error queue can carry stay in the store,
        their failure counted and their due time :data:`PARKED_FOR` ahead, each logged once as an
        error with the reason: visible in ``duetime list --failing``, tried again later (after a
        fix of the server's limit, or of the message), never an outage and never a busy loop."""
        until = self.clock.now() + PARKED_FOR
        for message, reason in parked:
            log.error(
                "message %s can be carried neither to %s nor to the error queue: %s; it stays stored "
                "and is tried again at %s (fix the server's limit, or cancel it: duetime cancel %s)",
                message.message_id,
                message.destination,
                one_line(reason),
                until.isoformat(timespec="seconds"),
                message.message_id,
            )
            try:
                await within(
                    self.store.increment_failure_count(message.message_id),
                    self._deadline(self.store_breaker),
                    "counting a failure",
                )
                await within(
                    self.store.reschedule(message.message_id, until),
                    self._deadline(self.store_breaker),
                    "putting an undeliverable message aside",
                )
            except MessageInFlight:
                pass  # claimed again by a dispatcher between the two calls: it puts it aside
            except Exception as error:  # its claim expires; it is tried again then
                self.store_breaker.failure(error)
        await self._notice_kept([(m, r) for m, r in parked if m.failure_count == 0])

    async def _notice_kept(self, kept: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        """Put a notice of each message kept in the store (the first time it is put aside) into
        the error queue: the reason and where it was going, without its body and its own headers
        (what could not be carried), so ``errors list`` and the dashboard show it; retrying the
        notice reschedules the stored message, discarding it cancels the message."""
        if not kept:
            return
        now = self.clock.now()
        notices = [
            DelayedMessage(
                m.message_id,
                self.settings.error_queue,
                now,
                b"",
                {
                    **error_headers(m.with_changes(headers={}), e, now, 1, endpoint=self.endpoint),
                    KEPT_IN_STORE: "true",
                },
            )
            for m, e in kept
        ]
        try:
            results = await within(
                self.transport.send_batch(notices),
                self._deadline(self.dispatch_breaker),
                "noting kept messages in the error queue",
            )
        except Exception as error:
            results = [error] * len(notices)
        for (m, _), result in zip(kept, results, strict=True):
            if result is not None:
                log.warning("could not note %s in the error queue: %s", m.message_id, one_line(result))

    async def _delivered(self, sent: Sequence[Settled], at: datetime) -> None:
        """Every sink told of messages delivered at ``at``, in one place for both ways of
        delivering: the stats, the lateness histogram, the observer (metrics), the trace, the
        delivery log."""
        if not sent:
            return
        self.stats.forwarded += len(sent)
        lateness = [(s.destination, (at - s.due_at).total_seconds()) for s in sent]
        self.lateness.add(late for _, late in lateness)
        self.observer.forwarded(lateness)
        if tracing.enabled():
            tracing.forwarded(
                [(s.destination, s.trace) for s in sent], self.clock.monotonic() - self._round_started
            )
        await self._log_deliveries(sent, "delivered", at)

    async def _dead_lettered(self, dead: Sequence[DelayedMessage], at: datetime) -> None:
        """Every sink told of messages put in the error queue at ``at`` (and removed)."""
        if not dead:
            return
        self.stats.dead_lettered += len(dead)
        self.observer.dead_lettered([m.destination for m in dead])
        await self._log_deliveries(
            [Settled(m.message_id, m.destination, m.due_at, max(m.failure_count, 1)) for m in dead],
            "dead-lettered",
            at,
        )

    async def _log_deliveries(self, done: Sequence[Settled], outcome: str, at: datetime) -> None:
        """Record messages as dispatched ``at``; a failing log costs a warning, never a message."""
        if self.delivery_log is None or not done:
            return
        entries = [Delivery(d.message_id, d.destination, d.due_at, at, d.attempts, outcome) for d in done]
        try:
            await self.delivery_log.record(entries)
        except Exception as error:  # the log is for reports; deliveries never wait on it
            log.warning("writing %d entries to the delivery log failed: %s", len(entries), error)

    def _tally(self) -> Tally:
        s = self.stats
        return Tally(s.forwarded, s.dead_lettered, s.retries, s.outages)

    def _summary_due_in(self) -> float | None:
        """Seconds until a summary is owed (something happened since the last), else None: an
        idle dispatcher wakes for it rather than leaving the last minute's work unreported."""
        interval = self.settings.summary_interval.total_seconds()
        if interval <= 0 or not self._tally().minus(self._summary_base):
            return None
        return max(0.0, self._summary_at + interval - self.clock.monotonic())

    async def _maybe_summarize(self) -> None:
        """Log the summary line when ``summary_interval`` has passed and something happened."""
        interval = self.settings.summary_interval.total_seconds()
        now = self.clock.monotonic()
        if interval <= 0 or now - self._summary_at < interval:
            return
        current = self._tally()
        done, elapsed = current.minus(self._summary_base), now - self._summary_at
        lateness, self._lateness_base = self.lateness.minus(self._lateness_base), self.lateness.copy()
        self._summary_at, self._summary_base = now, current
        if not done:
            return
        try:
            backlog: StoreCounts | None = await within(
                self.store.counts(self.clock.now()),
                self._deadline(self.fetch_breaker),
                "counting the backlog",
            )
        except Exception:  # the summary must never hold up or fail delivery
            backlog = None
        fields = summary_fields(round(elapsed), done, lateness, backlog)
        log.info(summary_line(round(elapsed), done, lateness, backlog), extra={"fields": fields})

    async def _sleep_until_next_due(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            self._told = None  # what was told before this question, its answer includes
        try:
            next_due = await within(
                self.store.next_due() if ahead is None else ahead,
                self._deadline(self.fetch_breaker),
                "next due time",
            )
        except Exception as error:
            await self._fetch_failed(error)
            return
        told, self._told = self._told, None
        if told is not None and (next_due is None or told < next_due):
            next_due = told
        cap = self.settings.max_sleep.total_seconds()
        if next_due is None:
            timeout = cap
        else:
            timeout = min(max((next_due - self.clock.now()).total_seconds(), 0.0), cap)
        owed = self._summary_due_in()
        if owed is not None:
            timeout = min(timeout, owed)
        self._target, self._asleep = next_due, True
        self.turned_at = self.clock.monotonic()
        try:
            await self.clock.wait(self._wake, timeout)
        finally:
            self._target, self._asleep = None, False


async def run_until_signal(dispatcher: Dispatcher, *extra: Awaitable[None]) -> None:
    """Run the dispatcher (and companions such as the front door) until SIGTERM/SIGINT."""
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, dispatcher.stop)
    try:
        await asyncio.gather(dispatcher.run(), *extra)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def check_dispatcher_inputs(store: object, transport: object) -> None:
    """A clear error when someone passes a URL or the wrong object where a backend belongs."""
    require(store, DelayedMessageStore, "the store", "duetime.open_store(url) opens one from a URL.")
    require(transport, Transport, "the transport", "duetime.open_transport(url) opens one from a URL.")
