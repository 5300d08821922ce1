"""The one row shape every bulk job moves, and the check that says what is wrong with a row."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, NamedTuple
from xml.etree import ElementTree

from duetime.clock import from_micros, to_micros
from duetime.errors import InvalidMessage
from duetime.inputs.durations import parse_time
from duetime.inputs.jsontext import read_json
from duetime.message import (
    MAX_DESTINATION_LENGTH,
    MAX_FAILURE_COUNT,
    MAX_ID_LENGTH,
    DelayedMessage,
    check_body_size,
    check_headers_size,
    check_text,
    dump_headers,
)
from duetime.nservicebus_wire import EMPTY_GUID, MSMQ_PROPERTIES
from duetime.plainly_fine import EARLIEST_US, GROUP_OPEN, LATEST_US


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


class Destination(NamedTuple):
    """Where an endpoint's selected messages go, and the latest due time among them."""

    endpoint: str
    destination: str | None
    latest_us: int | None


#: Column names of a record, in order: the staging tables, Parquet and JSON Lines use them.
FIELDS = Record._fields


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
        if not EARLIEST_US <= record.due_us < LATEST_US:
            raise InvalidMessage(f"due_at {_moment(record.due_us)} is outside the supported years 1970-9998.")
        if "" in parse_headers(record.headers):
            raise InvalidMessage("header names must not be empty.")
        check_body_size(len(record.body))
        check_headers_size(len(record.headers.encode()) if record.headers else 0)
        if not 0 <= record.failure_count <= MAX_FAILURE_COUNT:
            raise InvalidMessage(f"failure_count must be a whole number from 0 to {MAX_FAILURE_COUNT:,}.")
    except InvalidMessage as error:
        return str(error)
    return None


def _moment(micros: int) -> str:
    try:
        return from_micros(micros).isoformat()
    except (OverflowError, ValueError):
        return f"{micros} µs since 1970"


def group_of(record: Record) -> str | None:
    """The group a record's message joins: duetime's own (``group``) or an NServiceBus saga's
    (``SagaId``; the empty GUID NServiceBus stores for timeouts outside a saga is none)."""
    if not record.extra or ("group" not in record.extra and "SagaId" not in record.extra):
        return None
    if (
        record.extra.startswith(GROUP_OPEN)
        and record.extra.endswith('"}')
        and record.extra.count('"') == 4
        and "\\" not in record.extra
    ):  # what group_extra writes, with nothing escaped: read without a JSON parser (bulk jobs
        # ask this of every row, twice)
        group: object = record.extra[len(GROUP_OPEN) : -2]
    else:
        extra = json.loads(record.extra)
        group = extra.get("group") or extra.get("SagaId")
    return group if isinstance(group, str) and group and group != EMPTY_GUID else None


def group_extra(group: str) -> str:
    """A record's ``extra`` for duetime's own group (the JSON ``{"group": …}``)."""
    return '{"group": ' + json.dumps(group) + "}"


def bulk_row(record: Record) -> tuple[Any, ...]:
    """The row a duetime store keeps for a checked record, as the stores' bulk writes take it
    (:class:`~duetime.bulk_interfaces.StoreBulkRows`): id, destination, due µs, headers as the store keeps
    them, body, failure count, group (duetime's own, or an NServiceBus saga's)."""
    assert record.due_us is not None  # checked records only
    return (
        record.message_id,
        record.destination,
        record.due_us,
        store_headers(record.headers),
        record.body,
        record.failure_count,
        group_of(record),
    )


def to_message(record: Record) -> DelayedMessage:
    if record.due_us is None:
        raise InvalidMessage("the due time is missing.")
    try:
        due = from_micros(record.due_us)
    except (OverflowError, ValueError):
        raise InvalidMessage(f"due time {record.due_us} µs since 1970 is out of range.") from None
    headers = parse_headers(record.headers)
    destination: Any = record.destination  # None is refused by DelayedMessage with a clear reason
    return DelayedMessage(
        record.message_id, destination, due, record.body, headers, record.failure_count, group_of(record)
    )


