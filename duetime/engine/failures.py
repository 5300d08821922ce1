"""What happens to a message whose forward failed, in one place.

- The transport could not be reached: an outage, not the message's; its claim goes back untouched.
- Its route could not be reached while another can: it waits in the store, held until the route
  is tried again, and the other routes go on (:mod:`duetime.engine.routes`).
- Another try may go: its failure is counted and it waits its turn (``number_of_retries``).
- Its destination said "not now" (:class:`RetryLater`, a webhook's 503): its failure is counted
  and it waits in the store as long as the destination's own schedule says.
- Out of retries, or a failure no try can mend (no such destination, a message its transport
  refuses): a copy with the reason goes to the error queue and the message is removed.
- Not even the error queue can carry it: it stays stored, put aside for :data:`PARKED_FOR`, with a
  notice in the error queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from duetime.engine.calls import EngineCalls
from duetime.engine.deadline import within
from duetime.engine.observe import DispatchObserver, Settled
from duetime.engine.outages import Outages
from duetime.engine.triage import NOT_RETRIED, Triage
from duetime.error_headers import KEPT_IN_STORE, error_headers
from duetime.errors import ConfigurationError, MessageInFlight, RetryLater, RouteUnavailable, one_line
from duetime.interfaces import Clock, FlowControlStore, RetryingStore
from duetime.message import DelayedMessage

log = logging.getLogger("duetime.dispatcher")

#: How long a message that no queue of its transport can carry waits before it is tried again.
PARKED_FOR = timedelta(hours=1)

Failed = Sequence[tuple[DelayedMessage, Exception]]


class FailurePolicy:
    """Retries, the error queue, and putting aside what nothing can carry."""

    def __init__(
        self,
        calls: EngineCalls,
        outages: Outages,
        observer: DispatchObserver,
        clock: Clock,
        endpoint: str,
        stopping: Callable[[], bool],
    ) -> None:
        self.calls = calls
        self.outages = outages
        self.observer = observer
        self.clock = clock
        self.endpoint = endpoint
        self.stopping = stopping
        self.settings = calls.settings
        self.breakers = calls.breakers

    async def give_back(
        self, batch: Sequence[DelayedMessage], error: BaseException, doing: str, *, pause: bool = True
    ) -> None:
        """The transport is down: count one outage, release the claims, back off."""
        self.outages.down(error, doing)
        await self.calls.release([m.message_id for m in batch])
        if pause and not self.stopping():
            await self.outages.pause()

    async def wait_for_route(
        self, waiting: Sequence[tuple[DelayedMessage, RouteUnavailable]], doing: str
    ) -> bool:
        """Messages whose route is down while another can be reached: each held in the store,
        unchanged, until its route is tried again, so no round claims them in between and no
        breaker counts it. A store that cannot hold them gives their claims back and the
        dispatcher backs off, as for any outage: False then."""
        store, now = self.calls.store, self.clock.now()
        for error in {e.route: e for _, e in waiting if e.tried}.values():
            self.observer.unreachable(error, f"{doing} by route {error.route}")
        until = {m.message_id: now + timedelta(seconds=e.retry_in) for m, e in waiting}
        if isinstance(store, FlowControlStore):
            try:
                await within(
                    store.hold(until), self.calls.deadline(self.breakers.store), "holding a route's messages"
                )
                return True
            except ConfigurationError:  # a store that keeps no holds (the example dbm store)
                pass
            except Exception as error:  # their claims lapse by themselves; they are tried again then
                log.warning("holding %d messages for their route failed: %s", len(until), one_line(error))
                self.breakers.store.failure(error)
                return True
        await self.give_back([m for m, _ in waiting], waiting[0][1], doing, pause=False)
        return False

    async def failed(self, failed: Failed) -> None:
        """Count each failure; dead-letter what is out of retries or has nowhere to go."""
        dead: list[tuple[DelayedMessage, Exception]] = []
        store = self.calls.store
        for message, error in failed:
            if isinstance(error, NOT_RETRIED):  # another try cannot go otherwise
                dead.append((message, error))
                continue
            if isinstance(error, RetryLater):  # the destination's schedule, not number_of_retries
                await self.retry_later(message, error)
                continue
            attempts = message.failure_count + 1
            if attempts > self.settings.number_of_retries:
                # Still claimed: dead-letter it before anyone else can take it again.
                dead.append((message.with_changes(failure_count=attempts), error))
                continue
            try:
                counted = await within(
                    store.increment_failure_count(message.message_id),
                    self.calls.deadline(self.breakers.store),
                    "counting a failure",
                )
            except Exception as recovery_error:  # the recovery breaker counts exactly these
                self.breakers.recovery.failure(recovery_error)
                continue
            if not counted:
                continue  # cancelled meanwhile
            self.observer.retried(message, attempts, error)
        if dead:
            await self.dead_letter(dead)

    async def retry_later(self, message: DelayedMessage, error: RetryLater) -> None:
        """Count the failure and keep the message ``error.after`` seconds longer, in one change
        (:class:`RetryingStore`): released first, it would be due now to a batch claimed ahead.
        A store without it counts the failure only, and the message is tried again at once."""
        store, seconds = self.calls.store, self.calls.deadline(self.breakers.store)
        until = self.clock.now() + timedelta(seconds=error.after)
        change = (
            store.retry_later(message.message_id, until)
            if isinstance(store, RetryingStore)
            else store.increment_failure_count(message.message_id)
        )
        try:
            counted = await within(change, seconds, "putting a retry off")
        except Exception as recovery_error:  # its claim lapses; it is tried again then
            self.breakers.recovery.failure(recovery_error)
            return
        if counted:
            self.observer.retried(message, message.failure_count + 1, error)

    async def dead_letter(self, dead: Failed) -> None:
        """Copies with the reason to the error queue; the originals removed once they are there."""
        now = self.clock.now()
        copies = [
            m.with_changes(
                destination=self.settings.error_queue,
                headers=error_headers(m, e, now, max(m.failure_count, 1), endpoint=self.endpoint),
            )
            for m, e in dead
        ]
        doing = "sending to the error queue"
        try:
            results = await self.calls.send(copies, doing)
        except Exception as error:  # the transport as a whole is down: an outage, not these messages'
            await self.give_back([m for m, _ in dead], error, doing, pause=False)
            return
        # Sorted by the originals, with the error each was dead-lettered for.
        reasons = {m.message_id: e for m, e in dead}
        answer = Triage.of([m for m, _ in dead], results)
        if answer.carried and await self.calls.remove([m.message_id for m in answer.carried]):
            self.observer.dead_lettered(
                [Settled.of(m, reason=one_line(reasons[m.message_id])) for m in answer.carried], now
            )
        if answer.outage is not None:
            await self.give_back(answer.unreachable, answer.outage, doing, pause=False)
        if answer.waiting:  # the error queue's route is down: the originals wait for it
            await self.wait_for_route(answer.waiting, doing)
        refused, failed = answer.split_refused()
        if refused:  # the error queue is on the same server, with the same limits
            await self.park(refused)
        for _, result in failed:  # the error queue refused these: error handling failed for them
            self.breakers.recovery.failure(result)
        await self.calls.release([m.message_id for m, _ in failed], counted=True)

    async def park(self, parked: Failed) -> None:
        """Messages that neither their destination nor the error queue can carry stay in the store,
        their failure counted and their due time :data:`PARKED_FOR` ahead, each logged once as an
        error with the reason: visible in ``duetime list --failing``, tried again later (after a
        fix of the server's limit, or of the message), never an outage and never a busy loop."""
        until = self.clock.now() + PARKED_FOR
        store, seconds = self.calls.store, self.calls.deadline(self.breakers.store)
        for message, reason in parked:
            self.observer.parked(message, reason, until)
            try:
                await within(store.increment_failure_count(message.message_id), seconds, "counting a failure")
                await within(
                    store.reschedule(message.message_id, until),
                    seconds,
                    "putting an undeliverable message aside",
                )
            except MessageInFlight:
                pass  # claimed again by a dispatcher between the two calls: it puts it aside
            except Exception as error:  # its claim expires; it is tried again then
                self.breakers.store.failure(error)
        await self._notice_kept([(m, r) for m, r in parked if m.failure_count == 0])

    async def _notice_kept(self, kept: Failed) -> None:
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
                self.calls.transport.send_batch(notices),
                self.calls.deadline(self.breakers.dispatch),
                "noting kept messages in the error queue",
            )
        except Exception as error:
            results = [error] * len(notices)
        for (m, _), result in zip(kept, results, strict=True):
            if result is not None:
                log.warning("could not note %s in the error queue: %s", m.message_id, one_line(result))
