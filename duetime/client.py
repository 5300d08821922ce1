"""The producer's API: schedule, cancel, reschedule, get, list, in async and sync flavours."""

from __future__ import annotations

import asyncio
import builtins
import copy
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from duetime import audit, tracing
from duetime.audit import Action, Actor, AuditEntry
from duetime.clock import SystemClock
from duetime.errors import ConfigurationError, InvalidMessage
from duetime.inputs.identifiers import check_name
from duetime.interfaces import (
    AsyncClosing,
    AuditStore,
    Clock,
    Closing,
    DelayedMessageStore,
    IfExists,
    ListQuery,
    Page,
    Put,
    RecurringStore,
    ReplacingStore,
    SyncAuditStore,
    SyncDelayedMessageStore,
    SyncRecurringStore,
    SyncReplacingStore,
    require,
)
from duetime.message import (
    MAX_DESTINATION_LENGTH,
    MAX_GROUP_LENGTH,
    MAX_ID_LENGTH,
    Delay,
    DelayedMessage,
    check_due_time,
    check_text,
    resolve_due_time,
)
from duetime.recurring.rules import Recurrence
from duetime.recurring.schedule import Schedule, changed, new_schedule
from duetime.settings import DEFAULT_ENDPOINT, TransactionMode


def build_message(
    clock: Clock,
    destination: str,
    body: bytes,
    *,
    delay: Delay | None = None,
    due_at: datetime | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | None = None,
    group: str | None = None,
    if_exists: object = IfExists.REFUSE,
) -> DelayedMessage:
    """The message :meth:`DelayedMessageClient.schedule` stores, checked for ``if_exists``: a
    debounce counts its due time from now (``delay``), and a replace or debounce needs an id (a
    message without one is new, so keep just stores it)."""
    how = IfExists.of(if_exists)
    if how is IfExists.DEBOUNCE and (delay is None or due_at is not None):
        raise InvalidMessage(
            "debounce counts the due time from now, so it takes a delay (delay=, --in), not a time "
            "(due_at=, --at); to move a message to a time of your own, replace it."
        )
    if how in (IfExists.REPLACE, IfExists.DEBOUNCE) and message_id is None:
        raise InvalidMessage(
            f"if-exists {how} needs the message's id (message_id=, --id): it says "
            "what to do when a message with that id is waiting."
        )
    return DelayedMessage.create(
        destination,
        body,
        due_at=due_at,
        delay=delay,
        headers=headers,
        message_id=message_id,
        now=clock.now(),
        group=group,
    )


def _id(message_id: object) -> str:
    """A message id as every store can look it up; anything else is the caller's mistake."""
    return check_text("message_id", message_id, MAX_ID_LENGTH)


def _messages(messages: Iterable[DelayedMessage]) -> list[DelayedMessage]:
    items = list(messages)
    for item in items:
        if not isinstance(item, DelayedMessage):
            raise InvalidMessage(
                f"schedule_many takes DelayedMessage objects, got {type(item).__name__}; "
                "build them with DelayedMessage.create(destination, body, delay=...)."
            )
    return items


def _group(group: object) -> str:
    return check_text("group", group, MAX_GROUP_LENGTH)


def _query(
    destination: object, due_before: object, limit: object, after: object, group: object = None
) -> ListQuery:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidMessage(f"limit must be a whole number between 1 and 10000, got {limit!r}.")
    if destination is not None:
        destination = check_text("destination", destination, MAX_DESTINATION_LENGTH)
    if due_before is not None:
        due_before = check_due_time(due_before, "due_before")
    if after is not None:
        if not (isinstance(after, tuple) and len(after) == 2 and isinstance(after[1], str)):
            raise InvalidMessage("after must be the next_cursor of the previous page, or None.")
        after = (check_due_time(after[0], "after"), _id(after[1]))
    return ListQuery(
        destination=destination,
        due_before=due_before,
        limit=limit,
        after=after,
        group=None if group is None else _group(group),
    )


def _cannot_replace(store: object) -> ConfigurationError:
    return ConfigurationError(
        f"{type(store).__name__} cannot keep, replace or debounce a waiting message; duetime's own "
        "stores can (a store built on StoreRules implements _replace_unclaimed)."
    )


def _keeps_none(store: object) -> ConfigurationError:
    return ConfigurationError(
        f"{type(store).__name__} keeps no recurring schedules; duetime's own stores do (a store "
        "built on StoreRules implements their six row primitives)."
    )


def _new(
    clock: Clock,
    schedule_id: str,
    destination: str,
    body: bytes,
    when: Recurrence,
    headers: Mapping[str, str] | None,
    paused: bool,
) -> Schedule:
    return new_schedule(
        schedule_id, destination, when, clock.now(), body=body, headers=headers, paused=paused
    )