def parse_headers(text: str | None) -> dict[str, str]:
    """Headers as a source stores them: a JSON object of text (duetime, NServiceBus's
    TimeoutData), or the XML list of ``HeaderInfo`` the MSMQ transport writes.

    A JSON ``null`` value (Newtonsoft writes one for a header set to null) is dropped: a header
    with no value is carried as no header, which is what NServiceBus's own lookups make of it.
    The MSMQ transport's ``NServiceBus.Timeouts.Properties.*`` entries are dispatch settings, not
    headers (its dispatcher never sends them): dropped too.
    """
    if text is None or text.strip() == "":
        return {}
    text = text.lstrip("\ufeff")  # .NET's XmlSerializer writes UTF-8 with a byte order mark
    if text.lstrip().startswith("<"):
        return _without_properties(header_infos(text))
    try:
        value = read_json(text)
    except (ValueError, RecursionError) as error:  # not JSON, or nested too deeply to read
        raise InvalidMessage(f"headers are not readable JSON ({error}).") from None
    if not isinstance(value, dict):
        raise InvalidMessage("headers must be a JSON object of strings to strings.")
    headers: dict[str, str] = {}
    for key, text in value.items():  # one pass: a bulk job reads every row's headers
        if isinstance(text, str):
            if not key.startswith(MSMQ_PROPERTIES):
                headers[key] = text
        elif text is not None:
            raise InvalidMessage("headers must be a JSON object of strings to strings.")
    return headers


#: The MSMQ transport's prefix for what it stores beside the headers of a delayed message.


def _without_properties(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if not k.startswith(MSMQ_PROPERTIES)}


def header_infos(text: str) -> dict[str, str]:
    """The MSMQ transport's headers: ``<ArrayOfHeaderInfo><HeaderInfo><Key>…</Key><Value>…</Value>``.
    A ``HeaderInfo`` without a value (``xsi:nil``) is dropped, as a JSON null is."""
    try:
        root = ElementTree.fromstring(text.strip())
    except ElementTree.ParseError as error:
        raise InvalidMessage(f"headers are neither JSON nor readable XML ({error}).") from None
    headers: dict[str, str] = {}
    for info in root.iter(_local(root.tag, "HeaderInfo")):
        key, value = info.find(_local(root.tag, "Key")), info.find(_local(root.tag, "Value"))
        if key is None or not key.text:
            raise InvalidMessage("an XML header entry has no Key.")
        if value is not None and value.get(f"{{{_XSI}}}nil") != "true":
            headers[key.text] = value.text or ""
    return headers


_XSI = "http://www.w3.org/2001/XMLSchema-instance"


def _local(root_tag: str, name: str) -> str:
    """An element name in the root's namespace (the MSMQ transport writes none)."""
    return f"{root_tag[: root_tag.index('}') + 1]}{name}" if root_tag.startswith("{") else name


def to_header_infos(headers: dict[str, str]) -> str:
    """Headers as the MSMQ transport (and TimeoutMigrationTool's MSMQ target) writes them."""
    root = ElementTree.Element(
        "ArrayOfHeaderInfo", {"xmlns:xsi": _XSI, "xmlns:xsd": "http://www.w3.org/2001/XMLSchema"}
    )
    for key, value in headers.items():
        info = ElementTree.SubElement(root, "HeaderInfo")
        ElementTree.SubElement(info, "Key").text = key
        ElementTree.SubElement(info, "Value").text = value
    return '<?xml version="1.0"?>\n' + ElementTree.tostring(root, encoding="unicode")


def store_ready(text: str | None) -> bool:
    """Whether a source's headers text can go into a duetime store as it is (a JSON object with
    no null values); others are rewritten by :func:`store_headers` on the way."""
    return not text or (text.lstrip().startswith("{") and "null" not in text and MSMQ_PROPERTIES not in text)


def store_headers(text: str | None) -> str:
    """The headers text a duetime store keeps for a record: the source's own where it is ready
    (byte for byte), else the compact JSON of :func:`parse_headers`."""
    if not text:
        return "{}"
    return text if store_ready(text) else dump_headers(parse_headers(text))


def due_us_of(value: Any) -> int | None:
    """Micros since 1970 from a datetime (naive means UTC), an ISO string or a number."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_micros(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, str):
        return to_micros(parse_time(value))
    return int(value)
