"""Reading a message back from a queue that other programs may write to as well.

A queue table or stream is shared ground: another writer can put in headers that are not JSON,
header values that are numbers, a text body or no id. None of that may make ``receive`` raise
(the batch would stick on its queue for good). Each field is read as well as it can be, and what
could not be read is named in :attr:`ReceivedMessage.problem`, so the front door sends the
message to the error queue with that reason and a consumer can decide for itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection
from typing import Any

from duetime.encryption import KEY_HEADER, Unreadable, describe, sealer_from_environment
from duetime.error_headers import ORIGINAL_DESTINATION
from duetime.interfaces import ReceivedMessage

#: How long a queue table's receive may keep a consumer's handled messages (its ``done``) before
#: acknowledging them alone, when no look that could carry them in its own statement comes sooner.
ACKNOWLEDGE_WITHIN = 0.2


def as_text(value: Any) -> str:
    """Text for a header value or id of any type: bytes as UTF-8, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    return json.dumps(value, ensure_ascii=False, default=str)


def read_headers(raw: Any) -> tuple[dict[str, str], str | None]:
    """Headers from JSON text (or an already decoded object); a problem instead of an exception."""
    value = raw
    if isinstance(raw, bytes | bytearray | memoryview):
        raw = bytes(raw).decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {"duetime-unreadable-headers": raw[:4000]}, "the headers are not JSON"
    if value is None:
        return {}, None
    if not isinstance(value, dict):
        return {"duetime-unreadable-headers": as_text(value)[:4000]}, "the headers are not a JSON object"
    headers: dict[str, str] = {}
    problem = None
    for key, item in value.items():
        name, text = _valid_text(str(key)), _valid_text(as_text(item))
        headers[name] = text
        if problem is None and not isinstance(item, str):
            problem = f"header {name[:50]!r} is {type(item).__name__}, not text"
        elif problem is None and (name, text) != (key, item):
            problem = f"header {name[:50]!r} is not valid UTF-8 text"
    return headers, problem


def read_body(raw: Any) -> bytes:
    """A body as bytes; text (a writer that stored a string) is taken as UTF-8."""
    if raw is None:
        return b""
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    return as_text(raw).encode("utf-8", errors="surrogateescape")


def received(
    queue: str, message_id: Any, headers: Any, body: Any, receipt: str, delivery_count: int
) -> ReceivedMessage:
    """A :class:`ReceivedMessage` from raw stored fields, never raising on what another wrote."""
    decoded, problem = read_headers(headers)
    text_id = "" if message_id is None else as_text(message_id)
    if problem is None and not isinstance(message_id, str | bytes):
        problem = "the message has no id" if message_id is None else "the message id is not text"
    data = read_body(body)
    if KEY_HEADER in decoded and problem is None:
        data, decoded, problem = _opened(queue, text_id, data, decoded)
    return ReceivedMessage(queue, text_id, decoded, data, receipt, int(delivery_count or 0), problem)


def _opened(
    queue: str, message_id: str, body: bytes, headers: dict[str, str]
) -> tuple[bytes, dict[str, str], str | None]:
    """A message a store moved into its own queue still sealed (the exactly-once move is one
    statement of the database's: it never sees the keys), opened for the consumer; still sealed,
    with the reason as its problem, when it cannot be."""
    sealer = sealer_from_environment()
    if sealer is None:
        return body, headers, describe(headers)
    try:
        # a failed copy on the error queue was sealed for the destination it failed to reach
        plain, opened = sealer.open_parts(
            message_id, headers.get(ORIGINAL_DESTINATION) or queue, body, headers
        )
    except Unreadable as error:
        return body, headers, f"cannot be opened: {error}"
    return plain, opened, None


def _valid_text(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry (lone surrogates) replaced by ``?``."""
    return text.encode("utf-8", "replace").decode()


async def first(items: AsyncIterator[ReceivedMessage], limit: int) -> list[ReceivedMessage]:
    """The first ``limit`` of a queue read front to back (a peek on a broker read by scanning)."""
    seen: list[ReceivedMessage] = []
    async for item in items:
        if len(seen) >= limit:
            break
        seen.append(item)
    return seen


async def those(items: AsyncIterator[ReceivedMessage], message_ids: Collection[str]) -> list[ReceivedMessage]:
    """The messages with these ids, reading only as far as needed to find them all."""
    wanted = set(message_ids)
    found: list[ReceivedMessage] = []
    async for item in items:
        if item.message_id in wanted:
            found.append(item)
            if len(found) == len(wanted):
                break
    return found
