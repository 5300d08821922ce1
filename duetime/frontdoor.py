"""The front door (NServiceBus's timeout manager): delayed messages arrive on ``<endpoint>.timeouts``.

Each carries its destination and due time in headers. It is stored, and acknowledged only after the
store committed, so nothing is lost; a redelivered message whose id is already stored is just
acknowledged. Malformed ones go to the error queue with the reason. If storing (or receiving) keeps
failing for ``time_to_wait_before_triggering_critical_error_on_timeout_outages`` (2 minutes), the
outage breaker raises the timeout manager's critical error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from duetime.circuit import RepeatedFailuresOverTimeCircuitBreaker
from duetime.deadline import within
from duetime.dispatcher import Dispatcher
from duetime.errorqueue import error_headers
from duetime.errors import (
    ConfigurationError,
    DuplicateMessageId,
    InvalidMessage,
    TransportUnavailable,
    one_line,
)
from duetime.interfaces import ReceivedMessage, ReceivingTransport, Transport
from duetime.message import DUE_AT_HEADER, Delay, DelayedMessage, check_headers, new_message_id
from duetime.names import check_name

log = logging.getLogger("duetime.frontdoor")

#: Where and when the front door should deliver. Distinct from ``duetime-due-at``, which every
#: transport stamps on what it delivers (a message passing through a queue carries both).
DESTINATION_HEADER = "duetime-route-to"
DELIVER_AT_HEADER = "duetime-deliver-at"
NSB_EXPIRE = "NServiceBus.Timeout.Expire"
NSB_ROUTE_TO = "NServiceBus.Timeout.RouteExpiredTimeoutTo"
#: Headers that only carried routing to the front door; the destination does not get them.
ENVELOPE_HEADERS = (DESTINATION_HEADER, DELIVER_AT_HEADER, DUE_AT_HEADER, NSB_EXPIRE, NSB_ROUTE_TO)
#: The timeout manager's words, so operators' alerts written for the timeout manager keep matching.
OUTAGE_MESSAGE = "Repeated failures when fetching timeouts from storage, endpoint will be terminated."
_NSB_WIRE = re.compile(r"^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2}):(\d{1,6}) Z$")


def front_door_queue(endpoint: str) -> str:
    return f"{endpoint}.timeouts"


def parse_due_header(value: str) -> datetime:
    """ISO 8601 with an offset, or NServiceBus's wire format ``2030-01-01 09:00:00:000000 Z``."""
    wire = _NSB_WIRE.match(value.strip())
    if wire:
        day, clock, fraction = wire.groups()
        return datetime.fromisoformat(f"{day}T{clock}.{fraction.ljust(6, '0')}+00:00")
    moment = datetime.fromisoformat(value.strip())
    if moment.tzinfo is None:
        raise ValueError("the due time has no UTC offset")
    return moment.astimezone(UTC)


