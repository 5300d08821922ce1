"""Sending messages from the error queue back for another try, or discarding them.

`duetime errors retry/discard` and the dashboard's error-queue page do the same thing, so the
rules live here once: which messages a request picks, that each is stored before it leaves the
error queue (a retry that stops half-way loses nothing, and running it again finishes it), and
that a message which does not say where it was going stays where it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from duetime import audit
from duetime.audit import Action, Actor
from duetime.client import record
from duetime.clock import SYSTEM
from duetime.error_headers import (
    ERROR_ATTEMPTS,
    ERROR_ENDPOINT,
    ERROR_MESSAGE,
    ERROR_TIME,
    ORIGINAL_DESTINATION,
    failed_in,
    kept_in_store,
    without_error_headers,
)
from duetime.errors import ConfigurationError
from duetime.interfaces import DelayedMessageStore, InspectableQueue, ReceivedMessage
from duetime.limits import spread_offset
from duetime.message import DelayedMessage
from duetime.operations.message_files import store_new
from duetime.registry import open_transport

#: How many messages a look through the whole error queue reads at most.
EVERYTHING = 1_000_000
#: How many messages a listing (`errors list`, the dashboard's page) looks at to find an
#: endpoint's failures: a page view must not read a million messages off a broker.
LOOKED_AT = 10_000
#: Messages stored, then acknowledged, per round (a crash repeats at most one round, and a
#: message stored twice is recognised by its id).
ROUND = 1_000


def open_error_transport(url: str) -> InspectableQueue:
    """The transport at ``url``, if it can show its queues (every queue transport can; one that
    only sends, a Celery bridge say, cannot): else a one-line ConfigurationError."""
    t = open_transport(url)
    if not isinstance(t, InspectableQueue):
        raise ConfigurationError(
            f"{type(t).__name__} cannot show its error queue from here; use the broker's own tools."
        )
    return t


def goes_to(item: ReceivedMessage) -> str:
    """Where the message was going when it failed ("" when it does not say)."""
    return item.headers.get(ORIGINAL_DESTINATION, "")


def failed_row(item: ReceivedMessage) -> dict[str, Any]:
    """A message of the error queue, and why it is there, as `duetime errors list --json` prints
    it and the HTTP API answers it."""
    h = item.headers
    return {
        "id": item.message_id,
        "destination": goes_to(item) or None,
        "error": h.get(ERROR_MESSAGE),
        "attempts": int(h[ERROR_ATTEMPTS]) if h.get(ERROR_ATTEMPTS, "").isdigit() else None,
        "failed_at": h.get(ERROR_TIME),
        "headers": dict(h),
        "size": len(item.body),
        "kept_in_store": kept_in_store(h),
    }


@dataclass(frozen=True, slots=True)
class Failures:
    """What the error queue holds for one endpoint: the messages shown, how many of the
    endpoint's were looked at, and how many the queue holds (every endpoint's)."""

    shown: list[ReceivedMessage]
    found: int
    depth: int


async def failures(
    t: InspectableQueue, queue: str, endpoint: str, destination: str | None, limit: int
) -> Failures:
    """The first ``limit`` of ``endpoint``'s failures in ``queue`` (those that were going to
    ``destination``, if given), oldest first, left where they are."""
    depth = await t.depth(queue)
    seen = mine(await t.peek(queue, LOOKED_AT), endpoint)
    shown = [m for m in seen if destination is None or goes_to(m) == destination][:limit]
    return Failures(shown, len(seen), depth)


async def chosen(
    t: InspectableQueue,
    queue: str,
    ids: Sequence[str],
    every: bool,
    destination: str | None,
    endpoint: str,
) -> tuple[list[str], list[str]]:
    """The ids a request names that are in the queue: the ones given, or every message (for one
    destination or all), of ``endpoint``'s failures only; and the ids given that are not there
    (handled already). An id given that failed in another endpoint is refused, naming it: one
    endpoint never retries or discards another's failures. The queue is read once."""
    if bool(ids) == every:
        raise ConfigurationError(
            "give the ids of messages in the error queue, or --all (with --destination Q for one "
            "destination's); see `duetime errors list`."
        )
    if ids and destination:
        raise ConfigurationError(
            "--destination picks which messages --all takes; to send messages somewhere else, use --to QUEUE."
        )
    seen = await t.peek(queue, EVERYTHING)
    if every:
        return [
            m.message_id
            for m in seen
            if failed_in(m.headers, endpoint) and (destination is None or goes_to(m) == destination)
        ], []
    theirs = {
        m.message_id: m.headers.get(ERROR_ENDPOINT, "") for m in seen if not failed_in(m.headers, endpoint)
    }
    elsewhere = [i for i in ids if i in theirs]
    if elsewhere:
        first = elsewhere[0]
        raise ConfigurationError(
            f"{first} failed in endpoint {theirs[first]!r}, not {endpoint!r}: give --endpoint "
            f"{theirs[first]} to act on it"
            + (
                f" ({len(elsewhere) - 1} more of the ids given are other endpoints')"
                if len(elsewhere) > 1
                else ""
            )
            + "; nothing was done."
        )
    there = {m.message_id for m in seen}
    return [i for i in ids if i in there], [i for i in ids if i not in there]


