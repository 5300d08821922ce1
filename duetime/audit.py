"""The audit trail: who changed what, when, through what, and from where.

Every change a person or an API key makes (a cancel, a reschedule, a replace, a retry or a
discard of the error queue, a pause, a limit, a key rotation, a schedule's change, a webhook or an
API key made or removed) is one :class:`AuditEntry`, kept by the store the change was made to
(:class:`duetime.interfaces.AuditStore`: its own writer, in its named records), so every process
that changes a store writes to one trail. The command line, the dashboard and the HTTP API record
their changes; a Python client records its own when it is given an :class:`Actor`.

An entry is written *after* its change is made: the trail never says a change happened that did
not. If the store cannot take the entry then (it went away between the two), the change stands and
the entry is written to the log at ERROR instead, whole, so nothing is silently unrecorded.

The trail is read newest first (``duetime audit list``, the dashboard's audit page, ``GET
/v1/audit``), exported as JSON lines (``duetime audit export``), and pruned by age (``duetime
audit prune --older-than 90d``). Entries are short by design: at most :data:`IDS_KEPT` ids and
:data:`DETAIL_MOST` characters of detail, so a cancel of a million messages is one small entry that
says how many.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from duetime.errors import ConfigurationError

log = logging.getLogger("duetime.audit")

#: The kind of record the store keeps an entry as (beside webhooks and limits).
AUDIT = "audit"
#: At most this many ids are kept in one entry; the detail says how many there were in all.
IDS_KEPT = 100
#: The longest detail an entry keeps, and the longest actor's name or origin.
DETAIL_MOST = 1000
NAME_MOST = 200
#: The longest an id kept in an entry may be (a message id's own limit).
ID_MOST = 200
#: A page's cursor: an entry's key (its time to the microsecond, '-', its id).
CURSOR = r"^[0-9]{8}T[0-9]{6}\.[0-9]{6}Z-[0-9a-f]{1,32}$"


class Action(enum.StrEnum):
    """What was done. The words ``duetime audit list --action`` filters on."""

    CANCEL = "cancel"
    CANCEL_GROUP = "cancel-group"
    RESCHEDULE = "reschedule"
    REPLACE = "replace"
    DEBOUNCE = "debounce"
    RETRY = "retry"
    DISCARD = "discard"
    PAUSE = "pause"
    RESUME = "resume"
    LIMIT_SET = "limit-set"
    LIMIT_REMOVE = "limit-remove"
    KEY_ROTATE = "key-rotate"
    KEY_RETIRE = "key-retire"
    SCHEDULE_ADD = "schedule-add"
    SCHEDULE_CHANGE = "schedule-change"
    SCHEDULE_PAUSE = "schedule-pause"
    SCHEDULE_RESUME = "schedule-resume"
    SCHEDULE_TRIGGER = "schedule-trigger"
    SCHEDULE_BACKFILL = "schedule-backfill"
    SCHEDULE_REMOVE = "schedule-remove"
    WEBHOOK_ADD = "webhook-add"
    WEBHOOK_ROTATE = "webhook-rotate"
    WEBHOOK_REMOVE = "webhook-remove"
    API_KEY_CREATE = "api-key-create"
    API_KEY_REVOKE = "api-key-revoke"
    AUDIT_PRUNE = "audit-prune"

    @classmethod
    def of(cls, text: str) -> Action:
        """The action named ``text``; a one-line error listing the words otherwise."""
        try:
            return cls(text)
        except ValueError:
            raise ConfigurationError(
                f"{text!r} is not an action the audit trail records; give one of: "
                + ", ".join(a.value for a in cls)
            ) from None


def _line(value: str, most: int) -> str:
    """``value`` on one line, without control characters, at most ``most`` characters: an entry
    holds what a careless or hostile caller gave, so what it keeps is plain text of bounded size."""
    kept = "".join(c if c.isprintable() else " " for c in value)
    return kept if len(kept) <= most else kept[: most - 1] + "…"


class Via(enum.StrEnum):
    """Through what the change was made."""

    CLI = "cli"
    DASHBOARD = "dashboard"
    HTTP_API = "http-api"
    PYTHON = "python"


@dataclass(frozen=True, slots=True)
class Actor:
    """Who makes changes: a person's or a program's name (an API key's is ``key:NAME``), through
    what (:class:`Via`), and from where (a host name, a client's address; "" when unknown)."""

    name: str
    via: Via = Via.PYTHON
    origin: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("an actor needs a name: who makes the change (a person, a program).")
        object.__setattr__(self, "name", _line(self.name, NAME_MOST))
        if self.via not in set(Via):
            raise ConfigurationError(
                f"{self.via!r} is not a way of making changes; give one of: "
                + ", ".join(v.value for v in Via)
            )
        object.__setattr__(self, "via", Via(self.via))
        object.__setattr__(self, "origin", _line(self.origin, NAME_MOST))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change. ``target`` is what it acted on (a message id, a group, a destination, a
    schedule, a key); ``ids`` the messages it touched (the first :data:`IDS_KEPT`); ``detail``
    what else a reader needs (a new due time, a count, a limit)."""

    at: datetime
    actor: str
    via: str
    origin: str
    action: str
    target: str
    ids: tuple[str, ...] = ()
    detail: str = ""
    #: Unique; with ``at``, the entry's place in the trail (:attr:`key`).
    entry_id: str = field(default_factory=lambda: secrets.token_hex(6))

    @property
    def key(self) -> str:
        """Where the entry sits in the trail: its time (UTC, to the microsecond) then its id, so
        the keys sort as the entries happened."""
        return key_at(self.at) + "-" + self.entry_id

    def as_json(self) -> dict[str, Any]:
        """The entry as `duetime audit export` writes a line of it and the HTTP API answers it."""
        return {
            "at": self.at.isoformat(),
            "actor": self.actor,
            "via": self.via,
            "origin": self.origin,
            "action": self.action,
            "target": self.target,
            "ids": list(self.ids),
            "detail": self.detail,
            "id": self.entry_id,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_json(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> AuditEntry:
        d = json.loads(text)
        return cls(
            datetime.fromisoformat(d["at"]),
            d["actor"],
            d["via"],
            d["origin"],
            d["action"],
            d["target"],
            tuple(d["ids"]),
            d["detail"],
            d["id"],
        )


def key_at(at: datetime) -> str:
    """The part of an entry's key its time gives (fixed width, so keys sort by time)."""
    return at.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def made(
    actor: Actor,
    action: Action,
    target: str,
    *,
    ids: Iterable[str] = (),
    detail: str = "",
    at: datetime | None = None,
) -> AuditEntry:
    """The entry of ``actor``'s ``action``, its parts cut to what an entry keeps."""
    every = list(ids)
    kept = tuple(_line(i, ID_MOST) for i in every[:IDS_KEPT])
    if len(every) > IDS_KEPT:
        detail = f"{detail}; {len(every):,} messages, the first {IDS_KEPT} listed".lstrip("; ")
    return AuditEntry(
        at or datetime.now(UTC),
        actor.name,
        actor.via.value,
        actor.origin,
        Action(action).value,
        _line(target, ID_MOST),
        kept,
        _line(detail, DETAIL_MOST),
    )


# What an entry says of a schedule's change, written once for every way of making one.
def schedule_detail(destination: str, paused: bool) -> str:
    return f"to {destination}" + (" (paused)" if paused else "")


def changes_detail(fields: Iterable[str]) -> str:
    """Which fields a change set, not their values (a body or headers may be secret)."""
    return "changed " + ", ".join(sorted(fields))


def backfill_detail(start: datetime, end: datetime, stored: int) -> str:
    return f"{stored} ticks from {start.isoformat()} to {end.isoformat()}"


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which entries to read: between two times, by one actor or of one action, newest first
    (or oldest first, as an export reads them); ``after`` is the previous page's last key."""

    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    action: str | None = None
    limit: int = 50
    after: str | None = None
    oldest_first: bool = False

    def __post_init__(self) -> None:
        if self.after is not None and not re.match(CURSOR, self.after):
            raise ConfigurationError(
                f"{self.after!r} is not a place in the audit trail; pass the cursor the previous page gave."
            )

    def matches(self, entry: AuditEntry) -> bool:
        return (self.actor is None or entry.actor == self.actor) and (
            self.action is None or entry.action == self.action
        )

    def bounds(self) -> tuple[str, str]:
        """The keys the query reads between, both left out: above the first and below the
        second, its cursor applied."""
        above = key_at(self.since) if self.since else ""
        below = key_at(self.until) if self.until else KEY_ABOVE_ALL
        if self.after is not None:
            if self.oldest_first:
                above = max(above, self.after)
            else:
                below = min(below, self.after)
        return above, below


#: A key above every entry's in any collation (entries' keys start with their year).
KEY_ABOVE_ALL = "99999999"

#: ``read(above, below, limit, oldest_first)``: the texts of the entries whose keys lie between
#: ``above`` and ``below`` (both left out), in key order, at most ``limit``.
RangeReader = Callable[[str, str, int, bool], Sequence[str]]


def page_of(read: RangeReader, query: AuditQuery, chunk: int = 500) -> tuple[list[AuditEntry], str | None]:
    """The entries ``query`` asks for, and the cursor of the next page (None on the last). The
    actor and action filters are applied here, reading on until a page is full."""
    if query.limit < 1:
        raise ConfigurationError(f"a page of the audit trail holds at least 1 entry, not {query.limit}.")
    above, below = query.bounds()
    found: list[AuditEntry] = []
    size = max(chunk, query.limit)
    while True:
        texts = read(above, below, size, query.oldest_first)
        entries = [AuditEntry.from_json(t) for t in texts]
        for e in entries:
            if query.matches(e):
                found.append(e)
                if len(found) == query.limit:
                    return found, e.key
        if len(texts) < size:
            return found, None
        if query.oldest_first:
            above = entries[-1].key
        else:
            below = entries[-1].key


def in_range(texts: Iterable[str], above: str, below: str, limit: int, oldest_first: bool) -> list[str]:
    """What a :data:`RangeReader` answers, from every entry's text: for a store that cannot read
    a range of its records by their names (it reads them all)."""
    keyed = sorted(((AuditEntry.from_json(t).key, t) for t in texts), reverse=not oldest_first)
    return [t for k, t in keyed if above < k < below][:limit]