class DelayedMessageClient(AsyncClosing):
    """Async client. ``await client.open()`` once (it initializes the store for the endpoint), or
    get a ready one from :func:`duetime.connect`. ``async with`` closes its store."""

    def __init__(
        self,
        store: DelayedMessageStore,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        clock: Clock | None = None,
        actor: Actor | None = None,
    ) -> None:
        require(
            store,
            DelayedMessageStore,
            "the store",
            "duetime.open_store(url) opens one (open_sync_store is for SyncDelayedMessageClient).",
        )
        self.store = store
        self.endpoint = check_name("endpoint", endpoint)
        self.clock: Clock = clock or SystemClock()
        self._clock_given = clock is not None
        #: Who makes the changes this client makes: given, each change is kept in the store's
        #: audit trail (:mod:`duetime.audit`).
        self.actor = actor

    async def open(self) -> DelayedMessageClient:
        await self.store.initialize(self.endpoint, TransactionMode.AT_LEAST_ONCE)
        return self

    def acting_as(self, actor: Actor) -> DelayedMessageClient:
        """This client's store and settings, its changes recorded as ``actor``'s (a server gives
        each request's caller one; the store is shared, not opened again)."""
        other = copy.copy(self)
        other.actor = actor
        return other

    async def _audit(self, action: Action, target: str, done: object = True, **said: Any) -> None:
        if self.actor is not None and done:
            await record(self.store, audit.made(self.actor, action, target, **said))

    async def close(self) -> None:
        """Close the store (its connections); the client cannot be used afterwards."""
        await self.store.close()

    async def schedule(
        self,
        destination: str,
        body: bytes = b"",
        *,
        delay: Delay | None = None,
        due_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        group: str | None = None,
        if_exists: IfExists | str = IfExists.REFUSE,
    ) -> DelayedMessage:
        """Store a message for ``destination`` due after ``delay`` or at ``due_at``; ``group`` is
        a key it shares with others (a saga, an order), to list or cancel them together.
        ``if_exists`` says what to do when a message with ``message_id`` is waiting
        (:class:`~duetime.interfaces.IfExists`: refuse, keep, replace, or debounce, which counts
        ``delay`` from now). Returns the message as stored (for keep, the one that stays)."""
        made = build_message(
            self.clock,
            destination,
            body,
            delay=delay,
            due_at=due_at,
            headers=headers,
            message_id=message_id,
            group=group,
            if_exists=if_exists,
        )
        return await self.schedule_message(made, if_exists=if_exists)

    async def schedule_message(
        self, message: DelayedMessage, *, if_exists: IfExists | str = IfExists.REFUSE
    ) -> DelayedMessage:
        """Store one message built already (``DelayedMessage.create``), as :meth:`schedule` does:
        calls made at the same moment share one commit. Returns it as stored."""
        return (await self.put(message, if_exists)).message

    async def put(self, message: DelayedMessage, if_exists: IfExists | str = IfExists.REFUSE) -> Put:
        """:meth:`schedule_message`, saying what it did: ``outcome`` is "stored", "kept" or
        "replaced". MessageInFlight when the waiting one is being forwarded."""
        how = IfExists.of(if_exists)
        (checked,) = _messages([message])
        with tracing.storing([checked]) as (stamped,):
            if how is IfExists.REFUSE:
                await self.store.store(stamped)
                return Put(stamped, "stored")
            if not isinstance(self.store, ReplacingStore):
                raise _cannot_replace(self.store)
            put = await self.store.put(stamped, how)
        action, target, done, said = _replaced(put, how)
        await self._audit(action, target, done, **said)
        return put

    async def schedule_many(self, messages: Iterable[DelayedMessage]) -> int:
        """Store several at once, all or nothing."""
        with tracing.storing(_messages(messages)) as stamped:
            return await self.store.store_many(stamped)

    async def cancel(self, message_id: str) -> bool:
        done = await self.store.cancel(_id(message_id))
        await self._audit(Action.CANCEL, message_id, done, ids=[message_id])
        return done

    async def cancel_group(self, group: str, *, limit: int | None = None) -> int:
        """Cancel every stored message of ``group``, or at most ``limit`` of them in one
        transaction (call again until it returns 0: a large group in batches, each whole); how
        many. One being forwarded right now is not stopped (it is on its way)."""
        done = await self.store.cancel_group(_group(group), limit)
        await self._audit(Action.CANCEL_GROUP, group, done, detail=f"{done} cancelled")
        return done

    async def count_group(self, group: str) -> int:
        """How many stored messages ``group`` holds."""
        return await self.store.count_group(_group(group))

    async def reschedule(
        self, message_id: str, *, delay: Delay | None = None, due_at: datetime | None = None
    ) -> bool:
        due = resolve_due_time(due_at=due_at, delay=delay, now=self.clock.now())
        done = await self.store.reschedule(_id(message_id), due)
        await self._audit(
            Action.RESCHEDULE, message_id, done, ids=[message_id], detail=f"due {due.isoformat()}"
        )
        return done

    async def get(self, message_id: str) -> DelayedMessage | None:
        return await self.store.get(_id(message_id))

    async def list(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
        group: str | None = None,
    ) -> Page:
        return await self.store.list(_query(destination, due_before, limit, after, group))

    # --- recurring schedules: each tick a stored message (duetime.recurring) --------------------
    async def add_recurring(
        self,
        schedule_id: str,
        destination: str,
        body: bytes = b"",
        *,
        when: Recurrence,
        headers: Mapping[str, str] | None = None,
        paused: bool = False,
    ) -> Schedule:
        """Deliver ``body`` to ``destination`` at every time ``when`` gives (build it with
        :func:`duetime.recurring.every` or :func:`duetime.recurring.cron`); ScheduleExists if the id is taken."""
        made = _new(self.clock, schedule_id, destination, body, when, headers, paused)
        added = await self._schedules.add_schedule(made, self._schedule_now())
        await self._audit(
            Action.SCHEDULE_ADD, schedule_id, detail=audit.schedule_detail(added.destination, added.paused)
        )
        return added

    async def recurring(self, schedule_id: str) -> Schedule:
        return await self._schedules.get_schedule(schedule_id)

    async def list_recurring(self, *, after: str = "", limit: int = 100) -> builtins.list[Schedule]:
        return await self._schedules.list_schedules(after, limit)

    async def change_recurring(self, schedule_id: str, **changes: Any) -> Schedule:
        """Change what :func:`duetime.recurring.changed` names (``when``, ``destination``,
        ``body``, ``headers``); it takes effect from the next tick."""
        now = await self._schedules.change_schedule(
            schedule_id, lambda s: changed(s, **changes), self._schedule_now()
        )
        await self._audit(Action.SCHEDULE_CHANGE, schedule_id, detail=audit.changes_detail(changes))
        return now

    async def pause_recurring(self, schedule_id: str) -> Schedule:
        now = await self._schedules.pause_schedule(schedule_id, self._schedule_now())
        await self._audit(Action.SCHEDULE_PAUSE, schedule_id)
        return now

    async def resume_recurring(self, schedule_id: str) -> Schedule:
        now = await self._schedules.resume_schedule(schedule_id, self._schedule_now())
        await self._audit(Action.SCHEDULE_RESUME, schedule_id)
        return now

    async def trigger_recurring(self, schedule_id: str) -> DelayedMessage:
        """One tick now, beside the schedule's own."""
        tick = await self._schedules.trigger_schedule(schedule_id, self._schedule_now())
        await self._audit(Action.SCHEDULE_TRIGGER, schedule_id, ids=[tick.message_id])
        return tick

    async def backfill_recurring(self, schedule_id: str, start: datetime, end: datetime) -> int:
        """Send now the ticks planned from ``start`` to ``end``; how many were stored."""
        n = await self._schedules.backfill_schedule(schedule_id, start, end, self._schedule_now())
        await self._audit(Action.SCHEDULE_BACKFILL, schedule_id, detail=audit.backfill_detail(start, end, n))
        return n

    async def remove_recurring(self, schedule_id: str) -> int:
        """Forget the schedule; how many of its stored ticks were removed with it."""
        n = await self._schedules.remove_schedule(schedule_id)
        await self._audit(Action.SCHEDULE_REMOVE, schedule_id, detail=f"{n} waiting ticks removed")
        return n

    def _schedule_now(self) -> datetime | None:
        """The time a schedule command counts from: the clock given, else the store's own
        (None), as the dispatchers follow it."""
        return self.clock.now() if self._clock_given else None

    @property
    def _schedules(self) -> RecurringStore:
        if not isinstance(self.store, RecurringStore):
            raise _keeps_none(self.store)
        return self.store


