"""The contracts between duetime's three roles: store, transport, dispatcher.

They are Protocols, so a custom store or transport needs no base class: implement the methods and
pass the object in (NServiceBus's "custom delayed message store").
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_time
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import DelayedMessage
from duetime.settings import TransactionMode

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
    def now(self) -> datetime: ...
    def monotonic(self) -> float: ...
    async def wait(self, event: asyncio.Event, timeout: float) -> bool: ...
    async def sleep(self, seconds: float) -> None: ...


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


class Moved(NamedTuple):
    """A message a transactional move delivered (its body and headers are not read back)."""

    message_id: str
    destination: str
    due_at: datetime
    #: Its W3C ``traceparent`` header, if it has one (the forward span links to it).
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class MoveOutcome:
    """What one transactional move did: delivered, and sent to the error queue (with why)."""

    moved: list[Moved]
    dead_lettered: list[tuple[DelayedMessage, str]]


@runtime_checkable
class DelayedMessageStore(Protocol):
    """NServiceBus's ``IDelayedMessageStore`` (with infrastructure), batched and async."""

    async def setup_infrastructure(self, endpoint: str) -> None:
        """Create what ``endpoint`` needs; idempotent and safe from several processes at once."""

    async def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        """Bind to ``endpoint``; raise UnsupportedTransactionMode if the mode cannot be honoured."""

    async def store(self, message: DelayedMessage) -> None: ...
    async def store_many(self, messages: Sequence[DelayedMessage]) -> int: ...

    async def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        """Claim up to ``limit`` messages due at ``at``, oldest first; no other caller gets them
        until they are removed, their failure is counted, or the claim times out."""

    async def next_due(self) -> datetime | None: ...
    async def remove(self, message_id: str) -> bool: ...
    async def remove_many(self, message_ids: Sequence[str]) -> int: ...

    async def increment_failure_count(self, message_id: str) -> bool:
        """Count a failed forward and release the claim; False if the message is gone."""

    async def release(self, message_ids: Sequence[str]) -> int:
        """Give claims back untouched (graceful stop with a batch not yet forwarded)."""

    async def get(self, message_id: str) -> DelayedMessage | None: ...
    async def cancel(self, message_id: str) -> bool: ...
    async def cancel_group(self, group: str) -> int:
        """Cancel every stored message of ``group`` no dispatcher is forwarding; how many."""
        ...

    async def reschedule(self, message_id: str, due_at: datetime) -> bool: ...
    async def list(self, query: ListQuery) -> Page: ...
    async def counts(self, at: datetime) -> StoreCounts: ...
    def subscribe(self, callback: WakeupCallback) -> Callable[[], None]: ...
    async def close(self) -> None: ...


@runtime_checkable
class SyncDelayedMessageStore(Protocol):
    """The blocking twin, for producers that are not async (web apps, scripts, Spark executors)."""

    def setup_infrastructure(self, endpoint: str) -> None: ...
    def initialize(self, endpoint: str, mode: TransactionMode) -> None: ...
    def store(self, message: DelayedMessage) -> None: ...
    def store_many(self, messages: Sequence[DelayedMessage]) -> int: ...
    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]: ...
    def next_due(self) -> datetime | None: ...
    def remove(self, message_id: str) -> bool: ...
    def remove_many(self, message_ids: Sequence[str]) -> int: ...
    def increment_failure_count(self, message_id: str) -> bool: ...
    def release(self, message_ids: Sequence[str]) -> int: ...
    def get(self, message_id: str) -> DelayedMessage | None: ...
    def cancel(self, message_id: str) -> bool: ...
    def cancel_group(self, group: str) -> int: ...
    def reschedule(self, message_id: str, due_at: datetime) -> bool: ...
    def list(self, query: ListQuery) -> Page: ...
    def counts(self, at: datetime) -> StoreCounts: ...
    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """Where due messages go. ``send_batch`` answers per message: None, or the exception."""

    async def start(self) -> None: ...
    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]: ...
    async def declare(self, queue: str) -> None: ...
    async def close(self) -> None: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store that can move due messages into a transport inside one transaction (exactly-once)."""

    def shares_transaction_with(self, transport: object) -> bool: ...

    async def move_due(
        self,
        at: datetime,
        limit: int,
        transport: object,
        error_queue: str,
        error_headers: Callable[[DelayedMessage, str], Mapping[str, str]],
    ) -> MoveOutcome: ...


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

    async def receive(self, queue: str, max_messages: int, wait: float) -> list[ReceivedMessage]: ...
    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int: ...


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

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int: ...
    async def depth(self, queue: str) -> int: ...

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

    async def beat(self, info: DispatcherInfo) -> None: ...

    async def dispatchers(self) -> list[DispatcherInfo]:
        """The endpoint's dispatchers, newest first; ``DispatcherInfo.status`` tells which live."""
        ...


@runtime_checkable
class DueCounter(Protocol):
    """A store that counts what falls due by a time without counting everything else (the
    dashboard's "due in the next minute, hour, day" on a store of millions)."""

    async def count_due(self, at: datetime) -> int: ...


@runtime_checkable
class CarryCheck(Protocol):
    """A transport that knows, before sending, what it could never carry unchanged."""

    def cannot_carry(self, message: DelayedMessage) -> str | None:
        """Why this transport could never carry ``message`` byte for byte (too large for the
        server, a header it refuses or would change), or None. Limits the server tells are known
        once the transport is started."""


@runtime_checkable
class ServerClock(Protocol):
    """A store whose server keeps its own time (PostgreSQL, MariaDB, Redis)."""

    async def server_time(self) -> datetime | None:
        """The server's time now, in UTC (None: no server; the host's clock rules). A dispatcher
        compares due times and claims with it, never with its host's clock alone."""


@runtime_checkable
class ClaimPolicy(Protocol):
    """A store that says whether a dispatcher may claim its next batch while the last one is
    still being sent (a store without it is assumed to allow that)."""

    @property
    def parallel_claims(self) -> bool: ...


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

    def as_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "destination": self.destination,
            "due_at": self.due_at.isoformat(),
            "dispatched_at": self.dispatched_at.isoformat(),
            "lateness_ms": round((self.dispatched_at - self.due_at).total_seconds() * 1000, 3),
            "attempts": self.attempts,
            "outcome": self.outcome,
        }


@runtime_checkable
class DeliveryLog(Protocol):
    """Where the dispatcher records each delivery, if asked (``duetime run --delivery-log``)."""

    async def record(self, entries: Sequence[Delivery]) -> None: ...
    async def close(self) -> None: ...


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
