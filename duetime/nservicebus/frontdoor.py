"""The front door (NServiceBus's timeout manager): delayed messages arrive on ``<endpoint>.Timeouts``.

That is the queue an NServiceBus endpoint sends its deferred messages to; ``<endpoint>.timeouts``
(the name duetime 0.1 used) is consumed too while it exists. Each message carries its
destination and due time in headers. It is stored, and acknowledged only after the store
committed (with the queue's next receive, or at the stop), so nothing is lost; a saga's
``ClearTimeouts`` message cancels the saga's stored timeouts (its group); a redelivered message
whose id is already stored is just acknowledged. Malformed ones go to the error queue with the
reason. If storing (or receiving) keeps
failing for ``time_to_wait_before_triggering_critical_error_on_timeout_outages`` (2 minutes), the
outage breaker raises the timeout manager's critical error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from duetime import tracing
from duetime.engine.circuit import RepeatedFailuresOverTimeCircuitBreaker
from duetime.engine.companions import FrontDoorHost, until_started
from duetime.engine.deadline import within
from duetime.error_headers import PREFIX as ERROR_PREFIX
from duetime.error_headers import error_headers
from duetime.errors import (
    ConfigurationError,
    DuplicateMessageId,
    InvalidMessage,
    TransportUnavailable,
    one_line,
)
from duetime.inputs.identifiers import check_name
from duetime.interfaces import (
    AddressTopology,
    ChecksKeeping,
    DelayedMessageStore,
    InspectableQueue,
    ReceivedMessage,
    ReceivingTransport,
    Transport,
)
from duetime.message import (
    DUE_AT_HEADER,
    Delay,
    DelayedMessage,
    check_headers,
    new_message_id,
    refused_destination,
)
from duetime.nservicebus_wire import (
    CLEAR_TIMEOUTS,
    DUE_ON_ARRIVAL,
    DUE_ON_ARRIVAL_WITHIN,
    EXPIRE,
    REPLY_TO,
    ROUTE_TO,
    from_wire,
    is_timeout,
    saga_group,
)

log = logging.getLogger("duetime.frontdoor")

#: Where and when the front door should deliver. Distinct from ``duetime-due-at``, which every
#: transport stamps on what it delivers (a message passing through a queue carries both).
DESTINATION_HEADER = "duetime-route-to"
DELIVER_AT_HEADER = "duetime-deliver-at"
NSB_EXPIRE = EXPIRE
NSB_ROUTE_TO = ROUTE_TO
#: duetime's own routing headers; the destination does not get them. NServiceBus's stay, as its
#: timeout manager keeps every incoming header (see duetime.nservicebus_wire).
ENVELOPE_HEADERS = (DESTINATION_HEADER, DELIVER_AT_HEADER, DUE_AT_HEADER)
#: How often the front door looks again whether the old-named queue exists.
LEGACY_CHECK_SECONDS = 60.0
#: While a part stays down, its failures are logged as a warning at most this often (seconds).
OUTAGE_LOG_EVERY = 60.0
#: The two things the front door depends on, as its outage log names them.
QUEUE, STORE = "queue", "store"
#: The timeout manager's words, so operators' alerts written for the timeout manager keep matching.
OUTAGE_MESSAGE = "Repeated failures when fetching timeouts from storage, endpoint will be terminated."


def front_door_queue(endpoint: str) -> str:
    """The timeout manager's queue, as NServiceBus names it: ``<endpoint>.Timeouts``."""
    return f"{endpoint}.Timeouts"


def legacy_front_door_queue(endpoint: str) -> str:
    """The name duetime used before it matched NServiceBus (lower-case ``timeouts``)."""
    return f"{endpoint}.timeouts"


@dataclass(frozen=True)
class ClearTimeouts:
    """A saga's request to remove all its stored timeouts (NServiceBus sends it when a saga ends)."""

    group: str


def parse_due_header(value: str) -> datetime:
    """ISO 8601 with an offset, or NServiceBus's wire format ``2030-01-01 09:00:00:000000 Z``."""
    wire = from_wire(value)
    if wire is not None:
        return wire
    moment = datetime.fromisoformat(value.strip())
    if moment.tzinfo is None:
        raise ValueError("the due time has no UTC offset")
    return moment.astimezone(UTC)


def envelope_to_message(received: ReceivedMessage) -> DelayedMessage | ClearTimeouts:
    """Turn a front-door message into the delayed message it asks for (or a saga's request to
    clear its timeouts); InvalidMessage if it can't.

    Whatever is wrong with the envelope (even something no check foresaw) is an InvalidMessage:
    one bad envelope goes to the error queue, it never stops the front door.
    """
    if received.problem is not None:
        raise InvalidMessage(f"the message cannot be read: {received.problem}.")
    try:
        return _envelope_to_message(received)
    except InvalidMessage:
        raise
    except Exception as error:
        raise InvalidMessage(f"the message cannot be read ({type(error).__name__}: {error}).") from None


