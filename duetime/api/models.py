"""What the HTTP API reads and writes, as JSON: the OpenAPI document's schemas come from here.

A message's body travels in JSON, as ``body`` (UTF-8 text) or ``body_base64`` (any bytes, exactly):
the one form a batch, a client generated in any language and ``curl`` all take. Answers always
carry ``body_base64``, so no byte is ever changed on the way out. Every value is checked again by
the library's own rules (:class:`duetime.message.DelayedMessage`), the ones the command line
and the Python client use: what the schema lets through is not yet accepted.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from starlette.convertors import Convertor, register_url_convertor

from duetime.client import build_message
from duetime.clock import from_micros, to_micros
from duetime.errors import InvalidMessage
from duetime.inputs.durations import parse_duration, parse_time
from duetime.interfaces import Clock, StoreCounts
from duetime.message import (
    MAX_DESTINATION_LENGTH,
    MAX_GROUP_LENGTH,
    MAX_ID_LENGTH,
    DelayedMessage,
    resolve_due_time,
)
from duetime.recurring.rules import Recurrence, recurrence_changed
from duetime.recurring.schedule import MAX_SCHEDULE_ID_LENGTH, Schedule, schedule_json

#: Messages one batch request may create.
MAX_BATCH = 1000
#: What every id, destination and group is (the library's ``check_text``): text with something
#: other than spaces in it, and no NUL.
TEXT = r"^[^\x00]*[^\x00\s][^\x00]*$"
#: A time: RFC 3339 with an offset, in the years every store keeps (1970-9998).
TIME = r"^(19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-"
#: A duration as the command line takes it: 90, 1.5s, 250ms, 10m, 1h30m, 2d (at most 8000 years).
DURATION = r"^([0-9]{1,9}(\.[0-9]{1,6})?|([0-9]{1,5}(\.[0-9]{1,3})?(ms|s|m|h|d|w)){1,3})$"
#: The longest delay in seconds: due times end in year 9998, so 7000 years hold until the year 2998.
LONGEST_SECONDS = 7000 * 365 * 86400

#: A page's cursor: the due time in microseconds since 1970 (up to year 9892), '~', and the id.
CURSOR = r"^([0-9]{1,17}|1[0-9]{17}|2[0-4][0-9]{16})~[^\x00]*[^\x00\s][^\x00]*$"

#: A schedule's id over HTTP (see :data:`duetime.api.schedules.ScheduleId`).
SCHEDULE_ID = r"^[^@/\x00-\x1f\x7f-\x9f]*[^@/\s\x00-\x1f\x7f-\x9f][^@/\x00-\x1f\x7f-\x9f]*$"

Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=TEXT)]
Destination = Annotated[str, Field(min_length=1, max_length=MAX_DESTINATION_LENGTH, pattern=TEXT)]
Group = Annotated[str, Field(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=TEXT)]
DueTime = Annotated[
    str,
    Field(
        max_length=64,
        pattern=TIME,
        json_schema_extra={"format": "date-time"},
        description="RFC 3339, with an offset.",
    ),
]
Delay = Annotated[
    Annotated[float, Field(ge=0, le=LONGEST_SECONDS)]
    | Annotated[str, Field(max_length=16, pattern=DURATION)],
    Field(description="Seconds, or a duration: 1.5s, 10m, 1h30m, 2d."),
]
Headers = Annotated[dict[str, str], Field(json_schema_extra={"propertyNames": {"minLength": 1}})]


def _absent_not_null(schema: dict[str, Any]) -> None:
    """An optional field is left out, never sent as null: a client generated from the document
    then has one way to say "not given", and a null is refused (:meth:`_Strict.no_nulls`)."""
    for prop in schema.get("properties", {}).values():
        kinds = prop.get("anyOf")
        if kinds and {"type": "null"} in kinds:
            rest = [k for k in kinds if k != {"type": "null"}]
            del prop["anyOf"]
            if len(rest) == 1:
                prop.update(rest[0])
            else:
                prop["anyOf"] = rest
            if prop.get("default", 0) is None:
                del prop["default"]


class _Strict(BaseModel):
    """Unknown fields are refused (a misspelt ``dely`` must not schedule a message for now), and
    so is a null: an optional field is left out."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_absent_not_null)

    @model_validator(mode="before")
    @classmethod
    def no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                if value is None:
                    raise ValueError(f"{name} is null; leave it out when it is not given")
        return data


