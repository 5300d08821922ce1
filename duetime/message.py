"""The delayed message: what is stored, and the validation that guards every way in."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from duetime import nservicebus_wire as nservicebus
from duetime.clock import SYSTEM
from duetime.errors import InvalidMessage
from duetime.inputs.durations import parse_duration

MAX_ID_LENGTH = 250
MAX_DESTINATION_LENGTH = 200
MAX_GROUP_LENGTH = 200
#: What one message may carry, checked where messages come in (a store's ``store`` calls, the
#: front door, bulk rows), never on what a store already holds: so nothing that gets in can make a
#: dispatcher, ``show`` or the dashboard hold gigabytes. A larger payload belongs in object
#: storage, with its address in the message. 16 MiB is also RabbitMQ's own default limit.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: The headers' size as stores keep them (compact JSON, UTF-8): far above what NServiceBus,
#: Celery or Dramatiq put on a message, far below what makes a page slow.
MAX_HEADERS_BYTES = 256 * 1024
#: The most failures a message can count: the stores keep the count in a 32-bit column.
MAX_FAILURE_COUNT = 2**31 - 1
#: Due times must fall in this window; it keeps every store's integer column and every
#: broker's TTL arithmetic far from overflow.
EARLIEST_DUE = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_DUE = datetime(9999, 1, 1, tzinfo=UTC)

#: A delay: seconds, a timedelta, or a duration as the command line takes it ("10m", "1h30m").
Delay = timedelta | float | str


def new_message_id() -> str:
    """A time-ordered UUID (v7 layout): ids sort by creation, which keeps indexes compact."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80 | rand
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


def kind(value: object) -> str:
    """What a wrong value is, in words a user of the CLI, a JSON file or Python all understand."""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, bool):
        return f"true/false ({shown})"
    if isinstance(value, int | float):
        return f"a number ({shown})"
    if isinstance(value, bytes | bytearray):
        return f"bytes ({shown})"
    if isinstance(value, Mapping):
        return "an object (a mapping)"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} ({shown})"


def _check_text(name: str, value: object, limit: int) -> str:
    if value is None:
        raise InvalidMessage(f"{name} is missing; give it as text.")
    if not isinstance(value, str):
        raise InvalidMessage(f"{name} must be text, got {kind(value)}.")
    if not value.strip():
        raise InvalidMessage(f"{name} must not be empty or blank.")
    if len(value) > limit:
        raise InvalidMessage(
            f"{name} is {len(value)} characters long; the limit is {limit}. Use a shorter {name}."
        )
    if "\x00" in value:
        raise InvalidMessage(f"{name} must not contain NUL characters.")
    check_encodable(name, value)
    return value


