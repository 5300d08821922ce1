"""The store rules, written once; every backend supplies only its primitives.

A change to what a store promises (the in-flight rule for cancel and reschedule, the duplicate-id
error, the "not set up" error, list filters and cursor paging, header encoding, URL options) is one
edit here. A backend subclasses :class:`StoreRules` and implements the ``_``-prefixed primitives with
its named queries, Lua scripts or dict; the async store is that blocking store behind the one bridge
in :mod:`duetime.backends._on_a_thread`.
"""

from __future__ import annotations

import builtins
import json
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from duetime.api_keys import ApiKey
from duetime.audit import AUDIT, AuditEntry, AuditQuery, in_range, key_at, page_of
from duetime.backends._schedules import ScheduleRules
from duetime.backends._shared_commit import SharedCommits
from duetime.clock import SystemClock, to_micros
from duetime.encryption import PROBLEM_HEADER, Sealer, Unreadable, sealed_with, sealer_from_environment
from duetime.errors import (
    ApiKeyExists,
    ConfigurationError,
    DuplicateMessageId,
    MessageInFlight,
    StoreNotReady,
    WebhookExists,
)
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import number_option
from duetime.interfaces import (
    Claimed,
    Clock,
    Closing,
    IfExists,
    ListQuery,
    NextDue,
    Page,
    Put,
    Resealed,
    StoreCounts,
)
from duetime.limits import LIMITS, PAUSES, RATE_STATE, SLOT_STATE, Limit, Pause, Rate, RateGrant, record_name
from duetime.limits import give_slots as _give_slots
from duetime.limits import take_rate as _take_rate
from duetime.limits import take_slots as _take_slots
from duetime.live_dispatchers import FORGET_AFTER, PRUNE_EVERY, DispatcherInfo
from duetime.message import (
    MAX_GROUP_LENGTH,
    DelayedMessage,
    check_due_time,
    check_storable,
    check_text,
    dump_headers,
)
from duetime.recurring.schedule import Schedule
from duetime.settings import ENCRYPTION_KEYS_VARIABLE, TransactionMode
from duetime.store_row import CLAIM_COLUMNS, STORE_COLUMNS
from duetime.webhooks import WebhookEndpoint

T = TypeVar("T")
#: Messages a step of a key rotation reads and seals again in one change.
RESEAL_BATCH = 500

#: The layout every store writes; a store refuses tables or keys written by a newer duetime, and
#: asks for `duetime setup` (which upgrades in place) on ones written by an older one.
#: 2: the group key (a column, or a set per group on Redis). 3: the API keys' table (or hash).
#: 4: the named records' table (webhook endpoints; a hash per kind on Redis).
SCHEMA_VERSION = 4
#: The kind of record a webhook endpoint is.
WEBHOOKS = "webhook"
#: The claim token of a message held back by a flow-control limit (duetime.limits): not claimed
#: by anyone (a cancel, reschedule or replace reaches it), hidden from claims until its
#: ``claimed_until``. Thirty-two zeros: a token of every store's column type (text, CHAR(32),
#: uuid) that no claim's random token is.
HOLD_TOKEN = "0" * 32
#: As the SQL files write it (``{held}``).
HOLD_TOKEN_SQL = f"'{HOLD_TOKEN}'"
#: Tries of a compare-and-set of flow-control state before a store call gives up (each loses only
#: to another dispatcher's change, so this many in a row means the store is thrashing).
SWAP_TRIES = 50
#: How a record is read before a swap: the last value seen, kept for this many buckets.
SEEN_MOST = 10_000
#: How long a claim keeps a message from other dispatchers unless a URL or the settings say otherwise.
DEFAULT_CLAIM_TIMEOUT = timedelta(seconds=30)
#: Destinations counted one by one in ``counts`` (the queries stop there); the rest are summed.
DESTINATIONS_SHOWN = 1000
#: A page of the default group count (:meth:`StoreRules._count_group`).
GROUP_PAGE = 10_000
#: Looks at what a batch holds already before ``store_new`` stores its messages one at a time
#: (only a writer storing the same ids at that moment makes a second look necessary).
NEW_ONLY_TRIES = 3


class Duplicate(Exception):
    """Raised by a backend's ``_insert`` when an id is already stored; ``message_id`` if known."""

    def __init__(self, message_id: str | None = None) -> None:
        super().__init__(message_id)
        self.message_id = message_id


def duplicate_id(message_id: str | None) -> DuplicateMessageId:
    shown = message_id if message_id is not None else "(one of this batch)"
    return DuplicateMessageId(
        f"A delayed message with id {shown!r} is already stored; nothing from this call was stored. "
        "Choose a new id, or say what to do with the stored one (if-exists keep, replace or debounce)."
    )


def in_flight(message_id: str) -> MessageInFlight:
    return MessageInFlight(f"Message {message_id!r} is being forwarded right now; it cannot be changed.")


def not_replaced(message_id: str) -> MessageInFlight:
    return MessageInFlight(
        f"Message {message_id!r} is being forwarded right now (or was a moment ago), so it was not "
        "replaced; schedule the new one under another id if it should go too."
    )


#: The columns every SQL store table has had since the first version (all but the group): a table
#: of the store's name without them is another program's, and setup changes nothing of it.
FIRST_VERSION_COLUMNS = frozenset({*STORE_COLUMNS, *CLAIM_COLUMNS} - {"group_key"})