def _mark_due_on_arrival(message: DelayedMessage, now: datetime) -> DelayedMessage:
    """An NServiceBus timeout already due on arrival is forwarded with its headers as they came,
    as NServiceBus does (see :data:`~duetime.nservicebus_wire.DUE_ON_ARRIVAL`)."""
    if not is_timeout(message.headers) or message.due_at - DUE_ON_ARRIVAL_WITHIN > now:
        return message
    return message.with_changes(headers={**message.headers, DUE_ON_ARRIVAL: "true"})


def _envelope_to_message(received: ReceivedMessage) -> DelayedMessage | ClearTimeouts:
    headers = received.headers
    if headers.get(CLEAR_TIMEOUTS, "").strip().lower() == "true":
        group = saga_group(headers)
        if group is None:
            raise InvalidMessage(f"a {CLEAR_TIMEOUTS} message without a saga id (NServiceBus.SagaId).")
        return ClearTimeouts(group)
    destination = headers.get(DESTINATION_HEADER) or headers.get(NSB_ROUTE_TO) or headers.get(REPLY_TO)
    due_text = headers.get(DELIVER_AT_HEADER) or headers.get(NSB_EXPIRE)
    if not destination:
        raise InvalidMessage(
            f"no destination header: set {DESTINATION_HEADER!r} (or {NSB_ROUTE_TO!r}, or {REPLY_TO!r})."
        )
    if not due_text:
        raise InvalidMessage(
            f"no due time header: set {DELIVER_AT_HEADER!r} (or {NSB_EXPIRE!r}); "
            "this is not a delayed message."
        )
    try:
        due_at = parse_due_header(due_text)
    except (ValueError, OverflowError) as error:
        raise InvalidMessage(
            f"due time {due_text!r} cannot be read ({error}); use ISO 8601 with an offset, "
            "e.g. 2030-01-01T09:00:00+00:00."
        ) from None
    # duetime-error-* say which endpoint dead-lettered a message and where it was going: only a
    # dispatcher writes them. From a sender they would be a forged error-queue entry that another
    # endpoint's `errors retry` trusts, so they are dropped here.
    kept = {k: v for k, v in headers.items() if k not in ENVELOPE_HEADERS and not k.startswith(ERROR_PREFIX)}
    return DelayedMessage(
        received.message_id, destination, due_at, received.body, kept, group=saga_group(headers)
    )