def check_encodable(name: str, value: str) -> str:
    """Text every store and broker can carry: UTF-8 without lone surrogates (which is what a
    command line or a file with invalid UTF-8 turns into)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidMessage(
            f"{name} holds something that is not valid text (character {error.start + 1} is an "
            "invalid UTF-8 byte or a lone surrogate); pass proper UTF-8 text."
        ) from None
    return value


#: The field check DelayedMessage uses, for callers that validate rows without building one.
check_text = _check_text


def check_due_time(value: object, name: str = "due_at") -> datetime:
    """Return ``value`` in UTC, or raise :class:`InvalidMessage` saying how to fix it."""
    if not isinstance(value, datetime):
        raise InvalidMessage(f"{name} must be a datetime, got {kind(value)}.")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise InvalidMessage(
            f"{name} is a naive datetime ({value.isoformat()}); duetime cannot guess its time zone. "
            "Pass an aware one, e.g. datetime.now(timezone.utc) + timedelta(minutes=5)."
        )
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):  # e.g. 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise InvalidMessage(
            f"{name} {value.isoformat()} is outside the supported years 1970-9998."
        ) from None
    if not EARLIEST_DUE <= utc < LATEST_DUE:
        raise InvalidMessage(f"{name} {utc.isoformat()} is outside the supported years 1970-9998.")
    return utc


def check_headers(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidMessage(f"headers must be names with text values, got {kind(value)}.")
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidMessage(f"header names must be text, got {kind(key)}.")
        if not isinstance(item, str):
            raise InvalidMessage(
                f"header {key[:50]!r} must be text, got {kind(item)}; write it as text (str() in Python)."
            )
        if not key:
            raise InvalidMessage("header names must not be empty.")
        check_encodable(f"header {key[:50]!r}", key + item)
    return MappingProxyType(dict(value))


def dump_headers(headers: Mapping[str, str]) -> str:
    """Headers as every store keeps them: a compact JSON object of text to text."""
    return json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)


def body_fields(body: bytes) -> dict[str, str]:
    """A body as ``duetime show --json`` and ``recurring show`` print it, every byte kept:
    ``{"body": text}`` when it is UTF-8, else ``{"body_hex": ...}`` (a schedule's body was printed
    with Python's escapes, which no reader can undo). ``queues receive`` writes lines for other
    programs to read, with an ``encoding`` field of their own."""
    try:
        return {"body": body.decode()}
    except UnicodeDecodeError:
        return {"body_hex": body.hex()}


def check_body_size(size: int) -> None:
    if size > MAX_BODY_BYTES:
        raise InvalidMessage(
            f"the body is {size:,} bytes; the limit is {MAX_BODY_BYTES:,} (16 MiB). Keep a large payload "
            "elsewhere (object storage, a database) and send its address."
        )


def check_headers_size(size: int) -> None:
    if size > MAX_HEADERS_BYTES:
        raise InvalidMessage(
            f"the headers are {size:,} bytes (as JSON); the limit is {MAX_HEADERS_BYTES:,} (256 KiB). "
            "Send fewer or shorter headers; put data in the body."
        )


def check_size(message: DelayedMessage) -> DelayedMessage:
    """``message`` if it fits :data:`MAX_BODY_BYTES` and :data:`MAX_HEADERS_BYTES`; InvalidMessage
    saying which it exceeds otherwise. The headers are encoded only when they might be near the
    limit (a character takes at most six bytes in JSON), so the common message costs a sum."""
    check_body_size(len(message.body))
    headers = message.headers
    if 6 * sum(len(k) + len(v) + 1 for k, v in headers.items()) + 2 > MAX_HEADERS_BYTES:
        check_headers_size(len(dump_headers(headers).encode()))
    return message


#: Headers only a dispatcher writes, on the copy of a failed message it puts on the error queue
#: (why, when, which endpoint's): a stored message carrying them would, once due, land on an
#: error queue passing for another endpoint's failure (see :mod:`duetime.error_headers`).
DISPATCHER_ONLY_PREFIX = "duetime-error-"


def check_storable(message: DelayedMessage) -> DelayedMessage:
    """``message`` if a store may keep it: within the sizes (:func:`check_size`), and with none
    of the headers only dispatchers write."""
    check_size(message)
    for name in message.headers:
        if name.startswith(DISPATCHER_ONLY_PREFIX):
            raise InvalidMessage(
                f"header {name!r} is written by dispatchers only (it says why a message failed); "
                f"remove the {DISPATCHER_ONLY_PREFIX}* headers (`duetime errors retry` sends a failed "
                "message back)."
            )
    return message


def refused_destination(destination: str, error_queue: str) -> str | None:
    """Why no message may be sent to ``destination``, or None: the error queue (a sender would
    plant entries there that look like a dispatcher's, and consumers of a destination that is also
    the error queue would take failures for orders) or an endpoint's timeouts queue (a message
    would go round through another endpoint's timeouts, or this one's, for ever). Every writer
    that knows the error queue asks this: the front door, `schedule`, `load`, `recurring`."""
    if destination == error_queue:
        return f"its destination {destination!r} is the error queue, which only dispatchers write to"
    if is_timeouts_queue(destination):
        return f"its destination {destination!r} is an endpoint's timeouts queue, not a place to deliver to"
    return None


def is_timeouts_queue(name: str) -> bool:
    """Whether ``name`` is an endpoint's timeouts queue (``Sales.Timeouts``, or the old
    ``sales.timeouts``): what arrives there is stored again, by that endpoint's front door."""
    return name.lower().endswith(".timeouts")