def check_store_columns(table: str, where: str, columns: Iterable[str]) -> None:
    """ConfigurationError if a table called ``table`` (with ``columns``) is not a duetime store:
    asked before setup adds anything to it."""
    missing = sorted(FIRST_VERSION_COLUMNS - {c.lower() for c in columns})
    if missing:
        raise ConfigurationError(
            f"Table {table!r} in {where} exists but is not a duetime store (it has no "
            f"{', '.join(missing)}: a table of another program with the same name?); give duetime "
            "another table with ?table=…."
        )


#: How long, in all, a set-up of a table in use tries for the moment it needs the table alone
#: (each try waits briefly, so that writers queued behind it are not held up) before it gives up.
SETUP_TRIES_FOR = 300.0


def change_in_use(
    change: Callable[[], object], held: Callable[[Exception], bool], table: str, where: str, each_try: str
) -> None:
    """Run a set-up's ``change`` of a table that may be in use, whose lock wait is bounded to
    ``each_try``: a change queued behind a long transaction holds up every writer that comes
    after it, so when it waited that long (``held`` says which error means so) it gives way and
    tries again, for :data:`SETUP_TRIES_FOR` seconds in all, then says why in one line."""
    deadline = time.monotonic() + SETUP_TRIES_FOR
    while True:
        try:
            change()
            return
        except Exception as error:
            if not held(error):
                raise
            if time.monotonic() > deadline:
                raise StoreNotReady(
                    f"could not change table {table!r} in {where}: other transactions held it for "
                    f"{SETUP_TRIES_FOR:.0f} s (each try waited at most {each_try}, so that writers "
                    "were not held up); run duetime setup again when they are done"
                ) from None
            time.sleep(0.2)


def _keeps_no_keys(store: object) -> ConfigurationError:
    return ConfigurationError(
        f"{type(store).__name__} keeps no API keys; duetime's own stores do (a store built on "
        "StoreRules implements _key_insert, _key_update and _key_records)."
    )


def _keeps_no_records(store: object) -> ConfigurationError:
    return ConfigurationError(
        f"{type(store).__name__} keeps no named records (webhook endpoints, flow-control limits and "
        "pauses); duetime's own stores do (a store built on StoreRules implements _record_insert, "
        "_record_update, _record_delete and _records)."
    )


def _keeps_no_limits(store: object) -> ConfigurationError:
    return ConfigurationError(
        f"{type(store).__name__} keeps no flow-control limits; duetime's own stores do (a store "
        "built on StoreRules implements the named records' primitives, _record_swap and _hold)."
    )


def _unknown_key(message: DelayedMessage, sealer: Sealer) -> bool:
    kid = sealed_with(message.headers) if PROBLEM_HEADER in message.headers else None
    return kid is not None and kid not in sealer.keyring.keys


def closed() -> StoreNotReady:
    return StoreNotReady("The store is closed (it, or the client holding it, was closed); open a new one.")


def not_initialized() -> StoreNotReady:
    return StoreNotReady("The store is not initialized: call initialize(endpoint, mode) first.")


def micros_row(m: DelayedMessage) -> tuple[str, str, int, str, bytes, int, str | None]:
    """A message as the stores that keep due times as µs since 1970 insert it (SQLite, MariaDB)."""
    return (
        m.message_id,
        m.destination,
        to_micros(m.due_at),
        dump_headers(m.headers),
        m.body,
        m.failure_count,
        m.group,
    )


def load_headers(text: str | bytes) -> dict[str, str]:
    value = json.loads(text)
    if type(value) is not dict:  # duetime writes str -> str objects only
        raise ValueError("stored headers are not a JSON object")
    return value


def table_name(endpoint: str, override: str | None) -> str:
    """``<endpoint>.delayed`` (NServiceBus's naming) unless the URL's ``table=`` names one."""
    return override or f"{check_name('endpoint', endpoint)}.delayed"


def claim_timeout_option(options: Mapping[str, str], default: timedelta | None = None) -> timedelta:
    """The lease a claim holds: the URL's ``claim_timeout`` if it has one, else the settings'
    (``DUETIME_CLAIM_TIMEOUT``), else 30 s."""
    fallback = (default or DEFAULT_CLAIM_TIMEOUT).total_seconds()
    return timedelta(seconds=number_option(options, "claim_timeout", fallback))


def sql_filters(
    query: ListQuery, mark: str, to_db: Any = lambda moment: moment, *, row_values: bool = False
) -> tuple[str, dict[str, Any]]:
    """The WHERE clause and parameters of a listing, for any SQL store.

    ``mark`` formats a parameter name for the driver (``":{}"`` or ``"%({})s"``); ``to_db`` turns a
    datetime into the column's type (microseconds for SQLite and MariaDB). Ordered by
    ``(due_at, message_id)``, so the cursor is the last row's pair. ``row_values``: the database
    reads ``(due_at, message_id) > (d, i)`` as a range of its ``(due_at, message_id)`` index
    (PostgreSQL, SQLite); MariaDB does not, and gets the same range written as two.
    """
    where: list[str] = ["1 = 1"]
    params: dict[str, Any] = {}
    if query.min_failures:  # only when asked: a condition on every row's own column
        where.append(f"failure_count >= {mark.format('min_failures')}")
        params["min_failures"] = query.min_failures
    if query.destination is not None:
        where.append(f"destination = {mark.format('destination')}")
        params["destination"] = query.destination
    if query.group is not None:
        where.append(f"group_key = {mark.format('group')}")
        params["group"] = query.group
    if query.due_before is not None:
        where.append(f"due_at < {mark.format('due_before')}")
        params["due_before"] = to_db(query.due_before)
    if query.due_after is not None:
        where.append(f"due_at >= {mark.format('due_after')}")
        params["due_after"] = to_db(query.due_after)
    if query.after is not None:
        # (due_at, message_id) > (d, i) as a range of the (due_at, message_id) index, where a page
        # starts at its cursor: a range of due_at alone read every row of the cursor's due time
        # before it (a million messages due at one moment, as a bulk schedule stores them, were
        # paged through in quadratic time), and MariaDB reads no row comparison as a range (a
        # page 25 days into a million messages read every row before it, 63 s)
        due, ident = mark.format("after_due"), mark.format("after_id")
        where.append(
            f"(due_at, message_id) > ({due}, {ident})"
            if row_values
            else f"(due_at > {due} OR (due_at = {due} AND message_id > {ident}))"
        )
        params["after_due"], params["after_id"] = to_db(query.after[0]), query.after[1]
    return " AND ".join(where), params


