"""The one row shape every bulk job moves, and the check that says what is wrong with a row."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, NamedTuple

from duetime.clock import from_micros, to_micros
from duetime.errors import InvalidMessage
from duetime.message import DelayedMessage


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


def problem(record: Record) -> str | None:
    """Why ``record`` cannot become a duetime message, or None if it can."""
    try:
        to_message(record)
    except InvalidMessage as error:
        return str(error)
    return None


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