def _one_of(
    *groups: tuple[str, ...], extra: dict[str, Any] | None = None
) -> Callable[[dict[str, Any]], None]:
    """The document says which fields go together: exactly one of ``groups`` is given."""

    def add(schema: dict[str, Any]) -> None:
        _absent_not_null(schema)
        schema["oneOf"] = [{"required": list(g)} for g in groups]
        schema.update(extra or {})

    return add


#: What a message's fields must be together: a due time or a delay, one body at most.
_MESSAGE_RULES = {"not": {"required": ["body", "body_base64"]}}
#: And what ``if_exists`` asks beside: an id for a replace or debounce, a delay for a debounce.
_IF_EXISTS_RULES = {
    "allOf": [
        {
            "if": {
                "required": ["if_exists"],
                "properties": {"if_exists": {"enum": ["replace", "debounce"]}},
            },
            "then": {"required": ["id"]},
        },
        {
            "if": {"required": ["if_exists"], "properties": {"if_exists": {"const": "debounce"}}},
            "then": {"required": ["delay"]},
        },
    ]
}


class NewBatchMessage(_Strict):
    """A delayed message to store: ``due_at`` or ``delay``, and the body as ``body`` (text) or
    ``body_base64`` (bytes), or none. (In a batch, which is stored all or none: no ``if_exists``.)"""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra=_one_of(("due_at",), ("delay",), extra=_MESSAGE_RULES)
    )

    id: Id | None = Field(
        None,
        description="Your own id: the same id and content again answers 200 with the stored message, "
        "other content 409 (while it is stored). Default: a new time-ordered UUID.",
    )
    destination: Destination = Field(description="The queue it is for.")
    due_at: DueTime | None = Field(None, description="When it is due (RFC 3339, with an offset).")
    delay: Delay | None = None
    body: str | None = Field(None, description="The body as UTF-8 text.")
    body_base64: str | None = Field(
        None,
        description="The body as base64 (any bytes).",
        pattern=r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
    )
    headers: Headers = Field(default_factory=dict)
    group: Group | None = Field(
        None, description="A key it shares with others, to list or cancel them together."
    )

    def message(self, clock: Clock, if_exists: str = "refuse") -> DelayedMessage:
        """The message, by the library's rules (each refusal is InvalidMessage, one line)."""
        return build_message(
            clock,
            self.destination,
            body_of(self.body, self.body_base64),
            due_at=time_of("due_at", self.due_at),
            delay=self.delay,
            headers=self.headers,
            message_id=self.id,
            group=self.group,
            if_exists=if_exists,
        )


class NewMessage(NewBatchMessage):
    """A delayed message to store: ``due_at`` or ``delay``, and the body as ``body`` (text) or
    ``body_base64`` (bytes), or none; ``if_exists`` says what to do when a message of its id waits."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra=_one_of(("due_at",), ("delay",), extra=_MESSAGE_RULES | _IF_EXISTS_RULES),
    )

    if_exists: Literal["refuse", "keep", "replace", "debounce"] = Field(
        "refuse",
        description="When a message of this id is waiting: refuse (the same content answers 200, "
        "other content 409), keep it (200, the stored one), replace it (200: body, headers, "
        "destination, group, due time), or debounce (a replace whose `delay` counts from now). "
        "A message being delivered is never replaced: 409. Replace and debounce need `id`, "
        "and debounce a `delay`.",
    )

    def message(self, clock: Clock, if_exists: str | None = None) -> DelayedMessage:
        return super().message(clock, if_exists or self.if_exists)


class TextConvertor(Convertor[str]):
    """A path parameter that is any text, '/' and line breaks included (Starlette's ``path``
    stops at a line break): an id is whatever its sender chose."""

    regex = "(?s:.+)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("text", TextConvertor())


#: Every time the API answers: an instant in UTC, written the one way (RFC 3339 ending in ``Z``),
#: whether a message's due time, a schedule's next tick or when a limit was set, and typed
#: ``date-time`` in the document, so that a client reads every time field alike.
Instant = Annotated[datetime, AfterValidator(lambda at: at.astimezone(UTC))]


def _header_time(text: object) -> datetime | None:
    """The instant a header's text names, by the library's one reader of times, or None when it
    names none: another system may have written anything there (the header itself is answered
    as it is, among the headers)."""
    try:
        return None if text is None else parse_time(str(text))
    except InvalidMessage:
        return None


#: A time kept in a header, read where it can be.
HeaderTime = Annotated[Instant | None, BeforeValidator(_header_time)]


def time_of(name: str, text: str | None) -> datetime | None:
    """A time the request gave, read by the library's one reader; its refusal names the field."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except InvalidMessage as error:
        raise InvalidMessage(f"{name}: {error}") from None