@dataclass(frozen=True, slots=True)
class DelayedMessage:
    """A message that must reach ``destination`` at ``due_at`` and not before.

    ``due_at`` is always aware and in UTC; ``failure_count`` counts failed forwarding attempts.
    ``group`` is an optional key several messages share (a saga's id, an order number), stored
    and indexed, so they can be listed and cancelled together.
    """

    message_id: str
    destination: str
    due_at: datetime
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    failure_count: int = 0
    group: str | None = None

    def __post_init__(self) -> None:
        _check_text("message_id", self.message_id, MAX_ID_LENGTH)
        _check_text("destination", self.destination, MAX_DESTINATION_LENGTH)
        object.__setattr__(self, "due_at", check_due_time(self.due_at))
        if isinstance(self.body, bytearray | memoryview):
            object.__setattr__(self, "body", bytes(self.body))
        if not isinstance(self.body, bytes):
            raise InvalidMessage(
                f"body must be bytes, got {type(self.body).__name__}; encode text with .encode()."
            )
        object.__setattr__(self, "headers", check_headers(self.headers))
        if not isinstance(self.failure_count, int) or not 0 <= self.failure_count <= MAX_FAILURE_COUNT:
            raise InvalidMessage(f"failure_count must be a whole number from 0 to {MAX_FAILURE_COUNT:,}.")
        if self.group is not None:
            _check_text("group", self.group, MAX_GROUP_LENGTH)

    @classmethod
    def create(
        cls,
        destination: str,
        body: bytes = b"",
        *,
        due_at: datetime | None = None,
        delay: Delay | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        now: datetime | None = None,
        group: str | None = None,
    ) -> DelayedMessage:
        """Build a message due at ``due_at`` or after ``delay`` (seconds or a timedelta)."""
        due = resolve_due_time(due_at=due_at, delay=delay, now=now)
        return cls(
            message_id=new_message_id() if message_id is None else message_id,
            destination=destination,
            due_at=due,
            body=body,
            headers=headers or {},
            group=group,
        )

    @classmethod
    def from_store(
        cls,
        message_id: str,
        destination: str,
        due_at: datetime,
        body: bytes,
        headers: Mapping[str, str],
        failure_count: int,
        group: str | None = None,
    ) -> DelayedMessage:
        """Rebuild a message a store validated when it was stored, without checking it again
        (the dispatcher reads every message back once: this keeps that read cheap)."""
        message = object.__new__(cls)
        for name, value in (
            ("message_id", message_id),
            ("destination", destination),
            ("due_at", due_at),
            ("body", body),
            ("headers", MappingProxyType(dict(headers))),
            ("failure_count", failure_count),
            ("group", group),
        ):
            object.__setattr__(message, name, value)
        return message

    def with_changes(self, **changes: object) -> DelayedMessage:
        return replace(self, **changes)  # type: ignore[arg-type]


