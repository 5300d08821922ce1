"""Scheduling a file of delayed messages (JSON Lines) in bulk: validate it all, then store in chunks.

One line is one message::

    {"destination": "orders", "due_at": "2030-01-01T09:00:00+01:00", "body": "text", "headers": {"k": "v"}, "id": "optional", "group": "optional"}
    {"destination": "orders", "delay": "10m", "body_base64": "AAEC"}

Nothing is stored unless every line is valid, so a typo on line 900,000 never leaves half a file
stored. Chunks go through ``store_many`` (COPY on PostgreSQL).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from duetime.audit import IDS_KEPT
from duetime.errors import ConfigurationError, DuplicateMessageId, InvalidMessage, MessageInFlight
from duetime.inputs.durations import parse_duration, parse_time
from duetime.inputs.jsontext import NumberTooLong, read_json
from duetime.interfaces import DelayedMessageStore, IfExists, NewOnlyStore, ReplacingStore
from duetime.limits import spread_offset
from duetime.message import DelayedMessage, check_encodable, check_size, kind

KNOWN = {"destination", "due_at", "delay", "body", "body_base64", "headers", "id", "group"}


@dataclass
class LoadReport:
    lines: int = 0
    stored: int = 0
    skipped_duplicates: int = 0
    #: Lines that replaced a waiting message of their id (--if-exists replace or debounce), and
    #: the first of their ids (what the audit trail names).
    replaced: int = 0
    replaced_ids: list[str] = field(default_factory=list)
    #: Ids whose waiting message was being delivered, so their line was not stored.
    in_flight: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Every destination the file names (the CLI checks each has a queue).
    destinations: set[str] = field(default_factory=set)


def parse_line(
    text: str | bytes, number: int, now: datetime, if_exists: IfExists = IfExists.REFUSE
) -> DelayedMessage:
    """One JSON line -> a message; InvalidMessage names the line, the field and the fix. With
    ``if_exists`` replace or debounce every line needs an "id", and a debounce a "delay"."""
    if isinstance(text, bytes):
        text = _decoded(text, number)
    try:
        row = read_json(text)
    except json.JSONDecodeError as error:
        raise InvalidMessage(f"line {number}: not JSON ({error.msg} at column {error.colno}).") from None
    except NumberTooLong as error:
        raise InvalidMessage(
            f"line {number}: {error}; give a delay as a duration (10m) or a due_at time."
        ) from None
    except RecursionError:  # Python's parser gives up near a thousand levels of [ or {
        raise InvalidMessage(
            f"line {number}: nested too deeply to read (hundreds of [ or {{ inside each other)."
        ) from None
    if not isinstance(row, dict):
        raise InvalidMessage(f"line {number}: expected a JSON object ({{...}}), got {kind(row)}.")
    unknown = set(row) - KNOWN
    if unknown:
        raise InvalidMessage(f"line {number}: unknown field(s) {sorted(unknown)}; known: {sorted(KNOWN)}.")
    if ("due_at" in row) == ("delay" in row):
        raise InvalidMessage(
            f'line {number}: give exactly one of "due_at" (a time with its offset, e.g. '
            '"2030-01-01T09:00:00Z") or "delay" (e.g. "10m" or 600).'
        )
    if if_exists in (IfExists.REPLACE, IfExists.DEBOUNCE) and "id" not in row:
        raise InvalidMessage(f'line {number}: --if-exists {if_exists} needs an "id" on every line.')
    if if_exists is IfExists.DEBOUNCE and "due_at" in row:
        raise InvalidMessage(
            f'line {number}: a debounce counts its due time from now, so it takes a "delay", not "due_at".'
        )
    try:
        body = _body(row)
        due_at = parse_time(row["due_at"]) if isinstance(row.get("due_at"), str) else row.get("due_at")
        delay: Any = row.get("delay")
        if isinstance(delay, str):
            delay = parse_duration(delay)
        made = DelayedMessage.create(
            row.get("destination"),  # type: ignore[arg-type]
            body,
            due_at=due_at,
            delay=delay,
            headers=row.get("headers") or {},
            message_id=row.get("id"),
            now=now,
            group=row.get("group"),
        )
        return check_size(made)  # the store checks again; here each line is told before any is stored
    except InvalidMessage as error:
        raise InvalidMessage(f"line {number}: {error}") from None


def _body(row: dict[str, Any]) -> bytes:
    if "body" in row and "body_base64" in row:
        raise InvalidMessage("give body (text) or body_base64, not both.")
    if "body_base64" in row:
        try:
            return base64.b64decode(row["body_base64"], validate=True)
        except (binascii.Error, TypeError):
            raise InvalidMessage("body_base64 is not valid base64.") from None
    body = row.get("body", "")
    if not isinstance(body, str):
        raise InvalidMessage("body must be text; use body_base64 for bytes.")
    return check_encodable("body", body).encode()


def _decoded(line: bytes, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidMessage(
            f"line {number}: not UTF-8 text (byte {line[error.start]:#04x} at column {error.start + 1}); "
            "save the file as UTF-8."
        ) from None


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's lines that are not blank, as bytes: each is decoded on its own, so a byte that
    is not UTF-8 is that line's problem, listed with the others, not the end of the check. A
    byte-order mark some editors put first is dropped."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if number == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if line.strip():
                yield number, line


def validate(
    path: Path,
    now: datetime,
    max_problems: int = 20,
    carry: Callable[[DelayedMessage], str | None] | None = None,
    if_exists: IfExists = IfExists.REFUSE,
) -> LoadReport:
    """First pass: count the lines and collect problems, storing nothing. ``carry`` says why the
    transport could never carry a message (too large, a header it refuses): that line's problem."""
    report = LoadReport()
    for number, text in _lines(path):
        report.lines += 1
        try:
            message = parse_line(text, number, now, if_exists)
            refused = carry(message) if carry is not None else None
            if refused:
                raise InvalidMessage(f"line {number}: {refused}.")
            report.destinations.add(message.destination)
        except InvalidMessage as error:
            if len(report.problems) < max_problems:
                report.problems.append(str(error))
            else:
                report.problems[-1] = f"... and more; first {max_problems} shown"
    return report