def cursor_of(after: tuple[datetime, str]) -> str:
    """The cursor of the next page: opaque to a client, which passes it back as ``?after=``."""
    return f"{to_micros(after[0])}~{after[1]}"


def read_cursor_of(text: str) -> tuple[datetime, str]:
    micros, _, message_id = text.partition("~")
    try:
        return from_micros(int(micros)), message_id
    except (ValueError, OverflowError):
        raise InvalidMessage(
            f"{text[:80]!r} is not a cursor; pass the next_cursor the previous page gave."
        ) from None


def body_of(text: str | None, encoded: str | None) -> bytes:
    if text is not None and encoded is not None:
        raise InvalidMessage("give the body as body (text) or as body_base64, not both.")
    if encoded is None:
        try:
            return (text or "").encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessage(
                "body holds a lone surrogate, which is not text; send bytes as body_base64."
            ) from None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMessage("body_base64 is not base64 (A-Z, a-z, 0-9, +, / and = padding).") from None


def due_of(due_at: str | None, delay: float | str | None, now: datetime) -> datetime:
    """A new due time from ``due_at`` or ``delay`` (exactly one), by the library's rule."""
    if isinstance(delay, str):
        delay_: timedelta | float | None = parse_duration(delay)
    else:
        delay_ = delay
    return resolve_due_time(due_at=time_of("due_at", due_at), delay=delay_, now=now)


class Message(BaseModel):
    """A stored message."""

    id: str
    destination: str
    due_at: Instant
    body_base64: str
    headers: dict[str, str]
    group: str | None
    failure_count: int

    @classmethod
    def of(cls, m: DelayedMessage) -> Message:
        return cls(
            id=m.message_id,
            destination=m.destination,
            due_at=m.due_at,
            body_base64=base64.b64encode(m.body).decode("ascii"),
            headers=dict(m.headers),
            group=m.group,
            failure_count=m.failure_count,
        )


class NewBatch(_Strict):
    messages: list[NewBatchMessage] = Field(min_length=1, max_length=MAX_BATCH)


class BatchItem(BaseModel):
    id: str
    status: Literal["created", "existing"] = Field(
        description="created: stored now; existing: stored before with the same content (nothing changed)."
    )


class BatchResult(BaseModel):
    created: int
    existing: int
    results: list[BatchItem]


class MessagePage(BaseModel):
    messages: list[Message]
    next_cursor: str | None = Field(description="Pass as ?after= for the next page; null on the last one.")


