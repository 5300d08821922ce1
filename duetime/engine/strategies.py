"""How a round delivers what is due: two strategies behind one interface.

- :class:`AtLeastOnce` claims a batch, sends it, removes what was carried. A crash between the
  send and the removal sends that batch again (at most one batch): the receiver deduplicates by
  message id. It claims ``claim_window`` ahead: what comes due within it is claimed in the same
  round and sent from memory at its due time, never before, and removed with the rest, so a steady
  few hundred a second cost a claim and a removal per window, not per message.
- :class:`ExactlyOnce` moves due messages into a queue that shares the store's transaction: one
  commit takes them from the store and puts them in the queue, so a crash undoes the move whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol, runtime_checkable

from duetime.clock import TIMER_LATENESS, handed_over_at
from duetime.encryption import sealed_problem
from duetime.engine.calls import EngineCalls
from duetime.engine.deadline import within
from duetime.engine.failures import FailurePolicy
from duetime.engine.flow import Admitted, FlowControl
from duetime.engine.observe import DispatchObserver, Settled
from duetime.engine.outages import Outages
from duetime.engine.triage import Triage
from duetime.engine.wakeups import WakeUps
from duetime.error_headers import error_headers
from duetime.errors import MessageRefused, one_line
from duetime.interfaces import ClaimsWithNextDue, Clock, NextDue, TransactionalStore
from duetime.message import DelayedMessage
from duetime.settings import DelayedDeliverySettings

log = logging.getLogger("duetime.dispatcher")

#: While a backlog lasts, a transactional move (exactly-once) takes up to this many times
#: ``batch_size`` at once. Each move is one commit, and a commit is one disk flush: 5,000 due at
#: once into a SQLite queue with its consumer drained at 0.42x a bare timer in moves of 100, at
#: 0.84-1.04x growing to 400, 0.65-0.70x growing to 800 (the consumer waits longer for the lock;
#: bench/lateness.py). A crash rolls a move back whole, so its size doubles nothing; a short move
#: (the backlog is gone) brings the size back to ``batch_size``.
MOVE_GROWTH = 4
#: Never more than this in one move, whatever ``batch_size`` is.
MOVE_MOST = 10_000
#: How long before the next due time a dispatcher that claims ahead wakes: a claim's time (about
#: a millisecond on PostgreSQL here), so the first message is in memory when it comes due.
CLAIM_LEAD = timedelta(milliseconds=3)


class Round(NamedTuple):
    """What a round came to."""

    #: Anything was due.
    found: bool
    #: It took all it could at once: more is probably due, so the loop goes again without asking.
    full: bool


@dataclass
class Progress:
    """Where delivery stands, for health checks and the heartbeat."""

    #: The last round that reached the store without failing (wall clock).
    last_batch_at: datetime | None = None
    #: Messages held claimed right now, and when those claims end at the latest.
    in_flight: int = 0
    claims_end_by: datetime | None = None


@dataclass
class StrategyParts:
    """The parts a strategy works with, shared with the loop that runs it."""

    calls: EngineCalls
    failures: FailurePolicy
    outages: Outages
    observer: DispatchObserver
    wakeups: WakeUps
    clock: Clock
    progress: Progress
    endpoint: str
    #: True once a stop (or a critical error) is asked for.
    stopping: Callable[[], bool]
    #: Claiming failed: count it, log it, back off.
    fetch_failed: Callable[[Exception], Awaitable[None]]
    #: Back off after a failure; ends at once on a stop request.
    back_off: Callable[[], Awaitable[None]]
    #: The flow-control limits (a store that keeps them), else None.
    flow: FlowControl | None = None
    #: Forwarding what is due now and then returning (``run --burst``): nothing is claimed ahead.
    burst: bool = False

    @property
    def settings(self) -> DelayedDeliverySettings:
        return self.calls.settings


@runtime_checkable
class DeliveryStrategy(Protocol):
    """One way of delivering what is due, a round at a time."""

    async def round(self, now: datetime) -> Round:
        """Deliver (or dead-letter) what is due at ``now``, up to the strategy's limit; every
        observer told what happened. Failures are handled here, never raised."""

    @property
    def lead(self) -> timedelta:
        """How long before the next due time the loop wakes for this strategy's round (zero: at
        it, within the lateness budget)."""
        ...

    async def finish(self) -> None:
        """Give back anything claimed ahead (the loop is stopping)."""


class AtLeastOnce:
    """Claim, send, remove: a message may arrive twice after a crash, never not at all."""

    def __init__(self, engine: StrategyParts, *, claim_ahead: bool) -> None:
        self.e = engine
        #: A store with one writer at a time (SQLite) would only queue the claim behind the send.
        self.claim_ahead = claim_ahead
        #: The next batch, claimed while the current one is being sent.
        self._prefetch: asyncio.Future[list[DelayedMessage]] | None = None
        #: What was carried and is not removed yet, while a window is sent: removed at its end.
        self._carried: list[tuple[list[DelayedMessage], datetime, FlowControl | None]] | None = None
        #: The last window held a message in memory for its due time: messages come closer than
        #: the window, so the loop wakes a claim's time early. At a few a second it does not:
        #: each claim finds its one message due, as without a window, and no wait is added.
        self._held_ahead = False
        #: Seconds this round waited in memory for due times: not the batch's work, which
        #: ``duetime_batch_duration_seconds`` measures.
        self._waited = 0.0

    @property
    def window(self) -> timedelta:
        """How far ahead this round claims. Nothing with flow-control limits (a limit's turn is
        taken when a message is claimed, so it must be due then) or in a burst."""
        e = self.e
        limited = e.flow is not None and e.flow.active
        return timedelta(0) if limited or e.burst else e.settings.claim_window

    @property
    def lead(self) -> timedelta:
        """How early the loop wakes before the next due time: enough for the claim, so the first
        message of a window is sent on time (the claim window covers it); zero while messages come
        further apart than the window."""
        return min(self.window, CLAIM_LEAD) if self._held_ahead else timedelta(0)

    async def round(self, now: datetime) -> Round:
        e, settings = self.e, self.e.settings
        store = e.calls.store
        seconds = e.calls.deadline(e.calls.breakers.fetch)
        started = e.clock.monotonic()
        ahead: NextDue | None = None  # the next due time, when the claim read it
        if e.flow is not None and e.flow.stale:
            # Before the claim: a change (a resume, a new limit) gives back what it held, and this
            # claim takes it. The store not answering is a failed claim (its breaker counts it).
            try:
                await within(e.flow.refresh(), seconds, "reading the flow-control limits")
            except Exception as error:
                await e.fetch_failed(error)
                return Round(False, False)
        window = self.window  # after the limits are read: none ahead while one is set
        try:
            if self._prefetch is not None:
                prefetched, self._prefetch = self._prefetch, None
                batch = await within(prefetched, seconds, "claiming due messages")
            elif isinstance(store, ClaimsWithNextDue):
                e.wakeups.mark()
                claimed = await within(
                    store.fetch_due_and_next(now + window, settings.batch_size),
                    seconds,
                    "claiming due messages",
                )
                batch, ahead = claimed.messages, claimed.next_due
            else:
                batch = await within(
                    store.fetch_due(now + window, settings.batch_size), seconds, "claiming due messages"
                )
        except Exception as error:
            await e.fetch_failed(error)
            return Round(False, False)
        e.calls.breakers.fetch.success()
        e.progress.last_batch_at = e.clock.now()
        if not batch:
            if ahead is not None:
                e.wakeups.know_ahead(ahead.at)
            return Round(False, False)
        full = len(batch) >= settings.batch_size
        e.observer.claimed(len(batch))
        e.progress.in_flight = len(batch)
        e.progress.claims_end_by = now + window + settings.claim_timeout
        if full and not e.stopping() and self.claim_ahead:
            # More is probably due: claim the next batch while this one is sent. Its messages were
            # due when claimed (never early), and are sent only after this batch is removed, so a
            # kill still re-sends at most one batch.
            self._prefetch = asyncio.ensure_future(store.fetch_due(e.clock.now(), settings.batch_size))
        elif ahead is not None and not e.stopping():
            e.wakeups.know_ahead(ahead.at)  # read by the claim itself, after mark()
        elif not full and not e.stopping():
            # A short batch: nothing else is due, and the wait that follows needs the next due
            # time (after a full one the next round claims at once, and asks nothing). Asked now,
            # the question runs beside the send and removal instead of after them — a fifth of
            # each round, when messages come a few ms apart. The batch is hidden from it (claimed
            # or locked); anything stored meanwhile is told.
            e.wakeups.ask_ahead(store.next_due())
        try:
            self._held_ahead = bool(window) and max(m.due_at for m in batch) > e.clock.now()
            self._waited = 0.0
            if self._held_ahead:  # some are due later in the window: each at its time
                await self._forward_on_time(batch, window)
            else:
                await self._forward(batch)
        finally:
            e.progress.in_flight = 0
        e.observer.batch(len(batch), e.clock.monotonic() - started - self._waited)
        return Round(True, full)

    async def _forward_on_time(self, batch: list[DelayedMessage], window: timedelta) -> None:
        """Send each message of a batch claimed ahead at its due time, never before (rounded up
        to a whole lateness budget: those of one step go in one send); remove what was carried
        once, at the end. A store's word that something is due sooner (stored while
        this waits) claims again, into the same window. A stop, or an outage, gives back what was
        not sent: its claims never outlive the round."""
        e = self.e
        pending = sorted(batch, key=lambda m: m.due_at)
        room = e.settings.batch_size - len(batch)  # a kill sends one batch again at the most
        self._carried = []
        try:
            while pending and not e.stopping():
                now = e.clock.now()
                due = 0
                while due < len(pending) and pending[due].due_at <= now:
                    due += 1
                if due:
                    group, pending = pending[:due], pending[due:]
                    await self._forward(group)
                    if not e.outages.reachable:  # an outage: the rest waits for the next round
                        break
                    continue
                if e.stopping():
                    break
                step_ends = handed_over_at(pending[0].due_at, e.settings.lateness_budget)
                if await self._wait_until(step_ends) and not e.stopping():
                    # a store's word: heard here, so the next wait asks the store again
                    e.wakeups.event.clear()
                    e.wakeups.forget_ahead()
                    if room > 0:  # something due sooner?
                        more = await self._claim_more(e.clock.now() + window, room)
                        room -= len(more)
                        pending = sorted([*pending, *more], key=lambda m: m.due_at)
        finally:
            carried, self._carried = self._carried, None
            if pending:
                e.wakeups.forget_ahead()
                await e.calls.release([m.message_id for m in pending])
            await self._settle(carried)

    async def _wait_until(self, due_at: datetime) -> bool:
        """Wait until ``due_at`` by this clock; True if a store's word (or a stop) came first,
        or had come already (the event is left set for the caller)."""
        e = self.e
        wake = e.wakeups
        budget = e.settings.lateness_budget.total_seconds()
        slack = TIMER_LATENESS if budget >= TIMER_LATENESS else 0.0  # asyncio's timer: late, never early
        wake.target, wake.asleep = due_at, True
        began = e.clock.monotonic()
        try:
            return await e.clock.wait(
                wake.event, (due_at - e.clock.now()).total_seconds() + slack, slack=slack
            )
        finally:
            wake.target, wake.asleep = None, False
            self._waited += e.clock.monotonic() - began

    async def _claim_more(self, at: datetime, limit: int) -> list[DelayedMessage]:
        """Up to ``limit`` that came due within the window since its claim (stored meanwhile);
        nothing when the store does not answer (the next round claims them)."""
        e = self.e
        try:
            more = await within(
                e.calls.store.fetch_due(at, limit),
                e.calls.deadline(e.calls.breakers.fetch),
                "claiming due messages",
            )
        except Exception as error:
            log.warning("claiming what came due meanwhile failed: %s", one_line(error))
            return []
        e.observer.claimed(len(more))
        return more

    async def _settle(self, carried: list[tuple[list[DelayedMessage], datetime, FlowControl | None]]) -> None:
        """Remove what a window carried, in one call, then tell the observers (lateness by each
        message's own send time)."""
        if not carried:
            return
        e = self.e
        if not await e.calls.remove([m.message_id for sent, _, _ in carried for m in sent]):
            e.wakeups.forget_ahead()
        for sent, sent_at, flow in carried:
            e.observer.delivered(
                [
                    Settled.of(m, held=flow is not None and flow.limited(m.destination, m.due_at))
                    for m in sent
                ],
                sent_at,
            )

    async def _forward(self, batch: list[DelayedMessage]) -> None:
        e = self.e
        if e.flow is None or not e.flow.needed:  # no limit set: the batch goes as claimed
            await self._send(batch, e.flow if e.flow is not None and e.flow.measures_held else None)
            return
        started = e.clock.monotonic()
        try:
            admitted = await within(
                e.flow.admit(batch),
                e.calls.deadline(e.calls.breakers.fetch),
                "asking the flow-control limits",
            )
        except Exception as error:
            # The store could not say what the limits allow: nothing goes past a limit unread.
            # The batch goes back (its claims released) and the loop backs off as for a claim.
            e.wakeups.forget_ahead()
            await e.calls.release([m.message_id for m in batch])
            await e.fetch_failed(error)
            return
        if admitted.held:
            sent = {m.message_id for m in admitted.send}
            e.observer.held_back([m.destination for m in batch if m.message_id not in sent])
            e.wakeups.forget_ahead()  # the held ones' turns come sooner than what it knew
        try:
            if admitted.send:
                await self._send(admitted.send, e.flow)
        finally:
            try:
                await e.flow.settled(admitted, e.clock.monotonic() - started)
            except Exception as error:  # the slots lapse by themselves (limits.SLOT_LEASE_SECONDS)
                log.warning("giving back concurrency slots failed: %s", error)

    async def _send(self, batch: list[DelayedMessage], flow: FlowControl | None) -> None:
        e = self.e
        problems = [sealed_problem(m) for m in batch]
        if any(problems):  # never delivered as ciphertext: to the error queue with the reason, at once
            await e.failures.failed(
                [
                    (m, MessageRefused(f"not delivered: {why}"))
                    for m, why in zip(batch, problems, strict=True)
                    if why
                ]
            )
            batch = [m for m, why in zip(batch, problems, strict=True) if not why]
            if not batch:
                return
        try:
            results = await e.calls.send(batch, "sending a batch")
        except Exception as error:
            # The transport failed as a whole (its contract answers per message otherwise): an
            # outage, not a failure of these messages. They go back to the store untouched.
            e.wakeups.forget_ahead()
            await e.failures.give_back(batch, error, "sending")
            return
        sent_at = e.clock.now()
        answer = Triage.of(batch, results)
        if answer.carried:
            if self._carried is not None:  # a window: removed at its end, with the rest
                self._carried.append((answer.carried, sent_at, flow))
            else:
                await self._settle([(answer.carried, sent_at, flow)])
        if len(answer.carried) < len(batch):
            e.wakeups.forget_ahead()
        transport_failures = answer.transport_failures
        if answer.outage is not None:
            await e.failures.give_back(answer.unreachable, answer.outage, "sending", pause=False)
        elif transport_failures:
            e.calls.breakers.dispatch.failure(transport_failures[-1][1])
        elif answer.carried:
            e.calls.breakers.dispatch.success()
            e.outages.up()
        if answer.failed:
            await e.failures.failed(answer.failed)
        held = await e.failures.wait_for_route(answer.waiting, "sending") if answer.waiting else True
        if (transport_failures or answer.unreachable or not held) and not e.stopping():
            await (e.outages.pause() if answer.unreachable or not held else e.back_off())

    async def finish(self) -> None:
        """Give back a batch claimed ahead but not sent (a stop or a critical error came first)."""
        if self._prefetch is None:
            return
        prefetched, self._prefetch = self._prefetch, None
        seconds = self.e.calls.deadline(self.e.calls.breakers.store)
        try:
            batch = await within(prefetched, seconds, "claiming due messages")
        except Exception as error:  # its claims time out by themselves; nothing is lost
            log.warning("releasing a batch claimed ahead failed: %s", error)
            return
        await self.e.calls.release([m.message_id for m in batch])


class ExactlyOnce:
    """Move due messages into a queue in the store's own transaction: none lost, none twice."""

    def __init__(self, engine: StrategyParts, store: TransactionalStore) -> None:
        self.e = engine
        self.store = store
        #: How many the next move may take: ``batch_size``, doubling while each move comes back
        #: full (a backlog), up to :data:`MOVE_GROWTH` times it.
        self.limit = engine.settings.batch_size
        #: The last move carried a message ahead of its due time: messages come closer than the
        #: window, so the loop wakes a move's time early (see :attr:`lead`).
        self._moved_ahead = False

    def window(self, admitted: bool) -> timedelta:
        """How far ahead this move takes (``claim_window``): nothing while flow-control limits
        hold messages back (the move must take exactly those they admitted), or in a burst."""
        e = self.e
        limited = admitted or (e.flow is not None and e.flow.active)
        return timedelta(0) if limited or e.burst else e.settings.claim_window

    @property
    def lead(self) -> timedelta:
        """How early the loop wakes before the next due time: a move's time, while moves carry
        messages ahead (so the first is in its queue by its due time); else at it, within the
        lateness budget."""
        return min(self.window(False), CLAIM_LEAD) if self._moved_ahead else timedelta(0)

    async def round(self, now: datetime) -> Round:
        e, limit, batch_size = self.e, self.limit, self.e.settings.batch_size
        started = e.clock.monotonic()
        flow, admitted, claimed_full = e.flow, None, False
        if flow is not None and flow.needed:
            try:
                taken = await self._make_way(flow, now)
            except Exception as error:
                await e.fetch_failed(error)
                return Round(False, False)
            if taken is not None:
                admitted, claimed_full = taken
                if not admitted.send:  # all held: nothing to move this round
                    return Round(bool(admitted.held), claimed_full)
                limit = len(admitted.send)
        window = self.window(admitted is not None)
        e.wakeups.mark()
        try:
            outcome = await within(
                self.store.move_due(
                    now,
                    limit,
                    e.calls.transport,
                    e.settings.error_queue,
                    # the move was a try too: the attempts are the failures before it and this one
                    lambda m, reason: error_headers(m, reason, now, m.failure_count + 1, endpoint=e.endpoint),
                    now + window if window else None,
                    # what a move makes ahead shows at most the budget late: one wake for each step
                    e.settings.lateness_budget,
                ),
                e.calls.deadline(e.calls.breakers.fetch),
                "moving due messages",
            )
        except Exception as error:
            await e.fetch_failed(error)
            return Round(False, False)
        finally:
            if admitted is not None and flow is not None:
                with contextlib.suppress(Exception):  # slots lapse by themselves
                    await flow.settled(admitted, e.clock.monotonic() - started)
        e.calls.breakers.fetch.success()
        moved_at = e.progress.last_batch_at = e.clock.now()
        moved = len(outcome.moved) + len(outcome.dead_lettered)
        full = moved >= limit or claimed_full
        if admitted is None:
            self.limit = min(limit * 2, batch_size * MOVE_GROWTH, MOVE_MOST) if full else batch_size
        if outcome.next_due is not None and not full:
            e.wakeups.know_ahead(outcome.next_due.at)
        self._moved_ahead = any(m.due_at > now for m in outcome.moved)
        if not moved:
            return Round(False, full)
        e.observer.claimed(moved)
        e.observer.delivered(
            [
                Settled.moved(m, moved_at, e.settings.lateness_budget)._replace(
                    held=flow is not None and flow.measures_held and flow.limited(m.destination, m.due_at)
                )
                for m in outcome.moved
            ],
            moved_at,
        )
        e.observer.dead_lettered([Settled.of(m, reason=r) for m, r in outcome.dead_lettered], moved_at)
        e.observer.batch(moved, e.clock.monotonic() - started)
        return Round(True, full)

    async def _make_way(self, flow: FlowControl, now: datetime) -> tuple[Admitted, bool] | None:
        """With limits or pauses set, before the move: claim what is due, hold in the store what
        they hold, and give the rest back for the move, which takes only that many (the oldest
        unclaimed, so those). Nothing is sent here: the move is still the one transaction that
        delivers, so exactly-once stays exactly-once; a kill in between leaves held messages to
        their turn and the rest unclaimed. None: no limit is set after all (the move goes as
        ever). Also: whether the claim was full (more is due)."""
        e = self.e
        seconds = e.calls.deadline(e.calls.breakers.fetch)
        await within(flow.refresh(), seconds, "reading the flow-control limits")
        if not flow.active:
            return None
        claimed = await within(e.calls.store.fetch_due(now, self.limit), seconds, "claiming due messages")
        admitted = await within(flow.admit(claimed), seconds, "asking the flow-control limits")
        if admitted.held:
            sent = {m.message_id for m in admitted.send}
            e.observer.held_back([m.destination for m in claimed if m.message_id not in sent])
            e.wakeups.forget_ahead()
        await e.calls.release([m.message_id for m in admitted.send])
        return admitted, len(claimed) >= self.limit

    async def finish(self) -> None:
        """Nothing is held between moves."""