def envelope_to_message(received: ReceivedMessage) -> DelayedMessage:
    """Turn a front-door message into the delayed message it asks for; InvalidMessage if it can't.

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


def _envelope_to_message(received: ReceivedMessage) -> DelayedMessage:
    headers = received.headers
    destination = headers.get(DESTINATION_HEADER) or headers.get(NSB_ROUTE_TO)
    due_text = headers.get(DELIVER_AT_HEADER) or headers.get(NSB_EXPIRE)
    if not destination:
        raise InvalidMessage(f"no destination header: set {DESTINATION_HEADER!r} (or {NSB_ROUTE_TO!r}).")
    if not due_text:
        raise InvalidMessage(f"no due time header: set {DELIVER_AT_HEADER!r} (or {NSB_EXPIRE!r}).")
    try:
        due_at = parse_due_header(due_text)
    except (ValueError, OverflowError) as error:
        raise InvalidMessage(
            f"due time {due_text!r} cannot be read ({error}); use ISO 8601 with an offset, "
            "e.g. 2030-01-01T09:00:00+00:00."
        ) from None
    kept = {k: v for k, v in headers.items() if k not in ENVELOPE_HEADERS}
    return DelayedMessage(received.message_id, destination, due_at, received.body, kept)


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
    """Consumes ``<endpoint>.timeouts`` into the dispatcher's store while the dispatcher runs."""

    def __init__(self, dispatcher: Dispatcher, receiver: ReceivingTransport, *, wait: float = 0.5) -> None:
        self.dispatcher = dispatcher
        self.receiver = receiver
        self.queue = front_door_queue(dispatcher.endpoint)
        self.wait = wait
        self.stored = 0
        self.rejected = 0
        self.outage_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            "timeout storage",
            dispatcher.settings.time_to_wait_before_triggering_critical_error_on_timeout_outages.total_seconds(),
            dispatcher._trip,
            dispatcher.clock.monotonic,
            OUTAGE_MESSAGE,
        )

    async def start(self) -> None:
        await self.dispatcher.transport.declare(self.queue)

    @property
    def _deadline(self) -> float:
        """How long one call to the queue or the store may take (see ``operation_timeout``)."""
        settings = self.dispatcher.settings
        return min(settings.operation_timeout.total_seconds(), self.outage_breaker.time_to_trigger / 2)

    async def run(self) -> None:
        """Serve until the dispatcher stops. A queue that cannot be declared yet (a broker that is
        down) is retried like any outage; only wrong settings end the front door at once."""
        declared = False
        while not self.dispatcher.stopping:
            if not declared:
                try:
                    await within(self.start(), self._deadline, f"declaring {self.queue}")
                except ConfigurationError:
                    raise
                except Exception as error:
                    self._outage(f"declaring {self.queue}", error)
                    await self.dispatcher._pause()
                    continue
                declared = True
            await self.process_once()

    def _outage(self, doing: str, error: Exception) -> None:
        log.warning("front door: %s failed: %s", doing, one_line(error))
        self.outage_breaker.failure(error)

    async def process_once(self) -> int:
        """Receive one batch and store it; returns how many messages were handled.

        A queue that cannot be read counts against the outage breaker like a store that cannot be
        written: either way delayed messages are not getting in.
        """
        try:
            received = await within(
                self.receiver.receive(self.queue, self.dispatcher.settings.batch_size, self.wait),
                self.wait + self._deadline,
                f"receiving from {self.queue}",
            )
        except Exception as error:
            self._outage(f"receiving from {self.queue}", error)
            await self.dispatcher._pause()
            return 0
        if not received:
            return 0
        good: list[tuple[ReceivedMessage, DelayedMessage]] = []
        bad: list[tuple[ReceivedMessage, InvalidMessage]] = []
        for item in received:
            try:
                good.append((item, envelope_to_message(item)))
            except InvalidMessage as error:
                bad.append((item, error))
        refused: list[tuple[ReceivedMessage, InvalidMessage]] = []
        while good:
            outcome = await self._store(good)
            if outcome is not None:
                refused = outcome
                break
            if self.dispatcher.stopping:
                return 0  # not acknowledged: the queue gives them back later, nothing lost
            await self.dispatcher._pause()
        if bad or refused:
            await self._reject(bad + refused)
        refused_ids = {id(item) for item, _ in refused}
        stored = [r for r, _ in good if id(r) not in refused_ids]
        if stored:
            self.stored += len(stored)
            try:
                await within(self.receiver.acknowledge(stored), self._deadline, "acknowledging")
            except Exception as error:  # stored already: the redelivery is recognised by its id
                log.warning(
                    "front door: acknowledging %d stored messages failed: %s", len(stored), one_line(error)
                )
        return len(received)

    async def _store(
        self, pairs: Sequence[tuple[ReceivedMessage, DelayedMessage]]
    ) -> list[tuple[ReceivedMessage, InvalidMessage]] | None:
        """Store a batch; the envelopes the store refused for their own content, or None if the
        store itself is failing (an outage: nothing is acknowledged, the breaker counts it)."""
        store = self.dispatcher.store
        try:
            await within(store.store_many([m for _, m in pairs]), self._deadline, "storing")
        except DuplicateMessageId:
            pass  # a redelivery: store them one by one below, skipping what is stored
        except Exception as error:
            if not _own_fault(error):
                self._outage(f"storing {len(pairs)} messages", error)
                return None
        else:
            self.outage_breaker.success()
            return []
        refused: list[tuple[ReceivedMessage, InvalidMessage]] = []
        for item, message in pairs:
            try:
                await within(store.store(message), self._deadline, "storing")
            except DuplicateMessageId:
                log.info("front door: %s is already stored (redelivery)", message.message_id)
            except Exception as error:
                if not _own_fault(error):
                    self._outage(f"storing {message.message_id}", error)
                    return None
                refused.append((item, InvalidMessage(f"the store refused it: {error}")))
        self.outage_breaker.success()
        return refused

    async def _reject(self, bad: Sequence[tuple[ReceivedMessage, InvalidMessage]]) -> None:
        """Error queue first, acknowledge after: a rejected envelope is never just dropped. A
        failure here counts against the recovery breaker and leaves the envelope on its queue."""
        now = self.dispatcher.clock.now()
        queue = self.dispatcher.settings.error_queue
        copies = []
        for item, error in bad:
            copies.append(_rejected(item, self.queue, queue, error, now))
            log.warning("front door: %r rejected: %s", item.message_id, error)
        try:
            results = await within(self.dispatcher.transport.send_batch(copies), self._deadline, "rejecting")
            sent = [item for (item, _), r in zip(bad, results, strict=True) if r is None]
            if sent:
                await within(self.receiver.acknowledge(sent), self._deadline, "acknowledging")
                self.rejected += len(sent)
            failures = [r for r in results if r is not None]
        except Exception as error:  # the queue as a whole is down: an outage, the envelopes wait
            self._outage(f"sending rejected envelopes to {queue}", error)
            return
        for failure in failures:
            log.warning("front door: sending a rejected envelope to %s failed: %s", queue, one_line(failure))
            if isinstance(failure, TransportUnavailable):
                self.outage_breaker.failure(failure)
            else:
                self.dispatcher.recovery_breaker.failure(failure)


def _rejected(
    item: ReceivedMessage, source: str, error_queue: str, error: InvalidMessage, now: datetime
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
    return shell.with_changes(destination=error_queue, headers=error_headers(shell, error, now, 1))


def _own_fault(error: Exception) -> bool:
    """Whether a store refused a message for what it holds (bad data), not for being down.

    Only such refusals send an envelope to the error queue; anything else is an outage, and the
    envelope waits on its queue (a full disk must not empty the front door into the error queue).
    """
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
    """Publish a delayed message to ``<endpoint>.timeouts`` for a duetime service to store.

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