def envelope_headers(
    destination: str, due_at: datetime, headers: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Headers a sender puts on a front-door message."""
    return {
        **(headers or {}),
        DESTINATION_HEADER: destination,
        DELIVER_AT_HEADER: due_at.astimezone(UTC).isoformat(),
    }


class FrontDoor:
    """Consumes ``<endpoint>.Timeouts`` (and the old ``<endpoint>.timeouts`` while it exists) into
    the dispatcher's store while the dispatcher runs."""

    def __init__(self, dispatcher: FrontDoorHost, receiver: ReceivingTransport, *, wait: float = 0.5) -> None:
        self.dispatcher = dispatcher
        self.receiver = receiver
        self.queue = front_door_queue(dispatcher.endpoint)
        self.legacy_queue = legacy_front_door_queue(dispatcher.endpoint)
        #: The queues consumed: the old-named one first (never waited on), the real one last.
        self.queues: list[str] = [self.queue]
        self._legacy_checked: float | None = None
        self.wait = wait
        self.stored = 0
        self.rejected = 0
        self.cleared = 0
        #: Redeliveries of messages already stored (acknowledged, not stored twice).
        self.duplicates = 0
        self.outage_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "timeout storage",
            dispatcher.settings.time_to_wait_before_triggering_critical_error_on_timeout_outages.total_seconds(),
            dispatcher.trip,
            dispatcher.clock.monotonic,
            OUTAGE_MESSAGE,
            dispatcher.observer,
        )
        #: Each part that is failing right now: attempts failed, and when a warning was last logged.
        self._failing: dict[str, tuple[int, float]] = {}
        #: Stored messages not acknowledged yet, by queue: the queue's next receive acknowledges
        #: them (``done=``; on the SQL queues in the same statement), or the stop does.
        self._handled: dict[str, list[ReceivedMessage]] = {}

    async def start(self) -> None:
        """Declare the queue as an NServiceBus endpoint's address (with a broker's routing
        topology, the exchange its senders publish to), and look for the old-named queue."""
        transport = self.dispatcher.transport
        if isinstance(transport, AddressTopology):
            await transport.declare_address(self.queue)
        else:
            await transport.declare(self.queue)
        await self._look_for_legacy()

    async def _look_for_legacy(self) -> None:
        """Consume ``<endpoint>.timeouts`` too while it exists (senders of duetime 0.1 and
        messages they left there); looked for again every minute."""
        now = self.dispatcher.clock.monotonic()
        if self._legacy_checked is not None and now - self._legacy_checked < LEGACY_CHECK_SECONDS:
            return
        self._legacy_checked = now
        receiver = self.receiver
        exists = isinstance(receiver, InspectableQueue) and await receiver.has_queue(self.legacy_queue)
        if exists and self.legacy_queue not in self.queues:
            log.info("front door: also consuming %s, the queue's old name", self.legacy_queue)
            self.queues.insert(0, self.legacy_queue)
        elif not exists and self.legacy_queue in self.queues:
            self.queues.remove(self.legacy_queue)

    @property
    def _deadline(self) -> float:
        """How long one call to the queue or the store may take (see ``operation_timeout``)."""
        settings = self.dispatcher.settings
        return min(settings.operation_timeout.total_seconds(), self.outage_breaker.time_to_trigger / 2)

    async def run(self) -> None:
        """Serve until the dispatcher stops. A queue that cannot be declared yet (a broker that is
        down) is retried like any outage; only wrong settings end the front door at once."""
        declared = False
        await until_started(self.dispatcher)  # stored before then, the store would refuse
        while not self.dispatcher.stopping:
            if not declared:
                try:
                    await within(self.start(), self._deadline, f"declaring {self.queue}")
                except ConfigurationError:
                    raise
                except Exception as error:
                    self._outage(QUEUE, f"declaring {self.queue}", error)
                    await self.dispatcher.back_off()
                    continue
                declared = True
                self._working(QUEUE)
            await self.process_once()
        await self.finish()

    async def finish(self) -> None:
        """Acknowledge what was stored and is still waiting for a receive to carry it: none will
        come (a stop, or the end of a burst's last :meth:`process_once`)."""
        handled, self._handled = self._handled, {}
        for queue, stored in handled.items():
            try:
                await within(self.receiver.acknowledge(stored), self._deadline, "acknowledging")
            except Exception as error:  # stored already: the redelivery is recognised by its id
                log.warning(
                    "front door: acknowledging %d stored messages of %s failed: %s",
                    len(stored),
                    queue,
                    one_line(error),
                )

    def _outage(self, part: str, doing: str, error: Exception) -> None:
        """``part`` (the queue or the store) failed: the breaker counts every failure; the log says
        so at once, then at most every :data:`OUTAGE_LOG_EVERY` seconds while it lasts."""
        now = self.dispatcher.clock.monotonic()
        failed, warned_at = self._failing.get(part, (0, -OUTAGE_LOG_EVERY))
        failed += 1
        if now - warned_at >= OUTAGE_LOG_EVERY:
            warned_at = now
            so_far = f" ({failed:,} failed attempts so far)" if failed > 1 else ""
            log.warning(
                "front door: %s failed: %s%s; senders' messages wait in the queue, nothing is lost",
                doing,
                one_line(error),
                so_far,
            )
        else:
            log.debug("front door: %s failed: %s", doing, one_line(error))
        self._failing[part] = (failed, warned_at)
        self.outage_breaker.failure(error)

    def _working(self, part: str) -> None:
        """``part`` answered: the end of its outage, if it had one; the breaker is disarmed once
        neither the queue nor the store is failing."""
        failing = self._failing.pop(part, None)
        if failing is not None:
            log.info("front door: the %s works again after %d failed attempt(s)", part, failing[0])
        if not self._failing:
            self.outage_breaker.success()

    async def process_once(self) -> int:
        """Receive one batch from each front-door queue and store it; returns how many messages
        were handled. Only the last queue (the real one) is waited on."""
        try:
            await within(self._look_for_legacy(), self._deadline, f"looking for {self.legacy_queue}")
        except Exception as error:  # only the old queue is affected; the real one goes on
            log.warning("front door: looking for %s failed: %s", self.legacy_queue, one_line(error))
        handled = 0
        for i, queue in enumerate(list(self.queues)):
            last = i == len(self.queues) - 1
            handled += await self._process_queue(queue, self.wait if last and not handled else 0.0)
        return handled

    async def _process_queue(self, queue: str, wait: float) -> int:
        """A queue that cannot be read counts against the outage breaker like a store that cannot
        be written: either way delayed messages are not getting in."""
        done = self._handled.pop(queue, [])
        try:
            received = await within(
                self.receiver.receive(queue, self.dispatcher.settings.batch_size, wait, done=done),
                wait + self._deadline,
                f"receiving from {queue}",
            )
        except Exception as error:
            # acknowledged or not: again with the next receive (a receipt acknowledged twice, or
            # a message stored twice, is recognised)
            self._handled[queue] = done
            self._outage(QUEUE, f"receiving from {queue}", error)
            await self.dispatcher.back_off()
            return 0
        self._working(QUEUE)
        if not received:
            return 0
        good: list[tuple[ReceivedMessage, DelayedMessage]] = []
        clears: list[tuple[ReceivedMessage, ClearTimeouts]] = []
        bad: list[tuple[ReceivedMessage, InvalidMessage]] = []
        for item in received:
            try:
                parsed = envelope_to_message(item)
            except InvalidMessage as error:
                bad.append((item, error))
                continue
            if isinstance(parsed, ClearTimeouts):
                clears.append((item, parsed))
            elif why := refused_destination(parsed.destination, self.dispatcher.settings.error_queue):
                bad.append((item, InvalidMessage(f"{why}.")))
            else:
                good.append((item, _mark_due_on_arrival(parsed, self.dispatcher.clock.now())))
        refused: list[tuple[ReceivedMessage, InvalidMessage]] = []
        before = (self.duplicates, self.rejected)
        while good:
            outcome = await self._store(good)
            if outcome is not None:
                refused = outcome
                break
            if self.dispatcher.stopping:
                return 0  # not acknowledged: the queue gives them back later, nothing lost
            await self.dispatcher.back_off()
        cleared = await self._clear(clears)
        if bad or refused:
            await self._reject(bad + refused, queue)
        refused_ids = {id(item) for item, _ in refused}
        stored = [r for r, _ in good if id(r) not in refused_ids] + cleared
        duplicates, rejected = self.duplicates - before[0], self.rejected - before[1]
        self.dispatcher.observer.front_door(len(stored) - len(cleared) - duplicates, rejected, duplicates)
        if stored:
            self.stored += len(stored) - len(cleared)
            self._handled.setdefault(queue, []).extend(stored)  # acknowledged by the next receive
        return len(received)

    async def _clear(self, clears: Sequence[tuple[ReceivedMessage, ClearTimeouts]]) -> list[ReceivedMessage]:
        """Cancel each saga's stored timeouts (after the batch's timeouts were stored, so a timeout
        sent just before the saga ended goes too); what is done may be acknowledged. Cancelling
        is idempotent, so a redelivered ClearTimeouts is harmless."""
        done: list[ReceivedMessage] = []
        for item, clear in clears:
            try:
                removed = await within(
                    self.dispatcher.store.cancel_group(clear.group), self._deadline, "clearing timeouts"
                )
            except Exception as error:
                self._outage(STORE, f"clearing the timeouts of saga {clear.group}", error)
                break
            log.info("front door: saga %s ended, %d stored timeouts removed", clear.group, removed)
            self.cleared += removed
            done.append(item)
        return done

    async def _store(
        self, pairs: Sequence[tuple[ReceivedMessage, DelayedMessage]]
    ) -> list[tuple[ReceivedMessage, InvalidMessage]] | None:
        """Store a batch; the envelopes the store refused for their own content, or None if the
        store itself is failing (an outage: nothing is acknowledged, the breaker counts it)."""
        store = self.dispatcher.store
        with tracing.storing([m for _, m in pairs]) as stamped:
            refused = await self._store_traced(
                store, list(zip([item for item, _ in pairs], stamped, strict=True))
            )
        if refused is not None and isinstance(store, ChecksKeeping):
            # what was stored is acknowledged next: only if the store still keeps what it takes
            # (a Redis switched to evicting keys answers every write OK and then drops them)
            try:
                await within(store.check_keeping(), self._deadline, "checking the store keeps what it stores")
            except Exception as error:
                self._outage(STORE, f"storing {len(pairs)} messages", error)
                return None
        return refused

    async def _store_traced(
        self, store: DelayedMessageStore, pairs: Sequence[tuple[ReceivedMessage, DelayedMessage]]
    ) -> list[tuple[ReceivedMessage, InvalidMessage]] | None:
        try:
            await within(store.store_many([m for _, m in pairs]), self._deadline, "storing")
        except DuplicateMessageId:
            pass  # a redelivery: store them one by one below, skipping what is stored
        except Exception as error:
            if not _own_fault(error):
                self._outage(STORE, f"storing {len(pairs)} messages", error)
                return None
        else:
            self._working(STORE)
            return []
        refused: list[tuple[ReceivedMessage, InvalidMessage]] = []
        for item, message in pairs:
            try:
                await within(store.store(message), self._deadline, "storing")
            except DuplicateMessageId:
                self.duplicates += 1
                log.info("front door: %s is already stored (redelivery)", message.message_id)
            except Exception as error:
                if not _own_fault(error):
                    self._outage(STORE, f"storing {message.message_id}", error)
                    return None
                refused.append((item, InvalidMessage(f"the store refused it: {error}")))
        self._working(STORE)
        return refused

    async def _reject(self, bad: Sequence[tuple[ReceivedMessage, InvalidMessage]], source: str) -> None:
        """Error queue first, acknowledge after: a rejected envelope is never just dropped. A
        failure here counts against the recovery breaker and leaves the envelope on its queue."""
        now = self.dispatcher.clock.now()
        queue = self.dispatcher.settings.error_queue
        copies = []
        for item, error in bad:
            copies.append(_rejected(item, source, queue, error, now, self.dispatcher.endpoint))
            log.warning("front door: %r rejected: %s", item.message_id, error)
        try:
            results = await within(self.dispatcher.transport.send_batch(copies), self._deadline, "rejecting")
            sent = [item for (item, _), r in zip(bad, results, strict=True) if r is None]
            if sent:
                await within(self.receiver.acknowledge(sent), self._deadline, "acknowledging")
                self.rejected += len(sent)
            failures = [r for r in results if r is not None]
        except Exception as error:  # the queue as a whole is down: an outage, the envelopes wait
            self._outage(QUEUE, f"sending rejected envelopes to {queue}", error)
            return
        for failure in failures:
            log.warning("front door: sending a rejected envelope to %s failed: %s", queue, one_line(failure))
            if isinstance(failure, TransportUnavailable):
                self.outage_breaker.failure(failure)
            else:
                self.dispatcher.recovery_breaker.failure(failure)