class SyncDelayedMessageClient(Closing):
    """The blocking client, for code that is not async (:func:`duetime.connect_sync` gives a ready one);
    ``with`` closes its store."""

    def __init__(
        self,
        store: SyncDelayedMessageStore,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        clock: Clock | None = None,
        actor: Actor | None = None,
    ) -> None:
        require(
            store,
            SyncDelayedMessageStore,
            "the store",
            "duetime.open_sync_store(url) opens one (open_store is for DelayedMessageClient).",
        )
        self.store = store
        self.endpoint = check_name("endpoint", endpoint)
        self.clock: Clock = clock or SystemClock()
        self._clock_given = clock is not None
        #: Who makes the changes this client makes: given, each change is kept in the store's
        #: audit trail (:mod:`duetime.audit`).
        self.actor = actor
        self.store.initialize(self.endpoint, TransactionMode.AT_LEAST_ONCE)

    def schedule(
        self,
        destination: str,
        body: bytes = b"",
        *,
        delay: Delay | None = None,
        due_at: datetime | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        group: str | None = None,
        if_exists: IfExists | str = IfExists.REFUSE,
    ) -> DelayedMessage:
        """As :meth:`DelayedMessageClient.schedule`, blocking."""
        made = build_message(
            self.clock,
            destination,
            body,
            delay=delay,
            due_at=due_at,
            headers=headers,
            message_id=message_id,
            group=group,
            if_exists=if_exists,
        )
        return self.schedule_message(made, if_exists=if_exists)

    def schedule_message(
        self, message: DelayedMessage, *, if_exists: IfExists | str = IfExists.REFUSE
    ) -> DelayedMessage:
        """As :meth:`DelayedMessageClient.schedule_message`, blocking."""
        return self.put(message, if_exists).message

    def put(self, message: DelayedMessage, if_exists: IfExists | str = IfExists.REFUSE) -> Put:
        """As :meth:`DelayedMessageClient.put`, blocking."""
        how = IfExists.of(if_exists)
        (checked,) = _messages([message])
        with tracing.storing([checked]) as (stamped,):
            if how is IfExists.REFUSE:
                self.store.store(stamped)
                return Put(stamped, "stored")
            if not isinstance(self.store, SyncReplacingStore):
                raise _cannot_replace(self.store)
            put = self.store.put(stamped, how)
        action, target, done, said = _replaced(put, how)
        self._audit(action, target, done, **said)
        return put

    def schedule_many(self, messages: Iterable[DelayedMessage]) -> int:
        with tracing.storing(_messages(messages)) as stamped:
            return self.store.store_many(stamped)

    def close(self) -> None:
        """Close the store (its connections); the client cannot be used afterwards."""
        self.store.close()

    def cancel(self, message_id: str) -> bool:
        done = self.store.cancel(_id(message_id))
        self._audit(Action.CANCEL, message_id, done, ids=[message_id])
        return done

    def cancel_group(self, group: str, *, limit: int | None = None) -> int:
        """Cancel every stored message of ``group``, or at most ``limit``; how many (see the async client)."""
        done = self.store.cancel_group(_group(group), limit)
        self._audit(Action.CANCEL_GROUP, group, done, detail=f"{done} cancelled")
        return done

    def count_group(self, group: str) -> int:
        return self.store.count_group(_group(group))

    def reschedule(
        self, message_id: str, *, delay: Delay | None = None, due_at: datetime | None = None
    ) -> bool:
        due = resolve_due_time(due_at=due_at, delay=delay, now=self.clock.now())
        done = self.store.reschedule(_id(message_id), due)
        self._audit(Action.RESCHEDULE, message_id, done, ids=[message_id], detail=f"due {due.isoformat()}")
        return done

    def get(self, message_id: str) -> DelayedMessage | None:
        return self.store.get(_id(message_id))

    def list(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int = 100,
        after: tuple[datetime, str] | None = None,
        group: str | None = None,
    ) -> Page:
        return self.store.list(_query(destination, due_before, limit, after, group))

    # --- recurring schedules (see the async client) --------------------------------------------
    def add_recurring(
        self,
        schedule_id: str,
        destination: str,
        body: bytes = b"",
        *,
        when: Recurrence,
        headers: Mapping[str, str] | None = None,
        paused: bool = False,
    ) -> Schedule:
        made = _new(self.clock, schedule_id, destination, body, when, headers, paused)
        added = self._schedules.add_schedule(made, self._schedule_now())
        self._audit(
            Action.SCHEDULE_ADD, schedule_id, detail=audit.schedule_detail(added.destination, added.paused)
        )
        return added

    def recurring(self, schedule_id: str) -> Schedule:
        return self._schedules.get_schedule(schedule_id)

    def list_recurring(self, *, after: str = "", limit: int = 100) -> builtins.list[Schedule]:
        return self._schedules.list_schedules(after, limit)

    def change_recurring(self, schedule_id: str, **changes: Any) -> Schedule:
        now = self._schedules.change_schedule(
            schedule_id, lambda s: changed(s, **changes), self._schedule_now()
        )
        self._audit(Action.SCHEDULE_CHANGE, schedule_id, detail=audit.changes_detail(changes))
        return now

    def pause_recurring(self, schedule_id: str) -> Schedule:
        now = self._schedules.pause_schedule(schedule_id, self._schedule_now())
        self._audit(Action.SCHEDULE_PAUSE, schedule_id)
        return now

    def resume_recurring(self, schedule_id: str) -> Schedule:
        now = self._schedules.resume_schedule(schedule_id, self._schedule_now())
        self._audit(Action.SCHEDULE_RESUME, schedule_id)
        return now

    def trigger_recurring(self, schedule_id: str) -> DelayedMessage:
        tick = self._schedules.trigger_schedule(schedule_id, self._schedule_now())
        self._audit(Action.SCHEDULE_TRIGGER, schedule_id, ids=[tick.message_id])
        return tick

    def backfill_recurring(self, schedule_id: str, start: datetime, end: datetime) -> int:
        n = self._schedules.backfill_schedule(schedule_id, start, end, self._schedule_now())
        self._audit(Action.SCHEDULE_BACKFILL, schedule_id, detail=audit.backfill_detail(start, end, n))
        return n

    def remove_recurring(self, schedule_id: str) -> int:
        n = self._schedules.remove_schedule(schedule_id)
        self._audit(Action.SCHEDULE_REMOVE, schedule_id, detail=f"{n} waiting ticks removed")
        return n

    def _schedule_now(self) -> datetime | None:
        """The time a schedule command counts from: the clock given, else the store's own
        (None), as the dispatchers follow it."""
        return self.clock.now() if self._clock_given else None

    def acting_as(self, actor: Actor) -> SyncDelayedMessageClient:
        """As :meth:`DelayedMessageClient.acting_as`."""
        other = copy.copy(self)
        other.actor = actor
        return other

    def _audit(self, action: Action, target: str, done: object = True, **said: Any) -> None:
        if self.actor is not None and done:
            record_sync(self.store, audit.made(self.actor, action, target, **said))

    @property
    def _schedules(self) -> SyncRecurringStore:
        if not isinstance(self.store, SyncRecurringStore):
            raise _keeps_none(self.store)
        return self.store


