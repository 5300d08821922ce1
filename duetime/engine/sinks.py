"""The engine's own observers: what a dispatcher counts, charts, traces, records and reports.

Each is a :class:`~duetime.engine.observe.DispatchObserver` fed by the same events as a user's
observer; the dispatcher owns one of each and knows them only as observers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from duetime import tracing
from duetime.engine.observe import DispatchObserver, Settled
from duetime.engine.summary import LatenessHistogram, Tally, summary_fields, summary_line
from duetime.errors import CriticalError, one_line
from duetime.interfaces import Clock, Delivery, DeliveryLog, StoreCounts
from duetime.message import DelayedMessage

log = logging.getLogger("duetime.dispatcher")
circuit_log = logging.getLogger("duetime.circuit")


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

    def tally(self) -> Tally:
        """The counts the summary line reports."""
        return Tally(self.forwarded, self.dead_lettered, self.retries, self.outages)


class StatsSink(DispatchObserver):
    """Keeps :class:`DispatchStats` and the lateness of every delivery since the start (the
    heartbeat carries it, so the dashboard can chart lateness over time)."""

    def __init__(self) -> None:
        self.stats = DispatchStats()
        self.lateness = LatenessHistogram()

    def round_started(self) -> None:
        self.stats.rounds += 1

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        self.stats.forwarded += len(done)
        self.lateness.add(s.lateness(at) for s in done if not s.held)  # a limit's wait is not lateness

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        self.stats.dead_lettered += len(done)

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        self.stats.retries += 1

    def unreachable(self, error: BaseException, doing: str) -> None:
        self.stats.outages += 1

    def fetch_failed(self, error: Exception) -> None:
        self.stats.fetch_failures += 1


class TracingSink(DispatchObserver):
    """One ``duetime forward`` span per delivered batch, from the round's start to delivery."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._round_started = clock.monotonic()

    def round_started(self) -> None:
        self._round_started = self.clock.monotonic()

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        if tracing.enabled():
            tracing.forwarded(
                [(s.destination, s.trace) for s in done], self.clock.monotonic() - self._round_started
            )


#: Entries kept for a delivery log that is slow or hangs; past this, the oldest are given up.
MOST_WAITING = 100_000
#: Seconds a stopping dispatcher waits for the delivery log to take what is left.
FLUSH_WITHIN = 5.0


class DeliveryLogSink(DispatchObserver):
    """Records every delivery and dead-lettering in the opt-in delivery log (for ``duetime bulk
    report``), written by a task of its own once the round is settled: a log that fails, is slow
    or never answers costs a warning (past :data:`MOST_WAITING` entries waiting, the oldest
    entries), never a delivery and never a stop. One write is in flight at a time: a write
    that hangs is not abandoned for another, which would hang beside it."""

    def __init__(self, delivery_log: DeliveryLog | None) -> None:
        self.log = delivery_log
        self._pending: list[Delivery] = []
        self._waiting: list[Delivery] = []
        self._writing: asyncio.Future[None] | None = None
        self._given_up = 0

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        self._keep(done, "delivered", at)

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        self._keep(done, "dead-lettered", at)

    def _keep(self, done: Sequence[Settled], outcome: str, at: datetime) -> None:
        if self.log is not None:
            self._pending.extend(
                Delivery(
                    d.message_id, d.destination, d.due_at, d.delivered_at or at, d.attempts, outcome, d.held
                )
                for d in done
            )

    async def round_ended(self) -> None:
        if self.log is None or not self._pending:
            return
        self._waiting += self._pending
        self._pending = []
        over = len(self._waiting) - MOST_WAITING
        if over > 0:
            if not self._given_up:
                log.warning(
                    "the delivery log does not keep up (or does not answer): %d entries wait; the "
                    "oldest are given up until it does (deliveries go on)",
                    MOST_WAITING,
                )
            self._given_up += over
            del self._waiting[:over]
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        assert self.log is not None
        while self._waiting:
            entries, self._waiting = self._waiting, []
            try:
                await self.log.record(entries)
            except Exception as error:  # the log is for reports; deliveries never wait on it
                log.warning(
                    "writing %d entries to the delivery log failed: %s", len(entries), one_line(error)
                )
            if self._given_up and not self._waiting:
                log.info("the delivery log keeps up again; %d entries were given up", self._given_up)
                self._given_up = 0

    async def finish(self, seconds: float = FLUSH_WITHIN) -> None:
        """At a stop: what waits is written, for ``seconds`` at most (a log that hangs is left)."""
        await self.round_ended()
        writing = self._writing
        if writing is None or writing.done():
            return
        done, _ = await asyncio.wait([writing], timeout=seconds)
        if not done:
            left = len(self._waiting) + self._given_up
            log.warning(
                "the delivery log did not answer within %g s of the stop; the entries of the last "
                "batches%s are not written",
                seconds,
                f" and {left:,} more" if left else "",
            )
            writing.cancel()  # (a write on a thread of its own goes on there, alone)


