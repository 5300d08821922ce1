"""The dispatcher: claim due messages in batches, forward them, remove them, sleep until the next.

This is the seed's poller (``FetchNextDueTimeout`` / ``Next`` / ``Remove`` /
``IncrementFailureCount``) done in batches, woken early by stores, with every sleep capped, with the
seed's circuit breakers, and with a critical error that always reaches its callback.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from duetime.circuit import FailureRateCircuitBreaker, RepeatedFailuresOverTimeCircuitBreaker
from duetime.clock import SystemClock
from duetime.deliverylog import Delivery, DeliveryLog
from duetime.errorqueue import error_headers
from duetime.errors import (
    ConfigurationError,
    CriticalError,
    DestinationNotFound,
    TransportError,
    UnsupportedTransactionMode,
)
from duetime.interfaces import Clock, DelayedMessageStore, TransactionalStore, Transport
from duetime.message import DelayedMessage
from duetime.names import check_name
from duetime.settings import DelayedDeliverySettings, TransactionMode

log = logging.getLogger("duetime.dispatcher")

CriticalErrorCallback = Callable[[CriticalError], Awaitable[None] | None]


@dataclass(slots=True)
class DispatchStats:
    """What the dispatcher did since it started."""

    forwarded: int = 0
    dead_lettered: int = 0
    retries: int = 0
    rounds: int = 0
    fetch_failures: int = 0


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
    ) -> None:
        check_dispatcher_inputs(store, transport)
        #: Opt-in record of every delivery (for ``duetime bulk report``); never delays one.
        self.delivery_log = delivery_log
        self.store = store
        self.transport = transport
        self.settings = settings or DelayedDeliverySettings()
        self.endpoint = check_name("endpoint", endpoint)
        self.clock: Clock = clock or SystemClock()
        self._on_critical_error = on_critical_error
        self.stats = DispatchStats()
        self._wake = asyncio.Event()
        self._stopping = False
        self._critical: CriticalError | None = None
        self._critical_reported = False
        self._target: datetime | None = None
        self._started = False
        self._unsubscribe: Callable[[], None] | None = None
        #: The next batch, claimed while the current one is being sent (at-least-once only).
        self._prefetch: asyncio.Future[list[DelayedMessage]] | None = None
        #: A store with one writer at a time (SQLite) would only queue the claim behind the send.
        self._claim_ahead = bool(getattr(store, "parallel_claims", True))
        s = self.settings
        mono = self.clock.monotonic
        self.fetch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "fetch",
            s.time_to_trigger_fetch_circuit_breaker.total_seconds(),
            self._trip,
            mono,
            "Failed to fetch due delayed messages from the storage.",
        )
        self.store_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "store",
            s.time_to_trigger_store_circuit_breaker.total_seconds(),
            self._trip,
            mono,
            "Failed to store the outcome of delayed message forwarding.",
        )
        self.dispatch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "dispatch",
            s.time_to_trigger_dispatch_circuit_breaker.total_seconds(),
            self._trip,
            mono,
            "Failed to dispatch delayed messages to destination.",
        )
        self.recovery_breaker = FailureRateCircuitBreaker(
            "recovery",
            s.maximum_recovery_failures_per_second,
            self._trip,
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
        await self.transport.start()
        await self.transport.declare(self.settings.error_queue)
        self._unsubscribe = self.store.subscribe(self._on_stored)
        self._started = True

    def stop(self) -> None:
        """Ask for a graceful stop: the batch in flight is finished, nothing is abandoned."""
        self._stopping = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _on_stored(self, due: datetime | None) -> None:
        if due is None or self._target is None or due < self._target:
            self._wake.set()

    def _trip(self, error: CriticalError) -> None:
        if self._critical is None:
            self._critical = error
        self._stopping = True
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
        await self.start()
        try:
            while not self._stopping:
                found = await self.dispatch_once()
                if not found and not self._stopping:
                    await self._sleep_until_next_due()
        finally:
            await self._finish()

    async def run_burst(self) -> DispatchStats:
        """Forward everything due now, then return (raises CriticalError like ``run``)."""
        await self.start()
        try:
            while not self._stopping and await self.dispatch_once():
                pass
        finally:
            await self._finish()
        return self.stats

    async def _finish(self) -> None:
        await self._release_prefetch()
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
        self.stats.rounds += 1
        now = self.clock.now()
        if self.exactly_once:
            return await self._move_once(now)
        try:
            if self._prefetch is not None:
                prefetched, self._prefetch = self._prefetch, None
                batch = await prefetched
            else:
                batch = await self.store.fetch_due(now, self.settings.batch_size)
        except Exception as error:
            await self._fetch_failed(error)
            return False
        self.fetch_breaker.success()
        if batch:
            if len(batch) == self.settings.batch_size and not self._stopping and self._claim_ahead:
                # More is probably due: claim the next batch while this one is sent. Its messages
                # were due when claimed (never early), and are sent only after this batch is
                # removed, so a kill still re-sends at most one batch.
                self._prefetch = asyncio.ensure_future(
                    self.store.fetch_due(self.clock.now(), self.settings.batch_size)
                )
            await self._forward(batch)
        return bool(batch)

    async def _release_prefetch(self) -> None:
        """Give back a batch claimed ahead but not sent (a stop or a critical error came first)."""
        if self._prefetch is None:
            return
        prefetched, self._prefetch = self._prefetch, None
        try:
            batch = await prefetched
            if batch:
                await self.store.release([m.message_id for m in batch])
        except Exception as error:  # its claims time out by themselves; nothing is lost
            log.warning("releasing a batch claimed ahead failed: %s", error)

    async def _move_once(self, now: datetime) -> bool:
        assert isinstance(self.store, TransactionalStore)
        try:
            outcome = await self.store.move_due(
                now,
                self.settings.batch_size,
                self.transport,
                self.settings.error_queue,
                lambda m, reason: error_headers(m, reason, now, m.failure_count),
            )
        except Exception as error:
            await self._fetch_failed(error)
            return False
        self.fetch_breaker.success()
        self.stats.forwarded += len(outcome.moved)
        self.stats.dead_lettered += len(outcome.dead_lettered)
        if self.delivery_log is not None:
            done_at = self.clock.now()
            moved = [
                (DelayedMessage.from_store(m.message_id, m.destination, m.due_at, b"", {}, 0), 1)
                for m in outcome.moved
            ]
            await self._log_deliveries(moved, "delivered", done_at)
            await self._log_deliveries(
                [(m, max(m.failure_count, 1)) for m, _ in outcome.dead_lettered], "dead-lettered", done_at
            )
        for message, reason in outcome.dead_lettered:
            log.warning("message %s sent to the error queue: %s", message.message_id, reason)
        return bool(outcome.moved or outcome.dead_lettered)

    async def _fetch_failed(self, error: Exception) -> None:
        self.stats.fetch_failures += 1
        log.warning("fetching due messages failed: %s", error)
        self.fetch_breaker.failure(error)
        await self._pause()

    async def _pause(self) -> None:
        """Back off after a failure, but wake at once for a stop request."""
        await self.clock.wait(self._wake, self.settings.failure_backoff.total_seconds())

    async def _forward(self, batch: Sequence[DelayedMessage]) -> None:
        try:
            results = await self.transport.send_batch(batch)
            if len(results) != len(batch):
                raise TransportError(f"transport answered {len(results)} results for {len(batch)} messages")
        except Exception as error:
            results = [error] * len(batch)
        sent_at = self.clock.now()
        delivered = [m.message_id for m, r in zip(batch, results, strict=True) if r is None]
        failed = [(m, r) for m, r in zip(batch, results, strict=True) if r is not None]
        if delivered:
            self.stats.forwarded += len(delivered)
            try:
                await self.store.remove_many(delivered)
            except Exception as error:
                # Forwarded but still stored: the claims expire and the messages go again (at-least-once).
                log.warning("removing %d forwarded messages failed: %s", len(delivered), error)
                self.store_breaker.failure(error)
            else:
                self.store_breaker.success()
            if self.delivery_log is not None:  # after the removal: the log never delays it
                done = [(m, m.failure_count + 1) for m, r in zip(batch, results, strict=True) if r is None]
                await self._log_deliveries(done, "delivered", sent_at)
        transport_failures = [(m, e) for m, e in failed if not isinstance(e, DestinationNotFound)]
        if transport_failures:
            self.dispatch_breaker.failure(transport_failures[-1][1])
        elif delivered:
            self.dispatch_breaker.success()
        if failed:
            await self._handle_failures(failed)
        if transport_failures and not self._stopping:
            await self._pause()

    async def _handle_failures(self, failed: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        """Count each failure; dead-letter what is out of retries or has nowhere to go."""
        dead: list[tuple[DelayedMessage, Exception]] = []
        for message, error in failed:
            if isinstance(error, DestinationNotFound):
                dead.append((message, error))
                continue
            attempts = message.failure_count + 1
            if attempts > self.settings.number_of_retries:
                # Still claimed: dead-letter it before anyone else can take it again.
                dead.append((message.with_changes(failure_count=attempts), error))
                continue
            try:
                if not await self.store.increment_failure_count(message.message_id):
                    continue  # cancelled meanwhile
            except Exception as recovery_error:
                self.recovery_breaker.failure(recovery_error)
                continue
            self.stats.retries += 1
            log.info("forwarding %s failed (attempt %d), will retry: %s", message.message_id, attempts, error)
        if dead:
            await self._dead_letter(dead)

    async def _dead_letter(self, dead: Sequence[tuple[DelayedMessage, Exception]]) -> None:
        now = self.clock.now()
        copies = [
            m.with_changes(
                destination=self.settings.error_queue,
                headers=error_headers(m, e, now, max(m.failure_count, 1)),
            )
            for m, e in dead
        ]
        try:
            results = await self.transport.send_batch(copies)
        except Exception as error:
            results = [error] * len(copies)
        sent = [m.message_id for (m, _), r in zip(dead, results, strict=True) if r is None]
        for (message, reason), result in zip(dead, results, strict=True):
            if result is None:
                log.warning("message %s sent to the error queue: %s", message.message_id, reason)
            else:
                self.recovery_breaker.failure(result)
        if sent:
            try:
                await self.store.remove_many(sent)
                self.stats.dead_lettered += len(sent)
            except Exception as error:
                self.recovery_breaker.failure(error)
            if self.delivery_log is not None:
                done = [
                    (m, max(m.failure_count, 1)) for (m, _), r in zip(dead, results, strict=True) if r is None
                ]
                await self._log_deliveries(done, "dead-lettered", now)
        failed = [m.message_id for (m, _), r in zip(dead, results, strict=True) if r is not None]
        if failed:
            try:
                await self.store.release(failed)
            except Exception as error:
                self.recovery_breaker.failure(error)

    async def _log_deliveries(
        self, done: Sequence[tuple[DelayedMessage, int]], outcome: str, at: datetime
    ) -> None:
        """Record (message, attempts) pairs as dispatched ``at``; a failing log costs a warning."""
        if self.delivery_log is None or not done:
            return
        entries = [
            Delivery(m.message_id, m.destination, m.due_at, at, attempts, outcome) for m, attempts in done
        ]
        try:
            await self.delivery_log.record(entries)
        except Exception as error:  # the log is for reports; deliveries never wait on it
            log.warning("writing %d entries to the delivery log failed: %s", len(entries), error)

    async def _sleep_until_next_due(self) -> None:
        try:
            next_due = await self.store.next_due()
        except Exception as error:
            await self._fetch_failed(error)
            return
        cap = self.settings.max_sleep.total_seconds()
        if next_due is None:
            timeout = cap
        else:
            timeout = min(max((next_due - self.clock.now()).total_seconds(), 0.0), cap)
        self._target = next_due
        try:
            await self.clock.wait(self._wake, timeout)
        finally:
            self._target = None


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
    if not isinstance(store, DelayedMessageStore):
        raise ConfigurationError(
            f"store must be a DelayedMessageStore, got {type(store).__name__}; "
            "use duetime.open_store(url) to make one from a URL."
        )
    if not isinstance(transport, Transport):
        raise ConfigurationError(
            f"transport must be a Transport, got {type(transport).__name__}; "
            "use duetime.open_transport(url) to make one from a URL."
        )