def _replaced(put: Put, how: IfExists) -> tuple[Action, str, bool, dict[str, Any]]:
    """What a put records: a replace or a debounce of a waiting message (a store of a new one,
    or a keep, changes nothing that was there)."""
    action = Action.DEBOUNCE if how is IfExists.DEBOUNCE else Action.REPLACE
    m = put.message
    said = {"ids": [m.message_id], "detail": f"due {m.due_at.isoformat()}"}
    return action, m.message_id, put.outcome == "replaced", said


def _unrecorded(entry: AuditEntry, error: BaseException) -> None:
    audit.log.error(
        "audit: the change was made but its entry could not be stored (%s): %s",
        " ".join(str(error).split())[:300],
        entry.to_json(),
        extra={"fields": {"audit": entry.as_json()}},
    )


def _recorded(entry: AuditEntry) -> None:
    audit.log.info(
        "audit: %s %s %s",
        entry.actor,
        entry.action,
        entry.target,
        extra={"fields": {"audit": entry.as_json()}},
    )


#: Seconds an audit entry may take to be stored: a store that stopped answering right after the
#: change holds up no command, page or request for longer (the entry goes to the log instead).
RECORD_WITHIN = 10.0


async def record(store: object, entry: AuditEntry) -> None:
    """Keep ``entry`` in ``store``'s audit trail (:mod:`duetime.audit`): what every tool calls
    after a change it made. A store that keeps no trail, or that fails or does not answer within
    :data:`RECORD_WITHIN` now, gets the entry written to the log at ERROR instead: the change was
    made, and is neither undone nor reported as failed for it."""
    try:
        if not isinstance(store, AuditStore):
            raise ConfigurationError(f"{type(store).__name__} keeps no audit trail")
        await asyncio.wait_for(store.audit(entry), RECORD_WITHIN)
    except Exception as error:  # the change stands; the entry goes to the log whole
        _unrecorded(entry, error)
    else:
        _recorded(entry)


def record_sync(store: object, entry: AuditEntry) -> None:
    """:func:`record` for a blocking store."""
    try:
        if not isinstance(store, SyncAuditStore):
            raise ConfigurationError(f"{type(store).__name__} keeps no audit trail")
        store.audit(entry)
    except Exception as error:  # the change stands; the entry goes to the log whole
        _unrecorded(entry, error)
    else:
        _recorded(entry)
