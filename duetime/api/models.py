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
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from duetime.errors import InvalidMessage, InvalidSchedule
from duetime.inputs.durations import parse_duration, parse_time
from duetime.message import (
    MAX_DESTINATION_LENGTH,
    MAX_GROUP_LENGTH,
    MAX_ID_LENGTH,
    DelayedMessage,
    resolve_due_time,
)
from duetime.recurring.schedule import Schedule, schedule_json

#: Messages one batch request may create.
MAX_BATCH = 1000
#: Due times as RFC 3339 text with an offset (2026-12-01T09:00:00Z).
DueTime = Annotated[str, Field(json_schema_extra={"format": "date-time"}, max_length=64)]
#: A delay: seconds, or a duration as the command line takes it (90, "1.5s", "10m", "1h30m").
Delay = Annotated[float | str, Field(description="Seconds, or a duration: 1.5s, 10m, 1h30m, 2d.")]


class _Strict(BaseModel):
    """Unknown fields are refused: a misspelt ``dely`` must not schedule a message for now."""

    model_config = ConfigDict(extra="forbid")


class NewMessage(_Strict):
    """A delayed message to store. Give ``due_at`` or ``delay``, and ``body`` or ``body_base64``."""

    id: str | None = Field(
        None,
        max_length=MAX_ID_LENGTH,
        description="Your own id: the same id and content again answers 200 with the stored message, "
        "other content 409 (while it is stored). Default: a new time-ordered UUID.",
    )
    destination: str = Field(max_length=MAX_DESTINATION_LENGTH, description="The queue it is for.")
    due_at: DueTime | None = Field(None, description="When it is due (RFC 3339, with an offset).")
    delay: Delay | None = None
    body: str | None = Field(None, description="The body as UTF-8 text.")
    body_base64: str | None = Field(None, description="The body as base64 (any bytes).")
    headers: dict[str, str] = Field(default_factory=dict)
    group: str | None = Field(
        None,
        max_length=MAX_GROUP_LENGTH,
        description="A key it shares with others, to list or cancel them together.",
    )

    def message(self, now: datetime) -> DelayedMessage:
        """The message, by the library's rules (each refusal is InvalidMessage, one line)."""
        return DelayedMessage.create(
            self.destination,
            body_of(self.body, self.body_base64),
            due_at=None if self.due_at is None else parse_time(self.due_at),
            delay=self.delay,
            headers=self.headers,
            message_id=self.id,
            now=now,
            group=self.group,
        )


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
    return resolve_due_time(due_at=None if due_at is None else parse_time(due_at), delay=delay_, now=now)


class Message(BaseModel):
    """A stored message."""

    id: str
    destination: str
    due_at: datetime
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
    messages: list[NewMessage] = Field(min_length=1, max_length=MAX_BATCH)


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

    due_at: DueTime | None = None
    delay: Delay | None = None


class Cancelled(BaseModel):
    cancelled: int = Field(description="How many were cancelled.")
    in_flight: int = Field(0, description="Left alone: being delivered at that moment.")


class NewSchedule(_Strict):
    """A recurring message: ``cron`` or ``every``, and the rest as ``duetime recurring add`` has them."""

    id: str = Field(max_length=MAX_ID_LENGTH)
    destination: str = Field(max_length=MAX_DESTINATION_LENGTH)
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
    body: str | None = None
    body_base64: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    paused: bool = False


class ScheduleChange(_Strict):
    """What to change; what is not given stays. Takes effect from the next tick."""

    destination: str | None = Field(None, max_length=MAX_DESTINATION_LENGTH)
    cron: str | None = Field(None, max_length=200)
    every: str | None = Field(None, max_length=64)
    zone: str | None = Field(None, max_length=64)
    start: DueTime | None = None
    end: DueTime | None = None
    count: int | None = Field(None, ge=1, le=2**31 - 1)
    skipped: Literal["run", "skip"] | None = None
    catch_up: Literal["none", "latest", "all"] | None = None
    catch_up_window: str | None = Field(None, max_length=64)
    body: str | None = None
    body_base64: str | None = None


class ScheduleView(BaseModel):
    """A recurring schedule as ``duetime recurring show`` prints it."""

    id: str
    destination: str
    when: str
    state: str
    set_aside: str | None
    next: str | None
    last_planned: str | None
    ticks_planned: int
    ticks_missed: int
    recurrence: dict[str, Any]
    headers: dict[str, str]
    body_base64: str

    @classmethod
    def of(cls, s: Schedule, now: datetime) -> ScheduleView:
        row = schedule_json(s, now)
        row.pop("body")
        return cls(**row, body_base64=base64.b64encode(s.body).decode("ascii"))


class SchedulePage(BaseModel):
    schedules: list[ScheduleView]
    next_after: str | None = Field(description="Pass as ?after= for the next page; null on the last one.")


class NextTicks(BaseModel):
    ticks: list[datetime]


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
    failed_at: str | None
    headers: dict[str, str]
    size: int
    kept_in_store: bool


class FailedPage(BaseModel):
    messages: list[FailedMessage]
    found: int = Field(description="How many of this endpoint's failures were looked at.")
    depth: int = Field(description="How many messages the error queue holds (every endpoint's).")


class Pick(_Strict):
    """Messages of the error queue: by id, or ``all`` (for one destination, if given)."""

    ids: list[Annotated[str, Field(max_length=MAX_ID_LENGTH)]] = Field(
        default_factory=list, max_length=10_000
    )
    all: bool = False
    destination: str | None = Field(None, max_length=MAX_DESTINATION_LENGTH)


class Retry(Pick):
    to: str | None = Field(
        None, max_length=MAX_DESTINATION_LENGTH, description="Send them to this queue instead."
    )
    delay: Delay = 0


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
    next_due: datetime | None
    by_destination: dict[str, int]
    more_destinations: int
    more_messages: int
    estimated: bool


class Health(BaseModel):
    status: Literal["ok"]


def counts_view(counts: Any) -> Stats:
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


def check_recurring_fields(fields: Mapping[str, object]) -> None:
    if fields.get("cron") is not None and fields.get("every") is not None:
        raise InvalidSchedule("give cron or every, not both.")