def mine(seen: Sequence[ReceivedMessage], endpoint: str) -> list[ReceivedMessage]:
    """Of what an error queue holds, ``endpoint``'s failures."""
    return [m for m in seen if failed_in(m.headers, endpoint)]


async def take(
    t: InspectableQueue, queue: str, ids: Sequence[str]
) -> tuple[list[ReceivedMessage], list[str]]:
    """The messages taken off ``queue`` (unacknowledged: they go back if the caller stops), and
    the ids that were not there (handled already by someone else)."""
    taken = await t.take(queue, ids) if ids else []
    missing = sorted(set(ids) - {m.message_id for m in taken})
    return taken, missing


@dataclass(frozen=True, slots=True)
class SentBack:
    sent: int
    #: Of those, how many the store had already (an earlier retry stopped before acknowledging).
    already: int
    #: Ids left in the error queue because they do not say where they were going.
    nowhere: list[str]


async def send_back(
    store: DelayedMessageStore,
    t: InspectableQueue,
    taken: Sequence[ReceivedMessage],
    *,
    to: str | None = None,
    delay: timedelta = timedelta(0),
    spread: timedelta = timedelta(0),
    actor: Actor | None = None,
) -> SentBack:
    """Store each taken message again (due after ``delay``, to ``to`` or where it was going), then
    acknowledge it off the error queue, a round at a time. With ``spread``, each goes a moment of
    its own (by its id) up to that after the delay: 50,000 retried do not all fall due at once. A notice of a message kept in the store
    reschedules that message instead (it cannot be sent elsewhere: it never left). With an
    ``actor``, the retry is kept in the store's audit trail."""
    kept = [m for m in taken if kept_in_store(m.headers)]
    if kept and to:
        raise ConfigurationError(
            f"{kept[0].message_id} was kept in the store (its transport could never carry it); --to "
            "cannot send it elsewhere: fix what the notice says, then retry it without --to, or cancel it."
        )
    again = sum(
        [
            await store.reschedule(m.message_id, SYSTEM.now() + delay + spread_offset(m.message_id, spread))
            for m in kept
        ]
    )
    await t.acknowledge(kept)
    taken = [m for m in taken if not kept_in_store(m.headers)]
    nowhere = [m.message_id for m in taken if not (to or goes_to(m))]
    ready = [m for m in taken if to or goes_to(m)]
    sent = stored = 0
    for start in range(0, len(ready), ROUND):
        batch = ready[start : start + ROUND]
        messages = [
            DelayedMessage.create(
                to or goes_to(m),
                m.body,
                delay=delay + spread_offset(m.message_id, spread),
                headers=without_error_headers(m.headers),
                message_id=m.message_id,
            )
            for m in batch
        ]
        stored += await store_new(store, messages)
        await t.acknowledge(batch)
        sent += len(batch)
    if actor is not None and sent + again:
        done = [m.message_id for m in kept] + [m.message_id for m in ready]
        where = f"to {to}" if to else "to where each was going"
        said = f"{len(done)} sent back {where}, due in {delay}" + (
            f", spread over {spread}" if spread else ""
        )
        await record(store, audit.made(actor, Action.RETRY, to or "error queue", ids=done, detail=said))
    return SentBack(sent + again, sent - stored, nowhere)


async def discard(
    store: DelayedMessageStore,
    t: InspectableQueue,
    taken: Sequence[ReceivedMessage],
    actor: Actor | None = None,
) -> int:
    """Acknowledge the taken messages off the error queue for good; a notice of a message kept in
    the store cancels that message too (discarding it means giving it up). With an ``actor``, the
    discard is kept in the store's audit trail."""
    for m in taken:
        if kept_in_store(m.headers):
            await store.cancel(m.message_id)
    gone = await t.acknowledge(taken)
    if actor is not None and taken:
        ids = [m.message_id for m in taken]
        entry = audit.made(actor, Action.DISCARD, "error queue", ids=ids, detail=f"{len(ids)} discarded")
        await record(store, entry)
    return gone
