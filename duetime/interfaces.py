"""The contracts between duetime's three roles: store, transport, dispatcher.

They are Protocols, so a custom store or transport needs no base class: implement the methods and
pass the object in (NServiceBus's "custom delayed message store").
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from duetime.api_keys import ApiKey
from duetime.audit import AuditEntry, AuditQuery
from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_time
from duetime.limits import Limit, Pause, Rate, RateGrant
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import DelayedMessage
from duetime.recurring.schedule import PlanReport, Schedule
from duetime.settings import TransactionMode
from duetime.webhooks import AttemptLog, WebhookEndpoint

#: Called by a store when something may now be due earlier than before; ``None`` means "another
#: process changed the store, look again".
WakeupCallback = Callable[[datetime | None], None]


# ``with`` / ``async with`` for everything that has a ``close()``: stores, transports, clients.


class _AsyncClosable(Protocol):
    async def close(self) -> None: ...


class _Closable(Protocol):
    def close(self) -> None: ...


A = TypeVar("A", bound=_AsyncClosable)
S = TypeVar("S", bound=_Closable)


class AsyncClosing:
    """``async with store:`` closes the store on the way out, whatever happened inside."""

    async def __aenter__(self: A) -> A:
        return self

    async def __aexit__(self: _AsyncClosable, *exc: object) -> None:
        await self.close()


class Closing:
    """``with store:`` closes the store on the way out, whatever happened inside."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(self: _Closable, *exc: object) -> None:
        self.close()


