"""The one row shape every bulk job moves, and the check that says what is wrong with a row."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, NamedTuple

from duetime.clock import from_micros, to_micros
from duetime.errors import InvalidMessage
from duetime.message import (
    EARLIEST_DUE,
    LATEST_DUE,
    MAX_DESTINATION_LENGTH,
    MAX_ID_LENGTH,
    DelayedMessage,
    check_text,
)


class Record(NamedTuple):
    """A delayed message on its way between stores, as raw as the source gave it.

    ``headers`` is the JSON text exactly as stored (so export and import are byte-for-byte);
    ``extra`` keeps the source's own columns (a saga id, a persistence version) as JSON, so a row
    put back by ``abort`` is the row that was taken.
    """

    endpoint: str
    message_id: str
    destination: str | None
    due_us: int | None
    headers: str | None
    body: bytes
    failure_count: int
    extra: str | None = None


#: Column names of a record, in order: the staging tables, Parquet and JSON Lines use them.
FIELDS = Record._fields


_EARLIEST_US = to_micros(EARLIEST_DUE)
_LATEST_US = to_micros(LATEST_DUE)


def problem(record: Record) -> str | None:
    """Why ``record`` cannot become a duetime message, or None if it can.

    The same rules as :class:`DelayedMessage`, checked without building one: a migration checks
    millions of rows, and this is its hottest loop.
    """
    try:
        check_text("message_id", record.message_id, MAX_ID_LENGTH)
        check_text("destination", record.destination, MAX_DESTINATION_LENGTH)
        if record.due_us is None:
            raise InvalidMessage("the due time is missing.")
        if not _EARLIEST_US <= record.due_us < _LATEST_US:
            raise InvalidMessage(f"due_at {_moment(record.due_us)} is outside the supported years 1970-9998.")
        if "" in parse_headers(record.headers):
            raise InvalidMessage("header names must not be empty.")
        if record.failure_count < 0:
            raise InvalidMessage("failure_count must be a non-negative int.")
    except InvalidMessage as error:
        return str(error)
    return None


def _moment(micros: int) -> str:
    try:
        return from_micros(micros).isoformat()
    except (OverflowError, ValueError):
        return f"{micros} µs since 1970"


def to_message(record: Record) -> DelayedMessage:
    if record.due_us is None:
        raise InvalidMessage("the due time is missing.")
    try:
        due = from_micros(record.due_us)
    except (OverflowError, ValueError):
        raise InvalidMessage(f"due time {record.due_us} µs since 1970 is out of range.") from None
    headers = parse_headers(record.headers)
    destination: Any = record.destination  # None is refused by DelayedMessage with a clear reason
    return DelayedMessage(record.message_id, destination, due, record.body, headers, record.failure_count)


def parse_headers(text: str | None) -> dict[str, str]:
    if text is None or text == "":
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise InvalidMessage(f"headers are not readable JSON ({error}).") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidMessage("headers must be a JSON object of strings to strings.")
    return value


def due_us_of(value: Any) -> int | None:
    """Micros since 1970 from a datetime (naive means UTC), an ISO string or a number."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_micros(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, str):
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if moment.tzinfo is None:
            raise InvalidMessage(
                f"due time {value!r} has no UTC offset; write e.g. 2030-01-01T09:00:00+00:00."
            )
        return to_micros(moment)
    return int(value)


def dump_headers(headers: dict[str, str]) -> str:
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False)