class SummarySink(DispatchObserver):
    """The periodic summary line: what happened since the last one, lateness, and the backlog.

    ``backlog`` asks the store for its counts (None when it does not answer: the summary must never
    hold up or fail delivery)."""

    def __init__(
        self,
        counts: StatsSink,
        clock: Clock,
        interval: float,
        backlog: Callable[[], Awaitable[StoreCounts | None]],
    ) -> None:
        self.counts = counts
        self.clock = clock
        self.interval = interval
        self.backlog = backlog
        self._at = clock.monotonic()
        self._base = Tally()
        self._lateness_base = LatenessHistogram()

    def restart(self) -> None:
        """Count the first interval from now (the dispatcher starts serving)."""
        self._at = self.clock.monotonic()

    def due_in(self) -> float | None:
        """Seconds until a summary is owed (something happened since the last), else None: an
        idle dispatcher wakes for it rather than leaving the last minute's work unreported."""
        if self.interval <= 0 or not self.counts.stats.tally().minus(self._base):
            return None
        return max(0.0, self._at + self.interval - self.clock.monotonic())

    async def round_ended(self) -> None:
        """Log the summary line when the interval has passed and something happened."""
        now = self.clock.monotonic()
        if self.interval <= 0 or now - self._at < self.interval:
            return
        current, lateness = self.counts.stats.tally(), self.counts.lateness
        done, elapsed = current.minus(self._base), now - self._at
        since, self._lateness_base = lateness.minus(self._lateness_base), lateness.copy()
        self._at, self._base = now, current
        if not done:
            return
        backlog = await self.backlog()
        fields = summary_fields(round(elapsed), done, since, backlog)
        log.info(summary_line(round(elapsed), done, since, backlog), extra={"fields": fields})


class LogSink(DispatchObserver):
    """The line each outcome is logged with, written once here: what went to the error queue and
    why, a retry, a message parked, a circuit breaker armed, disarmed or tripped, the critical
    error. The engine only tells what happened."""

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        for s in done:
            log.warning("message %s sent to the error queue: %s", s.message_id, s.reason)

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        log.info("forwarding %s failed (attempt %d), will retry: %s", message.message_id, attempts, error)

    def parked(self, message: DelayedMessage, reason: BaseException, until: datetime) -> None:
        log.error(
            "message %s can be carried neither to %s nor to the error queue: %s; it stays stored "
            "and is tried again at %s (fix the server's limit, or cancel it: duetime cancel %s)",
            message.message_id,
            message.destination,
            one_line(reason),
            until.isoformat(timespec="seconds"),
            message.message_id,
        )

    def breaker_armed(self, name: str, error: BaseException) -> None:
        circuit_log.warning("circuit breaker %s armed: %s", name, error)

    def breaker_disarmed(self, name: str, failures: int) -> None:
        circuit_log.info("circuit breaker %s disarmed after %d failures", name, failures)

    def breaker_tripped(self, name: str, failures: int, error: CriticalError) -> None:
        circuit_log.error("circuit breaker %s tripped after %d failures", name, failures)

    def critical(self, error: CriticalError) -> None:
        log.critical("%s", error)