class Clock(Protocol):
    """Where the dispatcher reads the time and waits: the system clock (aligned on the store
    server's), or a fake one in tests."""

    def now(self) -> datetime:
        """The time now, in UTC (what "due" is compared with)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go back (what breakers and deadlines use)."""

    async def wait(self, event: asyncio.Event, timeout: float, *, slack: float = 0.0) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` seconds have passed (False), ending on
        time to well under a millisecond; or anywhere in its last ``slack`` seconds, when a wait
        that ends a little early costs less."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""


@dataclass(frozen=True, slots=True)
class ListQuery:
    """Filter and page for operator listings; ``after`` is the cursor from the previous page."""

    destination: str | None = None
    due_before: datetime | None = None
    due_after: datetime | None = None
    min_failures: int = 0
    group: str | None = None
    limit: int = 100
    after: tuple[datetime, str] | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of ``list``: the stored messages in due order, and where the next page starts (a
    cursor, not an offset: a page stays right while messages come and go before it)."""

    messages: list[DelayedMessage]
    #: Pass as ``ListQuery(after=...)`` to read the next page; None on the last page.
    next_cursor: tuple[datetime, str] | None


def cursor_text(cursor: tuple[datetime, str]) -> str:
    """A page's cursor as users carry it (``duetime list --after``, the dashboard's next link):
    the due time in ISO 8601, ``~``, and the id."""
    return f"{cursor[0].isoformat()}~{cursor[1]}"


def read_cursor(text: str) -> tuple[datetime, str]:
    """The cursor :func:`cursor_text` wrote; anything else is a one-line error."""
    due, sep, message_id = text.partition("~")
    if not sep or not message_id:
        raise ConfigurationError(
            f"{text!r} is not a place in the listing; pass the value the previous page gave (a due "
            "time, '~', and an id)."
        )
    return parse_time(due), message_id


def about(n: int, estimated: bool) -> str:
    """``n`` with thousands separators, or for an estimate ``about`` and two significant figures
    (``about 10.0 M``, ``about 52,000``): a figure from statistics must never read as a count."""
    if not estimated:
        return f"{n:,}"
    if n >= 1_000_000:
        return f"about {n / 1_000_000:.1f} M"
    return f"about {round(n, 2 - len(str(n))):,}"


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """What a store holds at a moment."""

    total: int
    due: int
    claimed: int
    failing: int
    next_due: datetime | None
    #: The destinations holding the most, at most DESTINATIONS_SHOWN of them; the rest are
    #: summed up in ``more_destinations`` (how many) and ``more_messages`` (what they hold).
    by_destination: Mapping[str, int] = field(default_factory=dict)
    more_destinations: int = 0
    more_messages: int = 0
    #: The total and the per-destination figures are estimates, not a count (the database's
    #: statistics, or a sample of the messages): a large store is not scanned to answer (shown
    #: as "about").
    estimated: bool = False
    #: Messages a flow-control limit or a pause holds back right now (:mod:`duetime.limits`):
    #: due, and waiting for their turn, not for duetime.
    held: int = 0

    def said(self, n: int) -> str:
        """One of these figures as a person reads it: ``about(n, self.estimated)``."""
        return about(n, self.estimated)

    def rest_said(self) -> str:
        """The line for the destinations not listed (empty: none)."""
        if not self.more_messages and not self.more_destinations:
            return ""
        if not self.more_destinations:
            return "destinations not counted (a store this large is not scanned)"
        return f"and {about(self.more_destinations, self.estimated)} more destinations"

    def oldest_due_waited(self, counted_at: datetime) -> float | None:
        """Seconds the oldest due message had waited when these counts were taken at
        ``counted_at`` (None: none was due). Always against the count's own time: against a later
        moment, a count a few seconds old shows a wait that is not there."""
        if self.next_due is None or self.next_due > counted_at:
            return None
        return (counted_at - self.next_due).total_seconds()


class Moved(NamedTuple):
    """A message a transactional move delivered (its body and headers are not read back)."""

    message_id: str
    destination: str
    due_at: datetime
    #: Its W3C ``traceparent`` header, if it has one (the forward span links to it).
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class NextDue:
    """The earliest due time left in a store (``at`` None: nothing is), read by the store itself."""

    at: datetime | None


@dataclass(frozen=True, slots=True)
class MoveOutcome:
    """What one transactional move did: delivered, and sent to the error queue (with why).

    ``next_due`` is the earliest due time left once the move committed, read in the same call:
    the dispatcher then sleeps without asking the store again (a hand-off to the store's thread
    and back per round, most of a round's cost at a few hundred messages a second). None: not
    read (the dispatcher asks).
    """

    moved: list[Moved]
    dead_lettered: list[tuple[DelayedMessage, str]]
    next_due: NextDue | None = None


@runtime_checkable
class DelayedMessageStore(Protocol):
    """NServiceBus's ``IDelayedMessageStore`` (with infrastructure), batched and async."""

    async def setup_infrastructure(self, endpoint: str) -> None:
        """Create what ``endpoint`` needs; idempotent and safe from several processes at once."""

    async def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        """Bind to ``endpoint``; raise UnsupportedTransactionMode if the mode cannot be honoured."""

    async def store(self, message: DelayedMessage) -> None:
        """Store one message durably before returning; a ``message_id`` already stored raises
        DuplicateMessageId and changes nothing."""

    async def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        """Store every message, all or none (one transaction where the store has them); how many.
        An id already stored fails the whole call and stores none."""

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        """Claim up to ``limit`` messages due at ``at``, oldest first; no other caller gets them
        until they are removed, their failure is counted, or the claim times out."""

    async def next_due(self) -> datetime | None:
        """The earliest due time of an unclaimed message, or None when nothing is stored: how long
        a dispatcher may sleep. Never later than the truth (a claimed row may hide an earlier one
        only while it is claimed)."""

    async def remove(self, message_id: str) -> bool:
        """Remove a forwarded message; False if it was gone already (cancelled, or removed by
        another dispatcher after its claim timed out)."""

    async def remove_many(self, message_ids: Sequence[str]) -> int:
        """Remove forwarded messages; how many were still there."""

    async def increment_failure_count(self, message_id: str) -> bool:
        """Count a failed forward and release the claim; False if the message is gone."""

    async def release(self, message_ids: Sequence[str]) -> int:
        """Give claims back untouched (graceful stop with a batch not yet forwarded)."""

    async def get(self, message_id: str) -> DelayedMessage | None:
        """The stored message, or None; claims are not taken or changed."""

    async def cancel(self, message_id: str) -> bool:
        """Remove a message no dispatcher is forwarding; False if it is not there. One being
        forwarded raises MessageInFlight (it may be delivered already)."""

    async def cancel_group(self, group: str, limit: int | None = None) -> int:
        """Cancel every stored message of ``group`` no dispatcher is forwarding, or at most
        ``limit`` of them in one transaction (a large group in batches); how many."""
        ...

    async def count_group(self, group: str) -> int:
        """How many stored messages ``group`` holds."""
        ...

    async def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """Give a stored message a new due time; False if it is not there. One being forwarded
        raises MessageInFlight."""

    async def list(self, query: ListQuery) -> Page:
        """A page of stored messages in due order, filtered by ``query``; ``Page.next_cursor``
        continues it. Each page is bounded, however large the store."""

    async def counts(self, at: datetime) -> StoreCounts:
        """What the store holds at ``at``: totals, due, claimed, failing, the next due time and the
        backlog by destination (the biggest, and how many more)."""

    def subscribe(self, callback: WakeupCallback) -> Callable[[], None]:
        """Call ``callback`` with a due time whenever something may now be due earlier (or None:
        look again); returns the function that unsubscribes. Stores that cannot tell never call it."""

    async def close(self) -> None:
        """Release connections and threads; the store cannot be used after. A second close does
        nothing."""


@runtime_checkable
class SyncDelayedMessageStore(Protocol):
    """The blocking twin, for producers that are not async (web apps, scripts, Spark executors)."""

    def setup_infrastructure(self, endpoint: str) -> None:
        """As :meth:`DelayedMessageStore.setup_infrastructure`, blocking."""

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        """As :meth:`DelayedMessageStore.initialize`, blocking."""

    def store(self, message: DelayedMessage) -> None:
        """As :meth:`DelayedMessageStore.store`, blocking."""

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        """As :meth:`DelayedMessageStore.store_many`, blocking."""

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        """As :meth:`DelayedMessageStore.fetch_due`, blocking."""

    def next_due(self) -> datetime | None:
        """As :meth:`DelayedMessageStore.next_due`, blocking."""

    def remove(self, message_id: str) -> bool:
        """As :meth:`DelayedMessageStore.remove`, blocking."""

    def remove_many(self, message_ids: Sequence[str]) -> int:
        """As :meth:`DelayedMessageStore.remove_many`, blocking."""

    def increment_failure_count(self, message_id: str) -> bool:
        """As :meth:`DelayedMessageStore.increment_failure_count`, blocking."""

    def release(self, message_ids: Sequence[str]) -> int:
        """As :meth:`DelayedMessageStore.release`, blocking."""

    def get(self, message_id: str) -> DelayedMessage | None:
        """As :meth:`DelayedMessageStore.get`, blocking."""

    def cancel(self, message_id: str) -> bool:
        """As :meth:`DelayedMessageStore.cancel`, blocking."""

    def cancel_group(self, group: str, limit: int | None = None) -> int:
        """As :meth:`DelayedMessageStore.cancel_group`, blocking."""

    def count_group(self, group: str) -> int:
        """As :meth:`DelayedMessageStore.count_group`, blocking."""

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """As :meth:`DelayedMessageStore.reschedule`, blocking."""

    def list(self, query: ListQuery) -> Page:
        """As :meth:`DelayedMessageStore.list`, blocking."""

    def counts(self, at: datetime) -> StoreCounts:
        """As :meth:`DelayedMessageStore.counts`, blocking."""

    def close(self) -> None:
        """As :meth:`DelayedMessageStore.close`, blocking."""


@runtime_checkable
class Transport(Protocol):
    """Where due messages go. ``send_batch`` answers per message: None, or the exception."""

    async def start(self) -> None:
        """Connect (again, after a failure); TransportUnavailable while the server cannot be
        reached, ConfigurationError for what waiting will not fix (credentials, a missing vhost)."""

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        """Send each message to its destination queue: one result per message, in order (None:
        the transport holds it durably). A message's own failure is its result (DestinationNotFound,
        MessageRefused, TransportUnavailable for what the connection lost); raising means nothing
        in the batch can be counted as sent. A refusal of one message by the broker (a channel or
        a connection it closes because of that message) is that message's MessageRefused, never
        an outage of the batch: ``duetime.backends.refusals`` sorts a failure by what the broker
        said, and ``ContainmentContract`` in ``duetime.testing.transport_contract`` checks it."""

    async def declare(self, queue: str) -> None:
        """Create ``queue`` if it is missing (durable); one that exists is taken as it is."""

    async def close(self) -> None:
        """Release the connection; calls after it raise TransportUnavailable."""


@runtime_checkable
class CountsAttempts(Protocol):
    """A transport that keeps what each attempt came to, per destination (webhooks: a request
    each), for the metrics: ``duetime_webhook_requests`` and ``duetime_webhook_request_seconds``."""

    @property
    def attempt_log(self) -> AttemptLog:
        """The attempts so far, as this process made them."""
        ...


@runtime_checkable
class HoldsTransports(Protocol):
    """A transport made of others (routes, a sealed route): what each part offers is asked of it."""

    @property
    def parts(self) -> Sequence[Transport]:
        """The transports it sends through."""
        ...


@runtime_checkable
class RetryingStore(Protocol):
    """A store that can put a failed message off in one change (every duetime store can): what a
    destination's own retry schedule needs (:class:`duetime.errors.RetryLater`)."""

    async def retry_later(self, message_id: str, due_at: datetime) -> bool:
        """Count one failure, release the claim and make the message due at ``due_at``; False if
        it is not stored (cancelled meanwhile)."""
        ...


@runtime_checkable
class NewOnlyStore(Protocol):
    """A store that can store, in one call, only the messages of a batch it does not hold yet:
    what resuming an interrupted load or a retry of many needs. Every duetime store has it; for a
    store without it, ``duetime.operations.message_files.store_new`` stores one message at a time."""

    async def store_new(self, messages: Sequence[DelayedMessage]) -> int:
        """Store those of ``messages`` whose id is not stored (the first of an id repeated in the
        batch); return how many were stored. Never raises DuplicateMessageId."""


class IfExists(enum.StrEnum):
    """What scheduling does when a message with the same id is waiting in the store.

    ``refuse`` (the default) raises DuplicateMessageId; ``keep`` leaves the stored one and answers
    with it; ``replace`` puts the new body, headers, destination, group and due time in its place
    in one change; ``debounce`` is a replace whose due time the caller counted from now (so the
    message goes once, a delay after the last of a burst). A message a dispatcher holds is never
    replaced: MessageInFlight says so. With no such id waiting, each stores the message."""

    REFUSE = "refuse"
    KEEP = "keep"
    REPLACE = "replace"
    DEBOUNCE = "debounce"

    @classmethod
    def of(cls, value: object) -> IfExists:
        """``value`` as an IfExists; ConfigurationError naming the choices otherwise."""
        try:
            return cls(value if isinstance(value, str) else "")
        except ValueError:
            choices = ", ".join(c.value for c in cls)
            raise ConfigurationError(f"if_exists must be one of {choices}; got {value!r}.") from None


class Put(NamedTuple):
    """What scheduling with :class:`IfExists` did: ``outcome`` is ``"stored"`` (no message had
    the id), ``"kept"`` (the stored one stays; ``message`` is it) or ``"replaced"``."""

    message: DelayedMessage
    outcome: str


@runtime_checkable
class ReplacingStore(Protocol):
    """A store that can store a message in place of a waiting one with its id (every duetime
    store can; a store built on ``StoreRules`` implements ``_replace_unclaimed``)."""

    async def put(self, message: DelayedMessage, if_exists: IfExists) -> Put:
        """Store ``message``, doing ``if_exists`` when its id is waiting; DuplicateMessageId for
        ``refuse``, MessageInFlight when a dispatcher holds (or has just taken) the stored one."""


@runtime_checkable
class SyncReplacingStore(Protocol):
    """:class:`ReplacingStore`, blocking."""

    def put(self, message: DelayedMessage, if_exists: IfExists) -> Put:
        """As :meth:`ReplacingStore.put`, blocking."""
        ...


@runtime_checkable
class RecurringStore(Protocol):
    """A store that keeps recurring schedules beside the messages (every duetime store does; a
    store built on ``StoreRules`` implements six row primitives). Each tick is a stored message;
    see :mod:`duetime.recurring`."""

    async def add_schedule(self, schedule: Schedule, now: datetime | None = None) -> Schedule:
        """Keep ``schedule`` and store its first ticks; ScheduleExists if its id is taken."""

    async def get_schedule(self, schedule_id: str) -> Schedule:
        """The schedule; ScheduleNotFound if there is none."""

    async def list_schedules(self, after: str = "", limit: int = 100) -> list[Schedule]:
        """A page of schedules by id; pass the last id back as ``after``."""

    async def change_schedule(
        self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime | None = None
    ) -> Schedule:
        """Apply ``change``; it takes effect from the next tick (stored ticks are planned again)."""

    async def pause_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """No ticks until resumed; stored ones not being delivered are removed."""

    async def resume_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """Tick again from the next planned time."""

    async def remove_schedule(self, schedule_id: str) -> int:
        """Forget it and remove its stored ticks; how many ticks were removed."""

    async def trigger_schedule(self, schedule_id: str, now: datetime | None = None) -> DelayedMessage:
        """One extra tick now."""

    async def backfill_schedule(
        self, schedule_id: str, start: datetime, end: datetime, now: datetime | None = None
    ) -> int:
        """Send now the ticks planned between ``start`` and ``end``; how many were stored."""

    async def plan_schedules(
        self, now: datetime | None = None, *, steady_since: datetime | None = None
    ) -> PlanReport:
        """Store the ticks coming due soon of every schedule that needs them (dispatchers call
        this every second or so; any number may, at once). ``steady_since``: since when the
        caller has planned every step (a tick planned after that is late, not missed)."""


@runtime_checkable
class SyncRecurringStore(Protocol):
    """The blocking twin of :class:`RecurringStore`: the same promises, not awaited."""

    def add_schedule(self, schedule: Schedule, now: datetime | None = None) -> Schedule:
        """Keep ``schedule`` and store its first ticks; ScheduleExists if its id is taken."""

    def get_schedule(self, schedule_id: str) -> Schedule:
        """The schedule; ScheduleNotFound if there is none."""

    def list_schedules(self, after: str = "", limit: int = 100) -> list[Schedule]:
        """A page of schedules by id; pass the last id back as ``after``."""

    def change_schedule(
        self, schedule_id: str, change: Callable[[Schedule], Schedule], now: datetime | None = None
    ) -> Schedule:
        """Apply ``change``; it takes effect from the next tick."""

    def pause_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """No ticks until resumed; stored ones not being delivered are removed."""

    def resume_schedule(self, schedule_id: str, now: datetime | None = None) -> Schedule:
        """Tick again from the next planned time."""

    def remove_schedule(self, schedule_id: str) -> int:
        """Forget it and remove its stored ticks; how many ticks were removed."""

    def trigger_schedule(self, schedule_id: str, now: datetime | None = None) -> DelayedMessage:
        """One extra tick now."""

    def backfill_schedule(
        self, schedule_id: str, start: datetime, end: datetime, now: datetime | None = None
    ) -> int:
        """Send now the ticks planned between ``start`` and ``end``; how many were stored."""


@runtime_checkable
class TransactionalStore(Protocol):
    """A store that can move due messages into a transport inside one transaction (exactly-once)."""

    def shares_transaction_with(self, transport: object) -> bool:
        """Whether one transaction can both remove from this store and put into ``transport``
        (the same database): the condition for exactly-once."""

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
        """In one transaction: claim up to ``limit`` messages due at ``at``, put each into its
        queue of ``transport`` (into ``error_queue``, with ``error_headers``, when its queue does
        not exist) and remove it. A crash rolls the whole move back: nothing lost or doubled.

        ``until`` (later than ``at``) asks for the move made ahead: a store whose queue rows carry
        the time they become visible may also take what comes due by ``until``, each hidden from
        every receiver until its due time, so that one move carries what a steady stream brings
        in that window instead of a move each. A cancel, reschedule or replace of such a message
        is refused (MessageInFlight) until it is visible. A store that cannot moves only what is
        due at ``at``. ``budget`` (the dispatcher's lateness budget): a message moved ahead may
        become visible at its due time rounded up to a whole multiple of it (never before its due
        time, at most ``budget`` after), so that a receiver wakes once for the messages of each
        step instead of once for each."""


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message taken from a queue; acknowledge it by its ``receipt`` once it is handled."""

    queue: str
    message_id: str
    headers: Mapping[str, str]
    body: bytes
    receipt: str
    delivery_count: int
    #: Why this message cannot be read as duetime wrote it (headers that are not JSON text, say),
    #: or None. Such a message is still handed out, so a consumer can move it aside, not stall.
    problem: str | None = None


@runtime_checkable
class ReceivingTransport(Protocol):
    """A transport a program (or the front door) can consume from."""

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` from ``queue``, waiting up to ``wait`` seconds for the first; each
        hidden from other receivers until acknowledged or its visibility time ends.

        ``done``: messages handled since the last call, acknowledged before anything is taken (in
        the same statement, on the SQL queues: a consumer's loop then costs one round trip a
        batch, not two). If the call raises, they may come back, as unacknowledged ones do."""

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        """Remove handled messages for good; how many were still held (a receipt that expired
        removes nothing: the message went to another receiver)."""


@runtime_checkable
class AddressTopology(Protocol):
    """A broker where senders may publish to more than the queue: NServiceBus.RabbitMQ's
    conventional routing topology publishes to a fanout exchange named after the queue."""

    async def declare_address(self, queue: str) -> None:
        """Declare ``queue`` and whatever senders of every routing topology publish to."""
        ...


@runtime_checkable
class InspectableQueue(Transport, Protocol):
    """A transport whose queues an operator can look into and pick messages from: every queue
    transport, brokers included (the error queue's list, retry and discard commands need it).

    On a broker a look may be a get-and-put-back; what it shows is a snapshot, and a message
    picked by id is the operator's until acknowledged (or the transport closes)."""

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        """Up to ``limit`` messages, oldest first, left where they are."""

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Receive these particular messages (those still there); acknowledge each once handled,
        and what is not acknowledged goes back to the queue."""

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        """Remove messages taken with ``take`` (or received) for good; how many were still held."""

    async def depth(self, queue: str) -> int:
        """How many messages ``queue`` holds now."""

    async def has_queue(self, queue: str) -> bool:
        """Whether ``queue`` is declared (a message for it would be delivered, not dead-lettered)."""


@runtime_checkable
class BrowsableQueue(InspectableQueue, Protocol):
    """A queue transport that also knows every queue declared on it: the queue tables in SQLite
    and PostgreSQL (``duetime stats`` shows their depths)."""

    async def queues(self) -> dict[str, int]:
        """Every declared queue and how many messages it holds."""


@runtime_checkable
class DispatcherRegistry(Protocol):
    """A store where dispatchers say they are there (``duetime run`` does, every few seconds),
    so ``duetime stats`` and the dashboard can show who delivers and who is gone."""

    async def beat(self, info: DispatcherInfo) -> None:
        """Record (or refresh) a dispatcher's record; a record not refreshed for a while shows as
        gone."""

    async def dispatchers(self) -> list[DispatcherInfo]:
        """The endpoint's dispatchers, newest first; ``DispatcherInfo.status`` tells which live."""
        ...


@runtime_checkable
class ApiKeyStore(Protocol):
    """A store that keeps the HTTP API's keys (every duetime store does): one record per name,
    the secret's hash and never the secret (:mod:`duetime.api_keys`)."""

    async def add_api_key(self, key: ApiKey) -> None:
        """Keep a new key; ApiKeyExists while a key of that name is in use."""

    async def api_keys(self) -> list[ApiKey]:
        """Every key, revoked ones too, by name."""
        ...

    async def revoke_api_key(self, name: str, at: datetime) -> bool:
        """Refuse the key from ``at`` on; False if no key of that name is in use."""
        ...


@runtime_checkable
class SyncApiKeyStore(Protocol):
    """The blocking twin of :class:`ApiKeyStore`."""

    def add_api_key(self, key: ApiKey) -> None:
        """As :meth:`ApiKeyStore.add_api_key`, blocking."""

    def api_keys(self) -> list[ApiKey]:
        """As :meth:`ApiKeyStore.api_keys`, blocking."""
        ...

    def revoke_api_key(self, name: str, at: datetime) -> bool:
        """As :meth:`ApiKeyStore.revoke_api_key`, blocking."""
        ...


@runtime_checkable
class AuditStore(Protocol):
    """A store that keeps the audit trail of the changes made to it (every duetime store does,
    in its named records): who, when, what, the ids, from where (:mod:`duetime.audit`)."""

    async def audit(self, entry: AuditEntry) -> None:
        """Keep ``entry``."""

    async def audit_entries(self, query: AuditQuery) -> tuple[list[AuditEntry], str | None]:
        """A page of the trail, newest first (or oldest first, as the query says), and the
        cursor of the next page (None on the last)."""
        ...

    async def prune_audit(self, before: datetime) -> int:
        """Forget the entries from before ``before``; how many."""
        ...


@runtime_checkable
class SyncAuditStore(Protocol):
    """The blocking twin of :class:`AuditStore`."""

    def audit(self, entry: AuditEntry) -> None:
        """As :meth:`AuditStore.audit`, blocking."""

    def audit_entries(self, query: AuditQuery) -> tuple[list[AuditEntry], str | None]:
        """As :meth:`AuditStore.audit_entries`, blocking."""
        ...

    def prune_audit(self, before: datetime) -> int:
        """As :meth:`AuditStore.prune_audit`, blocking."""
        ...


@runtime_checkable
class WebhookStore(Protocol):
    """A store that keeps the webhook endpoints its messages are delivered to (every duetime
    store does), so every dispatcher of the store delivers to the same ones
    (:mod:`duetime.webhooks`)."""

    async def add_webhook(self, webhook: WebhookEndpoint) -> None:
        """Keep a new endpoint; WebhookExists if one has its name."""

    async def change_webhook(self, webhook: WebhookEndpoint) -> bool:
        """Put ``webhook`` in place of the one of its name; False if there is none."""
        ...

    async def webhooks(self) -> list[WebhookEndpoint]:
        """Every endpoint, by name."""
        ...

    async def remove_webhook(self, name: str) -> bool:
        """Forget the endpoint and its secrets; False if there is none of that name."""
        ...


@runtime_checkable
class SyncWebhookStore(Protocol):
    """The blocking twin of :class:`WebhookStore`."""

    def add_webhook(self, webhook: WebhookEndpoint) -> None:
        """As :meth:`WebhookStore.add_webhook`, blocking."""

    def change_webhook(self, webhook: WebhookEndpoint) -> bool:
        """As :meth:`WebhookStore.change_webhook`, blocking."""
        ...

    def webhooks(self) -> list[WebhookEndpoint]:
        """As :meth:`WebhookStore.webhooks`, blocking."""
        ...

    def remove_webhook(self, name: str) -> bool:
        """As :meth:`WebhookStore.remove_webhook`, blocking."""
        ...


@runtime_checkable
class FlowControlStore(Protocol):
    """A store that keeps flow-control limits and pauses (:mod:`duetime.limits`) and the state
    they share, so that every dispatcher of it obeys one limit; and that holds a claimed message
    back, unclaimed and hidden, until its turn."""

    async def set_limit(self, limit: Limit) -> None:
        """Keep ``limit`` for its destination (or pattern), in place of any it had."""

    async def limits(self) -> list[Limit]:
        """Every limit, by destination."""
        ...

    async def remove_limit(self, destination: str) -> bool:
        """Forget the limit; False if there was none."""
        ...

    async def pause_destination(self, pause: Pause) -> bool:
        """Pause; False (the first pause kept) if it is paused already."""
        ...

    async def resume_destination(self, destination: str) -> bool:
        """Resume; False if it was not paused."""
        ...

    async def paused(self) -> list[Pause]:
        """Every pause, by destination."""
        ...

    async def take_rate(self, bucket: str, rate: Rate, wanted: int, now: datetime) -> RateGrant:
        """Up to ``wanted`` turns of ``rate`` from the bucket, shared by every dispatcher."""
        ...

    async def take_slots(self, bucket: str, holder: str, wanted: int, most: int, now: datetime) -> int:
        """Up to ``wanted`` of ``most`` concurrency slots for ``holder``; how many it got."""
        ...

    async def give_slots(self, bucket: str, holder: str, count: int, now: datetime) -> None:
        """Give back slots ``holder`` took."""

    async def hold(self, until: Mapping[str, datetime]) -> int:
        """Give claimed messages back, each (by id) hidden until its time: due time, failures
        and content unchanged; a cancel, reschedule or replace reaches them meanwhile."""
        ...

    async def release_held(self) -> int:
        """Every held message claimable at once (a limit or a pause changed)."""
        ...


@runtime_checkable
class SyncFlowControlStore(Protocol):
    """The blocking side of :class:`FlowControlStore` that the command line uses."""

    def set_limit(self, limit: Limit) -> None:
        """As :meth:`FlowControlStore.set_limit`, blocking."""

    def limits(self) -> list[Limit]:
        """As :meth:`FlowControlStore.limits`, blocking."""
        ...

    def remove_limit(self, destination: str) -> bool:
        """As :meth:`FlowControlStore.remove_limit`, blocking."""
        ...

    def pause_destination(self, pause: Pause) -> bool:
        """As :meth:`FlowControlStore.pause_destination`, blocking."""
        ...

    def resume_destination(self, destination: str) -> bool:
        """As :meth:`FlowControlStore.resume_destination`, blocking."""
        ...

    def paused(self) -> list[Pause]:
        """As :meth:`FlowControlStore.paused`, blocking."""
        ...


@dataclass(frozen=True, slots=True)
class Resealed:
    """One step of a key rotation (:meth:`SealingStore.reseal`)."""

    #: Messages looked at in this step.
    seen: int
    #: Sealed again with the primary key (or sealed for the first time: they were in plaintext).
    resealed: int
    #: To seal but left for the next pass: a dispatcher held them, or they changed meanwhile.
    busy: int
    #: Sealed with a key the keyring does not hold, or failing to authenticate: left as they are.
    unreadable: int
    #: The key each message of this step was sealed with when it was read ("" for plaintext).
    by_key: Mapping[str, int]
    #: Where the next step starts; None when this was the last.
    after: tuple[datetime, str] | None


@runtime_checkable
class SealingStore(Protocol):
    """A store that seals messages with a keyring (every store built on ``StoreRules``; see
    :mod:`duetime.encryption`) and can seal what it holds again with the primary key, online."""

    async def reseal(
        self, after: tuple[datetime, str] | None, limit: int, *, look_only: bool = False
    ) -> Resealed:
        """Seal again each of the next ``limit`` messages (in due order after ``after``) that is
        not sealed with the primary key; ``look_only`` counts by key and changes nothing."""
        ...

    async def reseal_schedules(self, *, look_only: bool = False) -> Mapping[str, int]:
        """Seal every recurring schedule again with the primary key; how many are sealed with each
        key after it ("" for plaintext)."""
        ...


@runtime_checkable
class SyncSealingStore(Protocol):
    """:class:`SealingStore`, blocking."""

    def reseal(self, after: tuple[datetime, str] | None, limit: int, *, look_only: bool = False) -> Resealed:
        """As :meth:`SealingStore.reseal`, blocking."""
        ...

    def reseal_schedules(self, *, look_only: bool = False) -> Mapping[str, int]:
        """As :meth:`SealingStore.reseal_schedules`, blocking."""
        ...


@runtime_checkable
class DueCounter(Protocol):
    """A store that counts what falls due by a time without counting everything else (the
    dashboard's "due in the next minute, hour, day" on a store of millions)."""

    async def count_due(self, at: datetime) -> int:
        """How many stored messages are due by ``at``, counted by an index range."""


@runtime_checkable
class CarryCheck(Protocol):
    """A transport that knows, before sending, what it could never carry unchanged."""

    def cannot_carry(self, message: DelayedMessage) -> str | None:
        """Why this transport could never carry ``message`` byte for byte (too large for the
        server, a header it refuses or would change), or None. Limits the server tells are known
        once the transport is started."""


@runtime_checkable
class ChecksKeeping(Protocol):
    """A store whose server can be switched, while in use, to lose what it took (a Redis whose
    ``maxmemory-policy`` is changed to evict keys)."""

    async def check_keeping(self) -> None:
        """Raise (ConfigurationError, with how to fix it) unless the store keeps what it takes,
        asked of the server now: a caller that drops its own copy of what it stored (the front
        door acknowledging a batch) asks first."""


@runtime_checkable
class Located(Protocol):
    """A transport or store that says where it is: its URL (shown with its secrets hidden)."""

    @property
    def url(self) -> str:
        """The URL it was opened with (its password shown only through ``redact``)."""
        ...


@runtime_checkable
class ReadsFromStore(Protocol):
    """A transport that needs the store the dispatcher delivers from (webhooks read their
    endpoints there): the dispatcher hands it over before it starts the transport."""

    def attach_store(self, store: object) -> None:
        """Use ``store`` from now on."""


@runtime_checkable
class ServerClock(Protocol):
    """A store whose server keeps its own time (PostgreSQL, MariaDB, Redis)."""

    async def server_time(self) -> datetime | None:
        """The server's time now, in UTC (None: no server; the host's clock rules). A dispatcher
        compares due times and claims with it, never with its host's clock alone."""


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claimed batch, and the earliest due time left once it was claimed (``next_due``; None:
    not read, because the batch came back full or the store could not read it in the claim)."""

    messages: list[DelayedMessage]
    next_due: NextDue | None = None


@runtime_checkable
class ClaimsWithNextDue(Protocol):
    """A store that can read the next due time in the claim's own call.

    A dispatcher that claims a short batch (nothing else is due) sleeps toward the next due time
    afterwards; read with the claim, it costs no second call: at a few hundred messages a second
    that call was a fifth of an at-least-once round."""

    async def fetch_due_and_next(self, at: datetime, limit: int) -> Claimed:
        """As :meth:`DelayedMessageStore.fetch_due`, and for a batch shorter than ``limit`` the
        earliest due time left, as :meth:`DelayedMessageStore.next_due` would answer just after
        (never later than the truth)."""


@runtime_checkable
class ClaimPolicy(Protocol):
    """A store that says whether a dispatcher may claim its next batch while the last one is
    still being sent (a store without it is assumed to allow that)."""

    @property
    def parallel_claims(self) -> bool:
        """True when claiming the next batch beside a send helps (a server with several
        connections); False for a store with one writer at a time (SQLite)."""


#: A database delivery log's outcome of a delivery a flow-control limit governed (its row has no
#: column more): the report leaves it out of lateness, as a file's ``held_ms`` says.
HELD_OUTCOME = "delivered-held"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message forwarded or dead-lettered, as the delivery log keeps it."""

    message_id: str
    destination: str
    due_at: datetime
    dispatched_at: datetime
    attempts: int
    #: "delivered" or "dead-lettered"
    outcome: str
    #: A flow-control limit or pause governed its destination: its wait is ``held_ms``, the
    #: limit's, and it has no ``lateness_ms`` (the two never mix).
    held: bool = False

    def as_json(self) -> dict[str, Any]:
        waited = round((self.dispatched_at - self.due_at).total_seconds() * 1000, 3)
        return {
            "message_id": self.message_id,
            "destination": self.destination,
            "due_at": self.due_at.isoformat(),
            "dispatched_at": self.dispatched_at.isoformat(),
            "lateness_ms": None if self.held else waited,
            "held_ms": waited if self.held else None,
            "attempts": self.attempts,
            "outcome": self.outcome,
        }


@runtime_checkable
class DeliveryLog(Protocol):
    """Where the dispatcher records each delivery, if asked (``duetime run --delivery-log``)."""

    async def record(self, entries: Sequence[Delivery]) -> None:
        """Append ``entries``; a failure is the log's (the dispatcher logs a warning and goes on)."""

    async def close(self) -> None:
        """Flush and release what the log holds."""


def require(obj: object, protocol: type, role: str, hint: str) -> None:
    """Raise a one-line :class:`ConfigurationError` unless ``obj`` is a ``protocol``, and async where
    it is async: a runtime-checkable Protocol compares method names only, so a blocking store
    passed where an async one belongs (or the reverse) would pass the check and then return
    coroutines nobody awaits, or block the event loop. ``role`` names what it is for, ``hint``
    says how to make the right one."""
    methods = {n: m for n, m in vars(protocol).items() if not n.startswith("_") and callable(m)}
    wanted_kind = (
        "an async" if any(inspect.iscoroutinefunction(m) for m in methods.values()) else "a blocking"
    )
    if not isinstance(obj, protocol):
        raise ConfigurationError(
            f"{role} must be {wanted_kind} {protocol.__name__}, got {type(obj).__name__}; {hint}"
        )
    for name, wanted in methods.items():
        if inspect.iscoroutinefunction(wanted) != inspect.iscoroutinefunction(getattr(obj, name)):
            kind, other = (
                ("async", "blocking") if inspect.iscoroutinefunction(wanted) else ("blocking", "async")
            )
            raise ConfigurationError(
                f"{role} must be {wanted_kind} {protocol.__name__}, whose {name}() is {kind}, but "
                f"{type(obj).__name__}'s is {other}; {hint}"
            )