def matches(query: ListQuery, message: DelayedMessage) -> bool:
    """The same filter as :func:`sql_filters`, for stores that filter in Python."""
    return (
        message.failure_count >= query.min_failures
        and (query.destination is None or message.destination == query.destination)
        and (query.group is None or message.group == query.group)
        and (query.due_before is None or message.due_at < query.due_before)
        and (query.due_after is None or message.due_at >= query.due_after)
        and (query.after is None or (message.due_at, message.message_id) > query.after)
    )


def by_due(messages: Sequence[DelayedMessage]) -> list[DelayedMessage]:
    return sorted(messages, key=lambda m: (m.due_at, m.message_id))


class StoreRules(ScheduleRules, Closing, ABC):
    """A blocking delayed message store: the contract's rules here, the storage in the primitives.

    Thread-safe as long as the primitives are. ``clock`` is asked for "now" where the contract needs
    it (the in-flight rule), so tests can move time.
    """

    #: Whether a dispatcher may claim the next batch while the last one is being sent. A store
    #: with one writer at a time (SQLite) says False: the claim would only wait for the writer.
    parallel_claims = True

    def __init__(
        self, *, claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT, clock: Clock | None = None
    ) -> None:
        self.claim_timeout = claim_timeout
        self.clock: Clock = clock or SystemClock()
        self.endpoint: str | None = None
        #: When :meth:`beat` last removed long-gone dispatchers' records.
        self._pruned_at: datetime | None = None
        #: Single stores from many threads at once share a commit (:mod:`._shared_commit`).
        self._shared = SharedCommits(self.store_many)
        #: The flow-control state this store last saw of each bucket (:meth:`_swapping`).
        self._seen: dict[tuple[str, str], str | None] = {}
        #: A sealer given to this store (tests, a program of its own); else the environment's.
        self._sealer: Sealer | None = None
        self._sealer_given = False

    # --- what a backend supplies -----------------------------------------------------------
    @abstractmethod
    def _create(self, endpoint: str) -> None:
        """Create the endpoint's tables or keys and record SCHEMA_VERSION; idempotent, and safe
        when several processes do it at once."""

    @abstractmethod
    def _schema_version(self, endpoint: str) -> int | None:
        """The version recorded by ``_create``, or None if nothing was set up."""

    @abstractmethod
    def _location(self, endpoint: str) -> str:
        """Where the endpoint's messages live, in words, for errors (``table 'x' in file.db``)."""

    def _bind(self, endpoint: str) -> None:
        """Prepare per-endpoint names (queries with the table name in them); nothing by default."""

    @abstractmethod
    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        """All or nothing; raise :class:`Duplicate` when an id is already stored. A backend with
        cross-process wake-ups announces the earliest due time here (in the same transaction
        where it can), as :meth:`_announce` does for a reschedule."""

    @abstractmethod
    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        """Mark up to ``limit`` unclaimed (or expired-claim) messages due at ``at`` as claimed
        until ``until``, oldest first, so no other caller receives them."""

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        """:meth:`_claim`, and the next due time left once claimed where the store reads it in the
        same call (a statement or script of its own); None here: the dispatcher asks apart."""
        return self._claim(at, until, limit), None

    @abstractmethod
    def _next_due(self) -> datetime | None:
        """The earliest moment something can be claimed: an unclaimed due time or a claim's end."""

    def _next_due_after_move(self) -> NextDue | None:
        """The next due time read at the end of a move, on the move's own thread (see
        :class:`MoveOutcome`); None when the read fails: the move has committed and stands, and
        the dispatcher asks for itself."""
        try:
            return NextDue(self._next_due())
        except Exception:
            return None

    @abstractmethod
    def _delete(self, message_ids: Sequence[str]) -> int: ...

    @abstractmethod
    def _fail(self, message_id: str) -> bool:
        """Count one failure and release the claim."""

    @abstractmethod
    def _release(self, message_ids: Sequence[str]) -> int: ...

    @abstractmethod
    def _get(self, message_id: str) -> DelayedMessage | None: ...

    def _stored_ids(self, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` are stored (claimed or not); a backend with a query for many
        ids at once overrides this look, one ``_get`` per id."""
        return {i for i in message_ids if self._get(i) is not None}

    @abstractmethod
    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        """Delete the message only if no live claim holds it."""

    @abstractmethod
    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        """Delete the group's messages no live claim holds, at most ``limit`` of them (None: all),
        in one transaction; how many."""

    def _count_group(self, group: str) -> int:
        """How many messages ``group`` holds. This default reads the group's pages; a store with
        an index on the group counts there."""
        found, after = 0, None
        while True:
            page = self._select(ListQuery(group=group, after=after, limit=GROUP_PAGE), GROUP_PAGE)
            found += len(page)
            if len(page) < GROUP_PAGE:
                return found
            after = (page[-1].due_at, page[-1].message_id)

    @abstractmethod
    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        """Move the message's due time only if no live claim holds it."""

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        """Put ``message`` (destination, due time, headers, body, group, failure count) in place of
        the stored one with its id, in one change, only if it is stored and no claim holds it, not
        even one that lapsed (its dispatcher may still be sending, and settling would then remove
        the new content); whether it did. The rules announce the new due time."""
        raise ConfigurationError(
            f"{type(self).__name__} cannot replace a waiting message; duetime's own stores can (a "
            "store built on StoreRules implements _replace_unclaimed)."
        )

    @abstractmethod
    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        """Up to ``limit`` messages matching ``query``, ordered by ``(due_at, message_id)``."""

    @abstractmethod
    def _count(self, at: datetime) -> StoreCounts:
        """Counts at ``at``; ``next_due`` is filled in by the rules."""

    def _count_due(self, at: datetime) -> int:
        """How many are due at ``at``; a store with a cheaper query than all of ``_count`` (an
        index range) overrides it."""
        return self._count(at).due

    def _server_time(self) -> datetime | None:
        """The store server's own time (UTC), for a store that has a server; None otherwise."""
        return None

    @abstractmethod
    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        """Write (insert or replace) a dispatcher's presence record, ``info`` its JSON."""

    @abstractmethod
    def _presences(self, endpoint: str) -> list[str]:
        """Every presence record of the endpoint, as written."""

    @abstractmethod
    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        """Delete the endpoint's presence records not refreshed since ``seen_before``."""

    def _announce(self, due_at: datetime) -> None:
        """Tell sleeping dispatchers in other processes that something is due at ``due_at``
        (PostgreSQL's NOTIFY, a Redis publish); nothing where they look by themselves."""

    def _close(self) -> None:
        """Release connections."""

    # --- the rules ---------------------------------------------------------------------------
    def setup_infrastructure(self, endpoint: str) -> None:
        if self._closed:
            raise closed()
        self._create(check_name("endpoint", endpoint))

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        if self._closed:
            raise closed()
        TransactionMode(mode)
        version = self._schema_version(check_name("endpoint", endpoint))
        if version is None:
            raise StoreNotReady(
                f"No duetime store for endpoint {endpoint!r} ({self._location(endpoint)}): "
                "run `duetime setup` or call setup_infrastructure() first."
            )
        if version < SCHEMA_VERSION:
            raise StoreNotReady(
                f"The store for endpoint {endpoint!r} ({self._location(endpoint)}) was set up by an older "
                f"duetime (schema version {version}); run `duetime setup` to upgrade it in place "
                "(every stored message stays)."
            )
        if version > SCHEMA_VERSION:
            raise ConfigurationError(
                f"The store for endpoint {endpoint!r} ({self._location(endpoint)}) has schema version "
                f"{version}, newer than this duetime understands ({SCHEMA_VERSION}); upgrade duetime."
            )
        self._bind(endpoint)
        self.endpoint = endpoint

    def _ready(self) -> str:
        if self._closed:
            raise closed()
        if self.endpoint is None:
            raise not_initialized()
        return self.endpoint

    #: Set by :meth:`close`: a call afterwards is told so, not the driver's own words about a
    #: closed connection or pool (or, on Redis, a silent reconnect).
    _closed = False

    #: A SQL store's named queries with the endpoint's table in them, set by its ``_bind``.
    _q: dict[str, str] | None = None

    @property
    def q(self) -> dict[str, str]:
        """The bound named queries; StoreNotReady before ``initialize``."""
        if self._q is None:
            raise not_initialized()
        return self._q

    def store(self, message: DelayedMessage) -> None:
        """Store one message; returns once it is durable. Calls from several threads at once
        share a transaction (each still gets its own answer)."""
        self._shared.store(check_storable(message))

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        self._ready()
        if not messages:
            return 0
        seen: set[str] = set()
        for m in messages:
            check_storable(m)
            if m.message_id in seen:
                raise duplicate_id(m.message_id)
            seen.add(m.message_id)
        try:
            self._insert(self._sealed(messages))
        except Duplicate as error:
            raise duplicate_id(error.message_id or self._first_stored(messages)) from None
        return len(messages)

    # --- encryption at rest (duetime.encryption): every message in and out of the store goes
    # through these two, so no reader or writer of any duetime store can forget it -------------
    @property
    def sealer(self) -> Sealer | None:
        """What seals messages on the way in and opens them on the way out: the keyring
        ``DUETIME_ENCRYPTION_KEYS`` names (taken up again when the file changes), or one given."""
        return self._sealer if self._sealer_given else sealer_from_environment()

    @sealer.setter
    def sealer(self, value: Sealer | None) -> None:
        self._sealer, self._sealer_given = value, True

    def _sealed(self, messages: Sequence[DelayedMessage]) -> Sequence[DelayedMessage]:
        sealer = self.sealer
        return messages if sealer is None else [sealer.seal(m) for m in messages]

    def _opened(self, messages: builtins.list[DelayedMessage]) -> builtins.list[DelayedMessage]:
        sealer = self.sealer
        if sealer is None:
            return messages
        opened = [sealer.opened(m) for m in messages]
        if not self._sealer_given and any(_unknown_key(m, sealer) for m in opened):
            # sealed with a key this process has not read yet (another wrote it a moment ago)
            fresh = sealer_from_environment(now=True)
            if fresh is not None and fresh is not sealer:
                opened = [fresh.opened(m) for m in messages]
        return opened

    def store_new(self, messages: Sequence[DelayedMessage]) -> int:
        """Store, together, those of ``messages`` whose id is not stored yet (the first of a
        repeated id); how many were new. Resuming work that stopped half-way (a load, a retry of
        the error queue) costs one look and one insert a batch, not a round trip a message."""
        self._ready()
        first: dict[str, DelayedMessage] = {}
        for m in messages:
            first.setdefault(check_storable(m).message_id, m)
        fresh = list(self._sealed(list(first.values())))
        for _ in range(NEW_ONLY_TRIES):
            there = self._stored_ids([m.message_id for m in fresh])
            fresh = [m for m in fresh if m.message_id not in there]
            if not fresh:
                return 0
            try:
                self._insert(fresh)
                return len(fresh)
            except Duplicate:
                continue  # stored by another writer since the look: look again
        return sum(self._store_if_new(m) for m in fresh)

    def put(self, message: DelayedMessage, if_exists: IfExists) -> Put:
        """Store ``message``, doing ``if_exists`` when a message with its id is stored (see
        :class:`~duetime.interfaces.IfExists`).

        A replace changes the stored row first (the common case of a debounce: one statement);
        when no row changed, it stores the message new; when that finds the id stored after all, a
        second change either applies (another producer stored it a moment ago) or the message is
        held by a dispatcher, and the caller is told it was not replaced. So a replace that
        answers "replaced" never lets the old content go too."""
        how = IfExists.of(if_exists)
        check_storable(message)
        self._ready()
        if how is IfExists.REFUSE:
            self.store(message)
            return Put(message, "stored")
        given, message = message, self._sealed([message])[0]
        replacing = how is not IfExists.KEEP
        for _ in range(NEW_ONLY_TRIES):
            if replacing and self._replaced(message):
                return Put(given, "replaced")
            if replacing and self._moved_ahead(message.message_id, self.clock.now()):
                raise not_replaced(message.message_id)
            try:
                self._insert([message])
                return Put(given, "stored")
            except Duplicate:
                pass
            if replacing:
                if self._replaced(message):
                    return Put(given, "replaced")
                raise not_replaced(message.message_id)
            stored = self._get(message.message_id)
            if stored is not None:
                return Put(self._opened([stored])[0], "kept")
            # cancelled or forwarded between the insert and the look: store it again
        raise duplicate_id(message.message_id)

    def _replaced(self, message: DelayedMessage) -> bool:
        if not self._replace_unclaimed(message, self.clock.now()):
            return False
        self._announce(message.due_at)
        return True

    def _store_if_new(self, message: DelayedMessage) -> int:
        try:
            self._insert([message])
            return 1
        except Duplicate:
            return 0

    def _first_stored(self, messages: Sequence[DelayedMessage]) -> str | None:
        return next((m.message_id for m in messages if self._get(m.message_id) is not None), None)

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        at = check_due_time(at, "at")
        self._ready()
        return self._opened(by_due(self._claim(at, at + self.claim_timeout, limit)))

    def fetch_due_and_next(self, at: datetime, limit: int) -> Claimed:
        at = check_due_time(at, "at")
        self._ready()
        messages, next_due = self._claim_and_next(at, at + self.claim_timeout, limit)
        return Claimed(self._opened(by_due(messages)), next_due if len(messages) < limit else None)

    def next_due(self) -> datetime | None:
        self._ready()
        return self._next_due()

    def remove(self, message_id: str) -> bool:
        return self.remove_many([message_id]) == 1

    def remove_many(self, message_ids: Sequence[str]) -> int:
        self._ready()
        return self._delete(list(message_ids)) if message_ids else 0

    def increment_failure_count(self, message_id: str) -> bool:
        self._ready()
        return self._fail(message_id)

    def retry_later(self, message_id: str, due_at: datetime) -> bool:
        """Count one failure, release the claim and make the message due at ``due_at``, in one
        change: a dispatcher claiming ahead never sees it released but still due now."""
        self._ready()
        return self._fail_until(message_id, check_due_time(due_at))

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        """``_fail`` and a new due time in one change. By default the two in turn (a store whose
        dispatchers claim ahead implements it as one)."""
        return self._fail(message_id) and self._reschedule_unclaimed(message_id, due_at, self.clock.now())

    def release(self, message_ids: Sequence[str]) -> int:
        self._ready()
        return self._release(list(message_ids)) if message_ids else 0

    def get(self, message_id: str) -> DelayedMessage | None:
        self._ready()
        found = self._get(message_id)
        return None if found is None else self._opened([found])[0]

    def cancel(self, message_id: str) -> bool:
        """Cancel a stored message; MessageInFlight while a dispatcher holds it."""
        self._ready()
        if self._delete_unclaimed(message_id, self.clock.now()):
            return True
        return self._refuse_in_flight(message_id)

    def cancel_group(self, group: str, limit: int | None = None) -> int:
        """Cancel every message of ``group`` no dispatcher holds, or at most ``limit`` of them (a
        large group in batches, each whole); those in flight are forwarded (as a single
        :meth:`cancel` would refuse them). Returns how many were cancelled."""
        check_text("group", group, MAX_GROUP_LENGTH)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigurationError(f"limit must be a whole number of at least 1, got {limit!r}.")
        self._ready()
        return self._delete_group_unclaimed(group, self.clock.now(), limit)

    def count_group(self, group: str) -> int:
        """How many stored messages ``group`` holds (in flight or not)."""
        check_text("group", group, MAX_GROUP_LENGTH)
        self._ready()
        return self._count_group(group)

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        """Move a stored message's due time; MessageInFlight while a dispatcher holds it."""
        due_at = check_due_time(due_at)
        self._ready()
        if self._reschedule_unclaimed(message_id, due_at, self.clock.now()):
            self._announce(due_at)
            return True
        return self._refuse_in_flight(message_id)

    def _refuse_in_flight(self, message_id: str) -> bool:
        """The in-flight rule: a change that did not apply to a message that exists means a
        dispatcher is forwarding it, as it is when a move made ahead put it in its queue, not
        visible yet; to one that does not exist, it is gone (False)."""
        if self._get(message_id) is not None or self._moved_ahead(message_id, self.clock.now()):
            raise in_flight(message_id)
        return False

    def _moved_ahead(self, message_id: str, now: datetime) -> bool:
        """Whether an exactly-once move made ahead of the due time put ``message_id`` in a queue
        of the store's own, where no receiver sees it before ``now`` passes its due time (see
        :meth:`~duetime.interfaces.TransactionalStore.move_due`): it is being delivered, and a
        change to it is refused. A store that never moves ahead: never."""
        return False

    def beat(self, info: DispatcherInfo) -> None:
        """Record that a dispatcher is there (see :mod:`duetime.live_dispatchers`); forget long-gone ones."""
        endpoint = self._ready()
        self._beat(endpoint, info.dispatcher_id, info.last_seen, info.to_json())
        # Pruning is a write of its own (a commit on SQLite, which wakes every watcher of the
        # file): once per process and then hourly is plenty for records kept a day.
        if self._pruned_at is None or info.last_seen - self._pruned_at >= PRUNE_EVERY:
            self._forget(endpoint, info.last_seen - FORGET_AFTER)
            self._pruned_at = info.last_seen

    def dispatchers(self) -> list[DispatcherInfo]:
        """The endpoint's dispatchers, newest first, live, gone and stopped alike."""
        found = [DispatcherInfo.from_json(text) for text in self._presences(self._ready())]
        return sorted(found, key=lambda d: d.started_at, reverse=True)

    def add_api_key(self, key: ApiKey) -> None:
        """Keep a new key; ApiKeyExists while a key of that name is in use (a revoked one's name
        may be taken again)."""
        endpoint = self._ready()
        if self._key_insert(endpoint, key.name, key.to_json()):
            return
        old = next((k for k in self.api_keys() if k.name == key.name), None)
        if old is not None and not old.active and self._key_update(endpoint, key.name, key.to_json()):
            return
        raise ApiKeyExists(f"an API key named {key.name!r} exists; revoke it first, or choose another name.")

    def api_keys(self) -> builtins.list[ApiKey]:
        """Every key of the endpoint, revoked ones too, by name."""
        return [ApiKey.from_json(text) for text in self._key_records(self._ready())]

    def revoke_api_key(self, name: str, at: datetime) -> bool:
        """Refuse the key from now on; False if there is no key of that name in use."""
        endpoint = self._ready()
        key = next((k for k in self.api_keys() if k.name == name and k.active), None)
        return key is not None and self._key_update(endpoint, name, key.revoked(at).to_json())

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        """Keep a key's record unless ``name`` has one; whether it was kept."""
        raise _keeps_no_keys(self)

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        """Replace the record of ``name``; False if it has none."""
        raise _keeps_no_keys(self)

    def _key_records(self, endpoint: str) -> builtins.list[str]:
        """Every key record of the endpoint."""
        raise _keeps_no_keys(self)

    def add_webhook(self, webhook: WebhookEndpoint) -> None:
        """Keep a new webhook endpoint; WebhookExists if one has the name."""
        if not self._record_insert(self._ready(), WEBHOOKS, webhook.name, webhook.to_json()):
            raise WebhookExists(
                f"a webhook named {webhook.name!r} exists; remove it first, or choose another name."
            )

    def change_webhook(self, webhook: WebhookEndpoint) -> bool:
        """Put ``webhook`` in place of the one of its name; False if there is none."""
        return self._record_update(self._ready(), WEBHOOKS, webhook.name, webhook.to_json())

    def webhooks(self) -> builtins.list[WebhookEndpoint]:
        """Every webhook endpoint of the endpoint, by name."""
        return [WebhookEndpoint.from_json(text) for text in self._records(self._ready(), WEBHOOKS)]

    def remove_webhook(self, name: str) -> bool:
        """Forget the webhook and its secrets; False if there is none of that name."""
        return self._record_delete(self._ready(), WEBHOOKS, name)

    # The audit trail (duetime.audit): each entry a named record, named by its time and id, so
    # the names sort as the entries happened and a page is a range of names.
    def audit(self, entry: AuditEntry) -> None:
        """Keep ``entry`` in the endpoint's trail."""
        if not self._audit_insert(self._ready(), entry.key, entry.to_json()):
            raise ConfigurationError(f"the audit trail has an entry {entry.key} already")

    def audit_entries(self, query: AuditQuery) -> tuple[builtins.list[AuditEntry], str | None]:
        """A page of the trail (newest first unless the query says oldest first) and the next
        page's cursor."""
        endpoint = self._ready()
        return page_of(lambda *span: self._audit_range(endpoint, *span), query)

    def prune_audit(self, before: datetime) -> int:
        """Forget the entries from before ``before``; how many."""
        return self._audit_prune(self._ready(), key_at(before))

    def _audit_insert(self, endpoint: str, name: str, info: str) -> bool:
        """Keep an entry; False if its name is taken. A named record, unless a store keeps the
        trail's names in an index of their own (it overrides the three)."""
        return self._record_insert(endpoint, AUDIT, name, info)

    def _audit_range(
        self, endpoint: str, above: str, below: str, limit: int, oldest_first: bool
    ) -> builtins.list[str]:
        """The texts of the entries whose names lie between ``above`` and ``below``, in order.
        This reads every entry; a store that can read a range of names from an index overrides
        it (the SQL stores from the records' primary key, Redis from a sorted set)."""
        return in_range(self._records(endpoint, AUDIT), above, below, limit, oldest_first)

    def _audit_prune(self, endpoint: str, below: str) -> int:
        """Delete the entries whose names are below ``below``; how many. Overridden likewise."""
        old = [e.key for e in map(AuditEntry.from_json, self._records(endpoint, AUDIT)) if e.key < below]
        return sum(self._record_delete(endpoint, AUDIT, name) for name in old)

    # Flow control (duetime.limits): limits and pauses as named records, their shared state
    # changed by compare-and-set, and held messages hidden until their turn.
    def set_limit(self, limit: Limit) -> None:
        """Keep ``limit`` for its destination, in place of any it had."""
        endpoint, info = self._ready(), limit.to_json()
        name = record_name(limit.destination)
        if not self._record_insert(endpoint, LIMITS, name, info):
            self._record_update(endpoint, LIMITS, name, info)

    def limits(self) -> builtins.list[Limit]:
        return [Limit.from_json(text) for text in self._records(self._ready(), LIMITS)]

    def remove_limit(self, destination: str) -> bool:
        return self._record_delete(self._ready(), LIMITS, record_name(destination))

    def pause_destination(self, pause: Pause) -> bool:
        """Pause a destination; False (and the first pause kept, with who made it) if it is paused."""
        return self._record_insert(self._ready(), PAUSES, record_name(pause.destination), pause.to_json())

    def resume_destination(self, destination: str) -> bool:
        """Resume a destination (every dispatcher sees it at its next look at the limits, and
        gives back what it held for it: :meth:`release_held`)."""
        return self._record_delete(self._ready(), PAUSES, record_name(destination))

    def paused(self) -> builtins.list[Pause]:
        return [Pause.from_json(text) for text in self._records(self._ready(), PAUSES)]

    def take_rate(self, bucket: str, rate: Rate, wanted: int, now: datetime) -> RateGrant:
        """Up to ``wanted`` turns of ``rate`` from the bucket every dispatcher shares."""
        now = check_due_time(now, "now")
        return self._swapping(RATE_STATE, bucket, lambda state: _take_rate(state, rate, wanted, now))

    def take_slots(self, bucket: str, holder: str, wanted: int, most: int, now: datetime) -> int:
        """Up to ``wanted`` of the ``most`` concurrency slots of the bucket, for ``holder``."""
        return self._swapping(SLOT_STATE, bucket, lambda state: _take_slots(state, holder, wanted, most, now))

    def give_slots(self, bucket: str, holder: str, count: int, now: datetime) -> None:
        """Give back ``count`` slots ``holder`` took."""
        self._swapping(SLOT_STATE, bucket, lambda state: (None, _give_slots(state, holder, count, now)))

    def hold(self, until: Mapping[str, datetime]) -> int:
        """Give claimed messages back, each hidden from every claim until its time (a limit's
        turn): due time, failure count and content unchanged; a cancel, reschedule or replace
        reaches them meanwhile. How many were held."""
        self._ready()
        return self._hold({i: check_due_time(t, "until") for i, t in until.items()}) if until else 0

    def release_held(self) -> int:
        """Every held message claimable at once: a limit or a pause changed, and what waited for
        the old one takes its turn by the new."""
        self._ready()
        return self._release_held()

    # --- encryption at rest: rotation (duetime.encryption) ---------------------------------------
    def _need_sealer(self) -> Sealer:
        if self.sealer is None:
            raise ConfigurationError(
                f"no keyring: set {ENCRYPTION_KEYS_VARIABLE} to the keyring file (`duetime keys new FILE` makes one)."
            )
        return self.sealer

    def reseal(
        self, after: tuple[datetime, str] | None, limit: int = RESEAL_BATCH, *, look_only: bool = False
    ) -> Resealed:
        """One step of a rotation: of the next ``limit`` messages in due order after ``after``,
        each not sealed with the primary key (plaintext ones too) is sealed again with it, in one
        change of the store's that skips a message a dispatcher holds or that changed since it was
        read (the next pass takes it). Run again from the start, it does only what is left."""
        sealer = None if look_only else self._need_sealer()
        self._ready()
        rows = self._select(ListQuery(limit=limit, after=after), limit + 1)
        page = rows[:limit]
        todo: builtins.list[tuple[DelayedMessage, DelayedMessage]] = []
        unreadable = 0
        for m in page:
            if sealer is None or not sealer.needs_sealing(m):
                continue
            try:
                todo.append((m, sealer.reseal(m)))
            except Unreadable:
                unreadable += 1
        changed = self._reseal(todo) if todo else 0
        keys = Counter(sealed_with(m.headers) or "" for m in page)
        more = len(rows) > limit and bool(page)
        return Resealed(
            len(page),
            changed,
            len(todo) - changed,
            unreadable,
            dict(keys),
            (page[-1].due_at, page[-1].message_id) if more else None,
        )

    def reseal_schedules(self, *, look_only: bool = False) -> dict[str, int]:
        """Seal every recurring schedule again with the primary key (a compare-and-set each, as
        every change of a schedule is); how many are sealed with each key after it."""
        sealer = None if look_only else self._need_sealer()
        self._ready()
        keys: Counter[str] = Counter()
        after = ""
        while page := self._schedule_page(after, 500):
            after = page[-1].schedule_id
            for row in page:
                kid = sealed_with(Schedule.from_row(row).headers)
                if (
                    sealer is not None
                    and kid != sealer.keyring.primary
                    and kid in (None, *sealer.keyring.keys)
                ):
                    self._set(row.schedule_id, lambda s: s, self._now(None))
                    kid = sealer.keyring.primary
                keys[kid or ""] += 1
        return dict(keys)

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        """In one change where the store has them: for each (as read, sealed again), put the new
        body and headers in place if no claim holds the message and it still holds what was read
        (body and headers); how many changed."""
        raise ConfigurationError(
            f"{type(self).__name__} cannot seal stored messages again (it has no _reseal)."
        )

    def _swapping(self, kind: str, name: str, change: Callable[[str | None], tuple[T, str]]) -> T:
        """Apply ``change`` (the state's text, None when there is none, to what it answers and
        the new text) by compare-and-set, again on the value another dispatcher put there
        first, until it holds. Starts from the value this store saw last, so a lone dispatcher
        makes one call a change."""
        endpoint = self._ready()
        seen = self._seen.get((kind, name))
        for _ in range(SWAP_TRIES):
            answer, new = change(seen)
            if new == seen:
                return answer
            done, current = self._record_swap(endpoint, kind, name, seen, new)
            if done:
                if len(self._seen) >= SEEN_MOST:
                    self._seen.clear()
                self._seen[(kind, name)] = new
                return answer
            seen = current
        raise StoreNotReady(
            f"flow-control state {kind}:{name} kept changing under {SWAP_TRIES} tries in a row; "
            "the store is overloaded, try again."
        )

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        """Set the record to ``new`` if it holds ``old`` (None: if there is none), in one atomic
        step; whether it was set, and what the record holds now when it was not (None: none)."""
        raise _keeps_no_limits(self)

    def _hold(self, until: Mapping[str, datetime]) -> int:
        """Mark each message held (:data:`HOLD_TOKEN`) until its time; how many there were."""
        raise _keeps_no_limits(self)

    def _release_held(self) -> int:
        """Make every held message claimable at once; how many there were."""
        raise _keeps_no_limits(self)

    # Named records (webhook endpoints): one record per (endpoint, kind, name), a JSON text.
    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        """Keep a record unless ``name`` has one of ``kind``; whether it was kept."""
        raise _keeps_no_records(self)

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        """Replace the record; False if there is none."""
        raise _keeps_no_records(self)

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        """Delete the record; False if there was none."""
        raise _keeps_no_records(self)

    def _records(self, endpoint: str, kind: str) -> builtins.list[str]:
        """Every record of ``kind``, by name."""
        raise _keeps_no_records(self)

    def list(self, query: ListQuery) -> Page:
        """One page, ordered by due time then id; pass ``next_cursor`` back as ``after``."""
        for name, value in (("due_before", query.due_before), ("due_after", query.due_after)):
            if value is not None:
                check_due_time(value, name)
        self._ready()
        rows = self._select(query, query.limit + 1)
        page = rows[: query.limit]
        more = len(rows) > query.limit and bool(page)
        return Page(self._opened(page), (page[-1].due_at, page[-1].message_id) if more else None)

    def counts(self, at: datetime) -> StoreCounts:
        at = check_due_time(at, "at")
        self._ready()
        return replace(self._summed_up(self._count(at)), next_due=self._next_due())

    def _summed_up(self, counts: StoreCounts) -> StoreCounts:
        """Per destination, the DESTINATIONS_SHOWN holding the most, and the rest said in two
        numbers (how many more destinations, holding how many): never cut without a word."""
        by = counts.by_destination
        if len(by) > DESTINATIONS_SHOWN:  # a store that counted (or sampled) every destination
            ranked = sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))
            rest = ranked[DESTINATIONS_SHOWN:]
            return replace(
                counts,
                by_destination=dict(ranked[:DESTINATIONS_SHOWN]),
                more_destinations=len(rest),
                more_messages=sum(n for _, n in rest),
            )
        if counts.estimated:  # figures the store made up whole from its statistics or a sample
            return counts
        shown = sum(by.values())
        if len(by) == DESTINATIONS_SHOWN and shown < counts.total:  # a query that stopped there
            return replace(
                counts,
                more_destinations=max(self._count_destinations() - DESTINATIONS_SHOWN, 1),
                more_messages=counts.total - shown,
            )
        return counts

    def _count_destinations(self) -> int:
        """How many destinations hold messages, asked only when their list came back full; a
        store that cannot say answers "at least one more"."""
        return DESTINATIONS_SHOWN + 1

    def server_time(self) -> datetime | None:
        """What time the store's server says it is (None: no server, the host's clock rules).
        Dispatchers compare due times and claims with it, so a host clock that is wrong never
        delivers early and never takes another dispatcher's claim."""
        return self._server_time()

    def count_due(self, at: datetime) -> int:
        at = check_due_time(at, "at")
        self._ready()
        return self._count_due(at)

    def close(self) -> None:
        self._closed = True
        self._close()