class Reschedule(_Strict):
    """A new due time: ``due_at`` or ``delay``."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_of(("due_at",), ("delay",)))

    due_at: DueTime | None = None
    delay: Delay | None = None


class Cancelled(BaseModel):
    """What one request cancelled: a request does a bounded amount, so none waits on a million."""

    cancelled: int = Field(description="How many were cancelled.")
    in_flight: int = Field(0, description="Left alone: being delivered at that moment.")
    more: bool = Field(False, description="More are left: send the same request again.")


class _When(_Strict):
    """When a schedule ticks, in the fields of ``duetime recurring add``'s options: one set of
    fields and one reading of them for a new schedule and a change."""

    cron: str | None = Field(
        None, max_length=200, description="'0 9 * * MON-FRI', or 6 fields with seconds first."
    )
    every: str | None = Field(None, max_length=64, description="An interval: 30s, 5m, 1h.")
    zone: str | None = Field(None, max_length=64, description="IANA time zone of the cron (default UTC).")
    start: DueTime | None = None
    end: DueTime | None = None
    count: int | None = Field(None, ge=1, le=2**31 - 1)
    skipped: Literal["run", "skip"] | None = None
    catch_up: Literal["none", "latest", "all"] | None = None
    catch_up_window: str | None = Field(None, max_length=64)
    jitter: str | None = Field(
        None,
        max_length=64,
        description="Each tick may go up to this after its time (30s, 5m): a storm spread.",
    )

    def when(self, base: Recurrence | None) -> Recurrence:
        """The recurrence these fields give, over ``base`` (None: a new one, which must say when)."""
        return recurrence_changed(
            base,
            cron=self.cron,
            every=self.every,
            zone=self.zone,
            start=time_of("start", self.start),
            end=time_of("end", self.end),
            count=self.count,
            skipped=self.skipped,
            catch_up=self.catch_up,
            catch_up_window=self.catch_up_window,
            jitter=self.jitter,
            flag="",
        )


class NewSchedule(_When):
    """A recurring message: ``cron`` or ``every``, and the rest as ``duetime recurring add`` has them."""

    id: Annotated[str, Field(min_length=1, max_length=MAX_SCHEDULE_ID_LENGTH, pattern=SCHEDULE_ID)]
    destination: Destination
    body: str | None = None
    body_base64: str | None = None
    headers: Headers = Field(default_factory=dict)
    paused: bool = False


class ScheduleChange(_When):
    """What to change; what is not given stays. Takes effect from the next tick."""

    destination: Destination | None = None
    body: str | None = None
    body_base64: str | None = None


class ScheduleView(BaseModel):
    """A recurring schedule as ``duetime recurring show`` prints it."""

    id: str
    destination: str
    when: str
    state: str
    set_aside: str | None
    next: Instant | None
    last_planned: Instant | None
    ticks_planned: int
    ticks_missed: int
    recurrence: dict[str, Any]
    headers: dict[str, str]
    body_base64: str

    @classmethod
    def of(cls, s: Schedule, now: datetime) -> ScheduleView:
        row = schedule_json(s, now)
        for printed in ("body", "body_hex"):  # the API gives body_base64 instead
            row.pop(printed, None)
        return cls(**row, body_base64=base64.b64encode(s.body).decode("ascii"))


class SchedulePage(BaseModel):
    schedules: list[ScheduleView]
    next_after: str | None = Field(description="Pass as ?after= for the next page; null on the last one.")


class NextTicks(BaseModel):
    ticks: list[Instant]


class Backfill(_Strict):
    start: DueTime
    end: DueTime


class Count(BaseModel):
    count: int


class FailedMessage(BaseModel):
    """A message in the error queue, and why it is there."""

    id: str
    destination: str | None
    error: str | None
    attempts: int | None
    failed_at: HeaderTime = Field(description="When it failed; null when its header names no time.")
    headers: dict[str, str]
    size: int
    kept_in_store: bool


class FailedPage(BaseModel):
    messages: list[FailedMessage]
    found: int = Field(description="How many of this endpoint's failures were looked at.")
    depth: int = Field(description="How many messages the error queue holds (every endpoint's).")


def _pick_schema(schema: dict[str, Any]) -> None:
    """``ids``, or ``all: true`` (and only then a ``destination``): exactly one."""
    _absent_not_null(schema)
    schema["oneOf"] = [
        {"required": ["ids"], "properties": {"all": {"const": False}}, "not": {"required": ["destination"]}},
        {"required": ["all"], "properties": {"all": {"const": True}, "ids": {"maxItems": 0}}},
    ]


class Pick(_Strict):
    """Messages of the error queue: ``ids``, or ``all: true`` (for one ``destination``, if given)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_pick_schema)

    ids: list[Id] = Field(default_factory=list, min_length=1, max_length=10_000)
    all: bool = False
    destination: Destination | None = None


class Retry(Pick):
    to: Destination | None = Field(None, description="Send them to this queue instead.")
    delay: Delay = 0
    spread: Delay = Field(0, description="Spread them over this window after the delay, each its own moment.")


class Retried(BaseModel):
    sent: int
    already: int = Field(description="Stored already (a retry that ran before): nothing changed.")
    nowhere: list[str] = Field(
        description="Ids that do not say where they were going: left in the error queue."
    )


class Discarded(BaseModel):
    discarded: int


class Stats(BaseModel):
    total: int
    due: int
    claimed: int
    failing: int
    next_due: Instant | None
    by_destination: dict[str, int]
    more_destinations: int
    more_messages: int
    estimated: bool
    held: int = Field(0, description="Due messages waiting for a flow-control limit's turn or a resume.")


class Health(BaseModel):
    status: Literal["ok"]


def counts_view(counts: StoreCounts) -> Stats:
    return Stats(
        total=counts.total,
        due=counts.due,
        claimed=counts.claimed,
        failing=counts.failing,
        next_due=counts.next_due,
        by_destination=dict(counts.by_destination),
        more_destinations=counts.more_destinations,
        more_messages=counts.more_messages,
        estimated=counts.estimated,
        held=counts.held,
    )


def same_content(stored: DelayedMessage, asked: DelayedMessage, absolute: bool) -> bool:
    """Whether a create of an id already stored asks for what is stored: destination, body,
    headers, group, and the due time when it was given as a time (a delay counts from the first
    request, so a retry of it later is the same request)."""
    return (
        stored.destination == asked.destination
        and stored.body == asked.body
        and dict(stored.headers) == dict(asked.headers)
        and stored.group == asked.group
        and (not absolute or stored.due_at == asked.due_at)
    )