def resolve_due_time(*, due_at: datetime | None, delay: Delay | None, now: datetime | None) -> datetime:
    """Exactly one of ``due_at`` and ``delay`` must be given; a delay may not be negative. A delay
    is seconds, a timedelta, or text as the command line takes it (``"10m"``)."""
    if (due_at is None) == (delay is None):
        raise InvalidMessage(
            "Give exactly one of due_at (an aware datetime) or delay (seconds, a timedelta or '10m')."
        )
    if due_at is not None:
        return check_due_time(due_at)
    if isinstance(delay, str):
        delay = parse_duration(delay)  # "10m", "1h30m", "90s", as the command line takes them
    if isinstance(delay, bool) or not isinstance(delay, timedelta | int | float):
        raise InvalidMessage(
            f"delay must be seconds, a timedelta or a duration such as '10m', got {type(delay).__name__}."
        )
    if not isinstance(delay, timedelta) and not math.isfinite(delay):
        raise InvalidMessage(f"delay must be a finite number of seconds, got {delay}.")
    base = SYSTEM.now() if now is None else check_due_time(now, "now")
    try:
        span = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        if span < timedelta(0):
            raise InvalidMessage(
                f"delay must not be negative, got {span.total_seconds():g} s; a message cannot be due "
                "in the past."
            )
        return check_due_time(base + span, "now + delay")
    except OverflowError:
        raise InvalidMessage(f"delay {delay} is too long; due times end in year 9998.") from None


#: Header every transport adds on delivery: the due time, so receivers can measure lateness.
DUE_AT_HEADER = "duetime-due-at"


def outgoing_headers_json(stored_json: str, due_at: datetime, message_id: str) -> str:
    """A store's compact headers JSON plus ``duetime-due-at``, spliced in without parsing.

    Stores write headers as a compact JSON object of str -> str; a duplicate key is fine, since
    JSON readers keep the last, which is the one added here (as :func:`outgoing_headers` does).
    An NServiceBus timeout gets what the timeout manager adds at dispatch, so it is parsed.
    """
    if f'"{nservicebus.EXPIRE}"' in stored_json:
        headers = json.loads(stored_json)
        as_sent = headers.pop(nservicebus.DUE_ON_ARRIVAL, None) is not None
        if as_sent or nservicebus.is_timeout(headers):
            if not as_sent:
                headers = nservicebus.dispatch_headers(headers, message_id, SYSTEM.now())
            headers[DUE_AT_HEADER] = due_at.isoformat()
            return json.dumps(headers, separators=(",", ":"), ensure_ascii=False)
    text = stored_json.strip()
    field = f'"{DUE_AT_HEADER}":"{due_at.isoformat()}"}}'
    return "{" + field if text == "{}" else text[:-1] + "," + field


def traceparent_of(stored_json: str) -> str | None:
    """The W3C ``traceparent`` in a store's headers JSON (parsed only when it is there)."""
    if '"traceparent"' not in stored_json:
        return None
    value = json.loads(stored_json).get("traceparent")
    return value if isinstance(value, str) else None


def sending_key(message: DelayedMessage) -> str:
    """What a broker that drops repeats (JetStream's ``Nats-Msg-Id``) is given to know them by:
    the id and a digest of the due time, body and headers. A re-send of one stored message (a
    crash between sending and removing it) has the same key and is dropped there; a new message
    that reuses an id (scheduled again after delivery, a recurring tick sent by ``backfill``)
    has another and is delivered."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(message.due_at.isoformat().encode())
    digest.update(b"\x00")
    digest.update(
        json.dumps(dict(message.headers), sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    )
    digest.update(b"\x00")
    digest.update(message.body)
    return f"{message.message_id}~{digest.hexdigest()}"


def outgoing_headers(message: DelayedMessage, *, dispatching: bool = True) -> dict[str, str]:
    """The headers a destination receives: the message's own plus its due time, and for an
    NServiceBus timeout that is ``dispatching`` (sent because it is due, as the timeout manager
    sends stored timeouts) what the timeout manager adds then. A timeout handed on before it is
    due (to RabbitMQ's native delays, as the migration tool does) keeps its headers as stored."""
    headers = dict(message.headers)
    as_sent = headers.pop(nservicebus.DUE_ON_ARRIVAL, None) is not None
    if dispatching and not as_sent and nservicebus.is_timeout(headers):
        headers = nservicebus.dispatch_headers(headers, message.message_id, SYSTEM.now())
    headers[DUE_AT_HEADER] = message.due_at.isoformat()
    return headers