async def load(
    path: Path,
    store: DelayedMessageStore,
    now: datetime,
    *,
    chunk: int = 50_000,
    skip_duplicates: bool = False,
    progress: Callable[[int], None] = lambda _n: None,
    checked: LoadReport | None = None,
    if_exists: IfExists = IfExists.REFUSE,
    spread: timedelta = timedelta(0),
) -> LoadReport:
    """Validate ``path`` (unless ``checked`` is that pass's report), then store every line (each
    due a moment of its own up to ``spread`` after its time, by its id: a storm spread);
    raises InvalidMessage listing the problems. ``skip_duplicates`` is ``if_exists`` keep; with
    replace or debounce each line is stored as one change of its own (a later line of an id
    replaces an earlier one), and a line whose waiting message is being delivered is not stored
    (its id is in ``in_flight``)."""
    if skip_duplicates:
        if_exists = IfExists.KEEP
    if if_exists in (IfExists.REPLACE, IfExists.DEBOUNCE) and not isinstance(store, ReplacingStore):
        raise ConfigurationError(f"{type(store).__name__} cannot replace a waiting message.")
    checked = checked or validate(path, now, if_exists=if_exists)
    if checked.problems:
        raise InvalidMessage(
            f"{path} has problems; nothing was stored. Fix them and run again:\n  "
            + "\n  ".join(checked.problems)
        )
    report = LoadReport(lines=checked.lines, destinations=checked.destinations)
    batch: list[DelayedMessage] = []
    for number, text in _lines(path):
        message = parse_line(text, number, now, if_exists)
        if spread:
            message = message.with_changes(due_at=message.due_at + spread_offset(message.message_id, spread))
        batch.append(message)
        if len(batch) >= chunk:
            await _store(store, batch, report, if_exists)
            progress(len(batch))
            batch = []
    if batch:
        await _store(store, batch, report, if_exists)
        progress(len(batch))
    return report


async def _store(
    store: DelayedMessageStore, batch: list[DelayedMessage], report: LoadReport, if_exists: IfExists
) -> None:
    if if_exists in (IfExists.REPLACE, IfExists.DEBOUNCE):
        await _replace_each(cast(ReplacingStore, store), batch, report, if_exists)
        return
    skip = if_exists is IfExists.KEEP
    try:
        report.stored += await store.store_many(batch)
    except DuplicateMessageId as error:
        if not skip:
            raise DuplicateMessageId(
                f"{error} {report.stored} messages from earlier chunks are stored; run again with "
                "--skip-duplicates to store the rest and skip what is there (e.g. after an interrupted "
                "load), or --if-exists replace to put each line in place of what is there."
            ) from None
        stored = await store_new(store, batch)
        report.stored += stored
        report.skipped_duplicates += len(batch) - stored


async def _replace_each(
    store: ReplacingStore, batch: list[DelayedMessage], report: LoadReport, if_exists: IfExists
) -> None:
    for message in batch:
        try:
            done = await store.put(message, if_exists)
        except MessageInFlight:
            report.in_flight.append(message.message_id)
            continue
        report.stored += done.outcome == "stored"
        if done.outcome == "replaced":
            report.replaced += 1
            if len(report.replaced_ids) < IDS_KEPT:
                report.replaced_ids.append(message.message_id)


async def store_new(store: DelayedMessageStore, batch: Sequence[DelayedMessage]) -> int:
    """Store each message not stored yet (by id); how many were new. The way to resume work that
    stopped half-way after storing part of a batch: the batch at once, else what the store does
    not hold (one message at a time for a store without ``store_new``)."""
    try:
        return await store.store_many(batch)
    except DuplicateMessageId:
        if isinstance(store, NewOnlyStore):
            return await store.store_new(batch)
        return await _one_by_one(store, batch)


async def _one_by_one(store: DelayedMessageStore, batch: Sequence[DelayedMessage]) -> int:
    stored = 0
    for message in batch:
        try:
            await store.store(message)
            stored += 1
        except DuplicateMessageId:
            pass
    return stored