def _rejected(
    item: ReceivedMessage, source: str, error_queue: str, error: InvalidMessage, now: datetime, endpoint: str
) -> DelayedMessage:
    """The error-queue copy of a malformed envelope. Its own id may be what is wrong with it
    (missing, too long): then the copy gets a new id and keeps the original in a header."""
    headers = {k: v for k, v in item.headers.items() if _usable_header(k, v)}
    try:
        shell = DelayedMessage(item.message_id, source, now, item.body, headers)
    except InvalidMessage:
        headers["duetime-error-original-message-id"] = (
            item.message_id[:1000].encode("utf-8", "replace").decode()
        )
        shell = DelayedMessage(new_message_id(), source, now, item.body, headers)
    return shell.with_changes(
        destination=error_queue, headers=error_headers(shell, error, now, 1, endpoint=endpoint)
    )


def _own_fault(error: Exception) -> bool:
    """Whether a store refused a message for what it holds (bad data), not for being down.

    Only such refusals send an envelope to the error queue; anything else is an outage, and the
    envelope waits on its queue (a full disk must not empty the front door into the error queue).
    """
    if isinstance(error, ConfigurationError):  # the store's set-up (a Redis that may evict), not the message
        return False
    if isinstance(error, ValueError | TypeError | OverflowError):  # InvalidMessage is a ValueError
        return True
    sqlstate = getattr(error, "sqlstate", None)  # PostgreSQL: class 22 is "data exception"
    return isinstance(sqlstate, str) and sqlstate.startswith("22")


def _usable_header(key: object, value: object) -> bool:
    """Whether a header can travel on the error-queue copy (the copy must never fail to build)."""
    try:
        check_headers({key: value})
    except InvalidMessage:
        return False
    return True


async def send_delayed(
    transport: Transport,
    endpoint: str,
    destination: str,
    body: bytes = b"",
    *,
    delay: Delay | None = None,
    due_at: datetime | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | None = None,
) -> DelayedMessage:
    """Publish a delayed message to ``<endpoint>.Timeouts`` for a duetime service to store.

    For services that reach only the broker: the dispatcher's front door stores it (once, by its
    id) and forwards it to ``destination`` when it is due. Returns the message as it will arrive.
    """
    message = DelayedMessage.create(
        destination, body, due_at=due_at, delay=delay, headers=headers, message_id=message_id
    )
    envelope = message.with_changes(
        destination=front_door_queue(check_name("endpoint", endpoint)),
        headers=envelope_headers(message.destination, message.due_at, message.headers),
    )
    [outcome] = await transport.send_batch([envelope])
    if outcome is not None:
        raise outcome
    return message
