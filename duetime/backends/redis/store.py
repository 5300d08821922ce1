"""The Redis store (redis-py): a sorted set scored by the time each message becomes claimable.

An unclaimed message's score is its due time; claiming (a Lua script, atomic) re-scores it to its
lease expiry, so a crashed dispatcher's claims come back by themselves and the lowest score is
always the next moment anything can be claimed. Storing publishes the due time on a channel that
sleeping dispatchers subscribe to (the counterpart of PostgreSQL's NOTIFY).

Durability is Redis's: run it with ``appendonly yes`` (and ``appendfsync always`` to lose nothing
on a power cut; ``everysec`` risks the last second). A Redis that keeps nothing on disk loses
every stored message when it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import redis

from duetime.audit import AUDIT
from duetime.backends._keepalive import socket_options
from duetime.backends._on_a_thread import AsyncStoreBridge, Subscribers
from duetime.backends._redis_database import (
    NO_WAIT,
    Replication,
    aclose_redis,
    async_redis_client,
    check_database,
    close_redis,
    no_such_database,
    not_redis,
    redis_client,
)
from duetime.backends._schedules import Planned
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    SCHEMA_VERSION,
    Duplicate,
    StoreRules,
    claim_timeout_option,
    matches,
)
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError, NotReplicated, StorageFull, connection_failed, no_answer
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact, url_options
from duetime.interfaces import ListQuery, NextDue, StoreCounts
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import DelayedMessage
from duetime.recurring.schedule import ScheduleRow

log = logging.getLogger("duetime.redis")
#: Seconds between two looks at the server's maxmemory-policy while the store is in use.
POLICY_CHECK_SECONDS = 30.0


def load_script(name: str) -> str:
    """A Lua script of this folder; a line ``-- include: other.lua`` is that file's text (a
    function the script calls), so what several scripts do is written once."""
    text = resources.files("duetime.backends.redis").joinpath(name).read_text(encoding="utf-8")
    return "\n".join(
        load_script(line.removeprefix(INCLUDE).strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines()
    )


#: The line that puts another script's text in its place (see ``_script``).
INCLUDE = "-- include: "


#: Messages per destination are counted one by one up to DESTINATIONS_COUNTED messages; past
#: that, DESTINATION_SAMPLES calls each pick DESTINATIONS_READ at random and the counts are
#: estimated from them (Redis keeps no statistics of its own). Read on the server, the start of
#: each message only, in small calls: Redis does nothing else while a call runs, and a claim
#: waiting behind a call of 1,000 (7 ms) made the due messages' p99 lateness 2.5 times an empty
#: store's. 100 take it under 1 ms.
DESTINATIONS_COUNTED = 1_000
DESTINATIONS_READ = 100
DESTINATION_SAMPLES = 50
#: Seconds a sample of the messages per destination is used for (scaled to the total).
SHARES_KEPT_FOR = 60.0
#: Messages a listing by destination or group looks at in one call (about 2 ms of Redis).
PICK_LOOKS_AT = 200
#: A group of up to this many is listed from its members, read whole and sorted here; a larger
#: one by walking the due times (a group of 100,000 read whole took 0.7 s a page).
GROUP_READ_WHOLE = 10_000


def sampled(counts: StoreCounts, read: Mapping[str, int]) -> StoreCounts:
    """``counts`` with each destination's share of a random sample ``read`` scaled to the total:
    estimates, said as such ("about"). A destination too small to be picked is in no figure."""
    picked = sum(read.values()) or 1
    by = {d: round(n * counts.total / picked) for d, n in read.items()}
    return replace(counts, by_destination=by, estimated=True)


def _payload(m: DelayedMessage) -> bytes:
    return payload_of(m.destination, m.headers, m.group, m.body)


def payload_of(destination: str, headers: Mapping[str, str], group: str | None, body: bytes) -> bytes:
    """How the store keeps a message's all but its id, due time and failures: one line of JSON
    (destination, headers, group), a newline, the body as it is. The store and its bulk writes."""
    meta: dict[str, Any] = {"d": destination, "h": dict(headers)}
    if group is not None:
        meta["g"] = group
    head = json.dumps(meta, separators=(",", ":"), ensure_ascii=False)
    return head.encode() + b"\n" + body


def _message(message_id: str, payload: bytes, failures: Any, due: Any) -> DelayedMessage:
    head, _, body = payload.partition(b"\n")
    meta = json.loads(head)
    return DelayedMessage.from_store(
        message_id, meta["d"], from_micros(int(due)), body, meta["h"], int(failures), meta.get("g")
    )


#: An audit entry kept with its name in the trail's sorted set, in one step.
_AUDIT_INSERT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
"""
#: At most a thousand of the entries named below ARGV[1] forgotten, in one step; how many (a
#: prune of a long trail is many short steps, never one that holds the server up).
_AUDIT_PRUNE = """
local names = redis.call('ZRANGEBYLEX', KEYS[2], '-', ARGV[1], 'LIMIT', 0, 1000)
if #names == 0 then return 0 end
redis.call('HDEL', KEYS[1], unpack(names))
redis.call('ZREM', KEYS[2], unpack(names))
return #names
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _micros(value: datetime | None) -> int | str:
    return "" if value is None else to_micros(value)


class SyncRedisStore(StoreRules):
    """Blocking Redis store; redis-py's client is thread-safe (a connection pool)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "duetime:",
        claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT,
        replication: Replication = NO_WAIT,
    ) -> None:
        super().__init__(claim_timeout=claim_timeout)
        self.url, self.prefix = check_database(url), prefix
        #: Stored messages wait for this many replicas before a producer is told they are stored.
        self.replication = replication
        # Any: redis-py types every answer as one union of its sync and async forms (bytes | str |
        # Awaitable ...); the sync client's real answers are used as such below.
        self.client: Any = redis_client(url, socket_keepalive=True, socket_keepalive_options=socket_options())
        self._claim_script = self.client.register_script(load_script("claim.lua"))
        self._store_script = self.client.register_script(load_script("store_many.lua"))
        self._change_script = self.client.register_script(load_script("change.lua"))
        self._replace_script = self.client.register_script(load_script("replace.lua"))
        self._reseal_script = self.client.register_script(_RESEAL)
        self._cancel_group_script = self.client.register_script(load_script("cancel_group.lua"))
        self._destinations_script = self.client.register_script(load_script("destinations.lua"))
        self._pick_script = self.client.register_script(load_script("pick.lua"))
        self._schedule_scripts = {
            name: self.client.register_script(load_script(f"schedule_{name}.lua"))
            for name in ("insert", "update", "delete")
        }
        self._policy_checked_at: float | None = None
        #: The last sample of messages per destination: (when it was taken, the counts).
        self._shares: tuple[float, dict[str, int]] | None = None

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> SyncRedisStore:
        plain, options = url_options(url, {"prefix", "claim_timeout", "wait", "wait_timeout"}, "Redis store")
        return cls(
            plain,
            prefix=options.get("prefix", "duetime:"),
            claim_timeout=claim_timeout_option(options, claim_timeout),
            replication=Replication.of(options),
        )

    def keys_for(self, endpoint: str) -> dict[str, str]:
        base = f"{self.prefix}{check_name('endpoint', endpoint)}:"
        names = ["ready", "payload", "claims", "failures", "due", "bydue", "groups"]
        names += ["schedules", "schedule_versions", "schedule_plans", "schedule_ids"]
        return {name: base + name for name in names} | {
            "schema": base + "schema",
            "channel": base + "wake",
            "dispatchers": base + "dispatchers",
            "api_keys": base + "api_keys",
            "records": base + "records",
        }

    @property
    def keys(self) -> dict[str, str]:
        return self.keys_for(self._ready())

    def _k(self, *names: str) -> list[str]:
        keys = self.keys
        return [keys[n] for n in names]

    # --- primitives -----------------------------------------------------------------------
    def _location(self, endpoint: str) -> str:
        return f"at {redact(self.url)}, prefix {self.prefix!r}"

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """redis-py connects at the first command: setting up or opening a store is where a Redis
        that does not answer, or refuses the password, is first met; say so in one line."""
        try:
            yield
        except redis.AuthenticationError as error:  # a kind of ConnectionError: first
            raise ConfigurationError(f"cannot connect to {redact(self.url)}: {error}") from None
        except redis.TimeoutError:
            where = urlsplit(self.url)
            said = f"{where.hostname}:{where.port or 6379}" if where.hostname else redact(self.url)
            raise connection_failed(redact(self.url), no_answer(said, None, "Redis")) from None
        except redis.ConnectionError as error:
            raise connection_failed(redact(self.url), error) from None
        except redis.exceptions.OutOfMemoryError:
            raise self.full() from None
        except redis.ResponseError as error:
            raise no_such_database(self.url, error) or error from None
        except redis.exceptions.InvalidResponse as error:
            raise not_redis(self.url, error) from None

    def check_eviction_policy(self) -> None:
        """ConfigurationError if the server may evict what the store keeps: under any
        ``maxmemory-policy`` but ``noeviction`` a full Redis drops keys without a word, after
        answering OK to their writes (``allkeys-*`` any key, ``volatile-*`` those with a time to
        live). Read from ``INFO`` (which managed services allow) when the store opens and again
        every :data:`POLICY_CHECK_SECONDS` while it is used: a policy switched under a running
        dispatcher fails its store calls with the reason, so its store breaker trips and says why."""
        now = time.monotonic()
        if self._policy_checked_at is not None and now - self._policy_checked_at < POLICY_CHECK_SECONDS:
            return
        with self._reaching():
            policy = _text(self.client.info("memory").get("maxmemory_policy", "")) or "noeviction"
        if policy != "noeviction":
            self._policy_checked_at = None
            raise ConfigurationError(
                f"Redis at {redact(self.url)} has maxmemory-policy {policy}: when full it evicts "
                "keys without a word, stored messages among them. Set maxmemory-policy noeviction "
                "(CONFIG SET maxmemory-policy noeviction, and in redis.conf) or give duetime a Redis "
                "of its own."
            )
        self._policy_checked_at = now

    def check_keeping(self) -> None:
        """:meth:`check_eviction_policy`, asked of the server now (not the last look's answer)."""
        self._policy_checked_at = None
        self.check_eviction_policy()

    def _create(self, endpoint: str) -> None:
        """Nothing to create but the version; version 1 keys need nothing to become version 2
        (their messages have no group)."""
        self.check_eviction_policy()
        key = self.keys_for(endpoint)["schema"]
        with self._reaching():
            if int(self.client.get(key) or 0) < SCHEMA_VERSION:
                self.client.set(key, SCHEMA_VERSION)

    def _schema_version(self, endpoint: str) -> int | None:
        self.check_eviction_policy()
        with self._reaching():
            version = self.client.get(self.keys_for(endpoint)["schema"])
        return None if version is None else int(version)

    def full(self) -> StorageFull:
        return StorageFull(
            f"Redis at {redact(self.url)} is out of memory (its maxmemory is reached); free some, "
            "or raise maxmemory, then try again. Nothing was stored by this call."
        )

    def _insert(self, messages: Sequence[DelayedMessage]) -> None:
        self.check_eviction_policy()
        args: list[Any] = []
        for m in messages:
            args += [m.message_id, _payload(m), to_micros(m.due_at), m.group or "", m.failure_count]
        keys = self._k("ready", "payload", "bydue", "due", "groups", "failures")
        duplicate = self._write(self._store_script, keys, args, f"{len(messages)} message(s) stored", bool)
        if duplicate:
            raise Duplicate(_text(duplicate))
        self._announce(min(m.due_at for m in messages))

    def _write(
        self, script: Any, keys: list[str], args: list[Any], what: str, undone: Callable[[Any], bool]
    ) -> Any:
        """Run a script that writes messages and return its answer; with ``wait`` replicas, in one
        pipeline with WAIT (it counts its own connection's writes), and NotReplicated when fewer
        confirmed, unless ``undone(answer)`` says the script wrote nothing."""
        wait = self.replication
        try:
            if not wait.replicas:
                return script(keys=keys, args=args)
            with self.client.pipeline(transaction=False) as pipe:
                script(keys=keys, args=args, client=pipe)
                pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
                answer, confirmed = pipe.execute()
            if (short := wait.short(confirmed)) is not None and not undone(answer):
                raise NotReplicated(f"{what} at {redact(self.url)}, but {short}")
            return answer
        except redis.exceptions.OutOfMemoryError:
            raise self.full() from None

    def _announce(self, due_at: datetime) -> None:
        self.client.publish(self.keys["channel"], str(to_micros(due_at)))

    def _claim(self, at: datetime, until: datetime, limit: int) -> list[DelayedMessage]:
        return self._claim_and_next(at, until, limit)[0]

    def _claim_and_next(
        self, at: datetime, until: datetime, limit: int
    ) -> tuple[list[DelayedMessage], NextDue | None]:
        """The claim script also reads the lowest score left for a short batch: :meth:`_next_due`'s
        answer, in the same call."""
        self.check_eviction_policy()
        rows, first = self._claim_script(
            keys=self._k("ready", "payload", "claims", "failures", "due"),
            args=[to_micros(at), limit, to_micros(until)],
        )
        messages = [_message(_text(r[0]), r[1], r[2], r[3]) for r in rows]
        if first is None:  # a full batch: not read
            return messages, None
        return messages, NextDue(from_micros(int(float(first))) if first not in ("", b"") else None)

    def _next_due(self) -> datetime | None:
        first = self.client.zrange(self.keys["ready"], 0, 0, withscores=True)
        return from_micros(int(first[0][1])) if first else None

    def _act(self, action: str, message_ids: Sequence[str], now: datetime | None = None, due: int = 0) -> int:
        """``action`` on each message, in one script call; how many it was done to."""
        if not message_ids:
            return 0
        keys = self._k("ready", "payload", "claims", "failures", "due", "bydue", "groups")
        moment = to_micros(now or self.clock.now())
        answers = self._change_script(keys=keys, args=[action, moment, due, *message_ids])
        return sum(int(a) == 1 for a in answers)

    def _delete(self, message_ids: Sequence[str]) -> int:
        return self._act("remove", message_ids)

    def _fail(self, message_id: str) -> bool:
        return self._act("fail", [message_id]) == 1

    def _fail_until(self, message_id: str, due_at: datetime) -> bool:
        return self._act("fail_until", [message_id], due=to_micros(due_at)) == 1

    def _release(self, message_ids: Sequence[str]) -> int:
        return self._act("release", message_ids)

    def _get(self, message_id: str) -> DelayedMessage | None:
        keys = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys["payload"], message_id)
        pipe.hget(keys["failures"], message_id)
        pipe.hget(keys["due"], message_id)
        payload, failures, due = pipe.execute()
        return None if payload is None else _message(message_id, payload, failures or 0, due)

    def _stored_ids(self, message_ids: Sequence[str]) -> set[str]:
        pipe = self.client.pipeline(transaction=False)
        for message_id in message_ids:
            pipe.hexists(self.keys["payload"], message_id)
        return {i for i, there in zip(message_ids, pipe.execute(), strict=True) if there}

    # --- recurring schedules ------------------------------------------------------------------
    def _schedule_keys(self) -> list[str]:
        return self._k("schedules", "schedule_versions", "schedule_plans", "schedule_ids")

    def _schedule_insert(self, row: ScheduleRow) -> bool:
        args = [row.schedule_id, row.text, _micros(row.planned_until)]
        return bool(self._schedule_scripts["insert"](keys=self._schedule_keys(), args=args))

    def _schedule_update(self, changes: Sequence[Planned]) -> list[bool]:
        keys = self._schedule_keys()[:3] + self._k("ready", "payload", "bydue", "due", "groups", "failures")
        script = self._schedule_scripts["update"]
        with self.client.pipeline(transaction=False) as pipe:  # one round trip; each row's script atomic
            for row, ticks in changes:
                args: list[Any] = [row.schedule_id, row.version, row.text, _micros(row.planned_until)]
                for m in ticks:
                    args += [m.message_id, _payload(m), to_micros(m.due_at), m.group or "", m.failure_count]
                script(keys=keys, args=args, client=pipe)
            try:
                return [bool(done) for done in pipe.execute()]
            except redis.exceptions.OutOfMemoryError:
                raise self.full() from None

    def _schedule_get(self, schedule_id: str) -> ScheduleRow | None:
        rows = self._schedule_rows([schedule_id])
        return rows[0] if rows else None

    def _schedule_page(self, after: str, limit: int) -> list[ScheduleRow]:
        start = f"({after}" if after else "-"
        ids = self.client.zrangebylex(self.keys["schedule_ids"], start, "+", start=0, num=limit)
        return self._schedule_rows([_text(i) for i in ids])

    def _schedules_to_plan(self, until: datetime, limit: int) -> list[ScheduleRow]:
        ids = self.client.zrangebyscore(
            self.keys["schedule_plans"], "-inf", to_micros(until), start=0, num=limit
        )
        return self._schedule_rows([_text(i) for i in ids])

    def _schedule_delete(self, schedule_id: str) -> bool:
        return bool(self._schedule_scripts["delete"](keys=self._schedule_keys(), args=[schedule_id]))

    def _schedule_rows(self, ids: Sequence[str]) -> list[ScheduleRow]:
        keys = self.keys
        pipe = self.client.pipeline(transaction=True)  # one snapshot of each row
        for schedule_id in ids:
            pipe.hget(keys["schedules"], schedule_id)
            pipe.hget(keys["schedule_versions"], schedule_id)
            pipe.zscore(keys["schedule_plans"], schedule_id)
        answers = pipe.execute()
        rows = []
        for i, schedule_id in enumerate(ids):
            text, version, planned = answers[3 * i : 3 * i + 3]
            if text is not None and version is not None:
                until = None if planned is None else from_micros(int(planned))
                rows.append(ScheduleRow(schedule_id, _text(text), until, int(version)))
        return rows

    def _delete_unclaimed(self, message_id: str, now: datetime) -> bool:
        return self._act("cancel", [message_id], now) == 1

    def _delete_group_unclaimed(self, group: str, now: datetime, limit: int | None) -> int:
        keys = self._k("ready", "payload", "claims", "failures", "due", "bydue", "groups")
        return int(self._cancel_group_script(keys=keys, args=[group, to_micros(now), limit or 0]))

    def _count_group(self, group: str) -> int:
        """The group's members (one cancelled while a crash cut its deletes short may still be
        counted until the next cancel of the group sweeps it)."""
        return int(self.client.scard(self._k("groups")[0] + ":" + group))

    def _reschedule_unclaimed(self, message_id: str, due_at: datetime, now: datetime) -> bool:
        return self._act("reschedule", [message_id], now, to_micros(due_at)) == 1

    def _replace_unclaimed(self, message: DelayedMessage, now: datetime) -> bool:
        self.check_eviction_policy()
        keys = self._k("ready", "payload", "bydue", "due", "groups", "failures", "claims")
        m = message
        args = [
            m.message_id,
            _payload(m),
            to_micros(m.due_at),
            m.group or "",
            m.failure_count,
        ]
        replaced = self._write(self._replace_script, keys, args, "message replaced", lambda a: int(a) != 1)
        return int(replaced) == 1

    def _beat(self, endpoint: str, dispatcher_id: str, seen_at: datetime, info: str) -> None:
        """A hash of records, each keeping its own last-seen time (fields cannot expire)."""
        self.client.hset(self.keys_for(endpoint)["dispatchers"], dispatcher_id, info)

    def _presences(self, endpoint: str) -> list[str]:
        return [_text(v) for v in self.client.hvals(self.keys_for(endpoint)["dispatchers"])]

    def _forget(self, endpoint: str, seen_before: datetime) -> None:
        key = self.keys_for(endpoint)["dispatchers"]
        old = [
            _text(field)
            for field, info in self.client.hgetall(key).items()
            if DispatcherInfo.from_json(info).last_seen < seen_before
        ]
        if old:
            self.client.hdel(key, *old)

    def _key_insert(self, endpoint: str, name: str, info: str) -> bool:
        return bool(self.client.hsetnx(self.keys_for(endpoint)["api_keys"], name, info))

    def _key_update(self, endpoint: str, name: str, info: str) -> bool:
        key = self.keys_for(endpoint)["api_keys"]
        if not self.client.hexists(key, name):
            return False
        self.client.hset(key, name, info)
        return True

    def _key_records(self, endpoint: str) -> list[str]:
        found = self.client.hgetall(self.keys_for(endpoint)["api_keys"])
        return [_text(found[name]) for name in sorted(found)]

    def _record_key(self, endpoint: str, kind: str) -> str:
        return f"{self.keys_for(endpoint)['records']}:{check_name('record kind', kind)}"

    def _record_insert(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        return bool(self.client.hsetnx(self._record_key(endpoint, kind), name, info))

    def _record_update(self, endpoint: str, kind: str, name: str, info: str) -> bool:
        # one step, so a remove meanwhile cannot be undone by this change
        key = self._record_key(endpoint, kind)
        return bool(self.client.eval(_SET_IF_THERE, 1, key, name, info))

    def _record_delete(self, endpoint: str, kind: str, name: str) -> bool:
        return bool(self.client.hdel(self._record_key(endpoint, kind), name))

    def _records(self, endpoint: str, kind: str) -> list[str]:
        found = self.client.hgetall(self._record_key(endpoint, kind))
        return [_text(found[name]) for name in sorted(found)]

    # The audit trail: each entry in the kind's hash, and its name in a sorted set of its own (all
    # of one score, so ordered by name, which is the entry's time): a page is one ZRANGEBYLEX.
    def _audit_names(self, endpoint: str) -> str:
        return self._record_key(endpoint, AUDIT) + ":names"

    def _audit_insert(self, endpoint: str, name: str, info: str) -> bool:
        return bool(
            self.client.eval(
                _AUDIT_INSERT, 2, self._record_key(endpoint, AUDIT), self._audit_names(endpoint), name, info
            )
        )

    def _audit_range(
        self, endpoint: str, above: str, below: str, limit: int, oldest_first: bool
    ) -> list[str]:
        low, high = "(" + above if above else "-", "(" + below
        names = self._audit_names(endpoint)
        if oldest_first:
            found = self.client.zrangebylex(names, low, high, start=0, num=limit)
        else:
            found = self.client.zrevrangebylex(names, high, low, start=0, num=limit)
        if not found:
            return []
        texts = self.client.hmget(self._record_key(endpoint, AUDIT), found)
        return [_text(t) for t in texts if t is not None]

    def _audit_prune(self, endpoint: str, below: str) -> int:
        keys = (self._record_key(endpoint, AUDIT), self._audit_names(endpoint))
        gone = 0
        while step := int(self.client.eval(_AUDIT_PRUNE, 2, *keys, "(" + below)):
            gone += step
        return gone

    def _record_swap(
        self, endpoint: str, kind: str, name: str, old: str | None, new: str
    ) -> tuple[bool, str | None]:
        key = self._record_key(endpoint, kind)
        args = [name, "0" if old is None else "1", old or "", new]
        done, there, current = self.client.eval(_SWAP, 1, key, *args)
        return bool(int(done)), _text(current) if int(there) else None

    def _hold(self, until: Mapping[str, datetime]) -> int:
        args = [v for i, t in until.items() for v in (i, to_micros(t))]
        return int(self.client.eval(_HOLD, 3, *self._k("payload", "ready", "claims"), *args))

    def _release_held(self) -> int:
        return int(self.client.eval(_RELEASE_HELD, 3, *self._k("claims", "ready", "due")))

    def _reseal(self, pairs: Sequence[tuple[DelayedMessage, DelayedMessage]]) -> int:
        """A compare-and-set of each payload as stored (read first, so the comparison is of what
        the store holds byte for byte), skipped while a claim holds the message."""
        if not pairs:
            return 0
        keys = self._k("payload", "claims")
        stored = self.client.hmget(keys[0], [old.message_id for old, _ in pairs])
        args: list[Any] = []
        for (old, new), raw in zip(pairs, stored, strict=True):
            if raw is None:
                continue
            now = _message(old.message_id, raw, 0, 0)
            if (now.body, dict(now.headers)) == (old.body, dict(old.headers)):
                args += [old.message_id, raw, _payload(replace(now, body=new.body, headers=new.headers))]
        if not args:
            return 0
        changed = self._write(self._reseal_script, keys, args, "message sealed again", lambda a: int(a) == 0)
        return int(changed)

    def _select(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        """Walks the by-due index in pages from the lowest due time the query allows, filtering;
        a small group's listing reads the group's members instead (a walk would pass over the
        whole store to find a few), a large group's walks and asks Redis which are members."""
        keys = self.keys
        members = None if query.group is None else f"{keys['groups']}:{query.group}"
        if members is not None and int(self.client.scard(members)) <= GROUP_READ_WHOLE:
            return self._select_group(query, limit)
        lows = [to_micros(t) for t in (query.due_after, query.after[0] if query.after else None) if t]
        low: Any = max(lows) if lows else "-inf"
        high: Any = "+inf" if query.due_before is None else f"({to_micros(query.due_before)}"
        by = "group" if members is not None else "destination" if query.destination is not None else "all"
        wanted = "" if query.destination is None else json.dumps(query.destination, ensure_ascii=False)[1:-1]
        picked: list[DelayedMessage] = []
        skip = 0
        while len(picked) < limit:  # only what is wanted travels
            looked, low, skip, *rows = self._pick_script(
                keys=[keys["bydue"], keys["payload"], members or keys["groups"]],
                args=[low, high, skip, PICK_LOOKS_AT, by, wanted],
            )
            if not looked:
                break
            picked += [m for m in self._get_many([_text(r) for r in rows]) if matches(query, m)]
        return picked[:limit]

    def _get_many(self, message_ids: Sequence[str]) -> list[DelayedMessage]:
        """The stored ones of ``message_ids``, in their order, in one round trip (a page filtered
        by destination read a message per round trip: 1.9 s beside a million)."""
        keys = self.keys
        pipe = self.client.pipeline(transaction=False)
        for name in ("payload", "failures", "due"):
            pipe.hmget(keys[name], list(message_ids))
        payloads, failures, dues = pipe.execute()
        return [
            _message(i, p, f or 0, d)
            for i, p, f, d in zip(message_ids, payloads, failures, dues, strict=True)
            if p is not None
        ]

    def _select_group(self, query: ListQuery, limit: int) -> list[DelayedMessage]:
        """A page of a group: its members' due times in one read, sorted here, and only the page
        read whole (a group of 100,000 was read message by message for every page)."""
        ids = [_text(i) for i in self.client.smembers(f"{self.keys['groups']}:{query.group}")]
        dues = self.client.hmget(self.keys["due"], ids) if ids else []
        low = to_micros(query.due_after) if query.due_after else None
        high = to_micros(query.due_before) if query.due_before else None
        after = (to_micros(query.after[0]), query.after[1]) if query.after else None
        ordered = sorted(
            (int(due), message_id)
            for message_id, due in zip(ids, dues, strict=True)
            if due is not None
            and (low is None or int(due) >= low)
            and (high is None or int(due) < high)
            and (after is None or (int(due), message_id) > after)
        )
        picked: list[DelayedMessage] = []
        for start in range(0, len(ordered), 500):
            if len(picked) >= limit:
                break
            chunk = [message_id for _, message_id in ordered[start : start + 500]]
            picked += [m for m in self._get_many(chunk) if matches(query, m)]
        return picked[:limit]

    def _server_time(self) -> datetime | None:
        seconds, micros = self.client.time()
        return from_micros(int(seconds) * 1_000_000 + int(micros))

    def _count_due(self, at: datetime) -> int:
        return int(self.client.zcount(self.keys["bydue"], "-inf", to_micros(at)))

    def _count(self, at: datetime) -> StoreCounts:
        now = to_micros(at)
        keys = self.keys
        total = int(self.client.zcard(keys["ready"]))
        claims = [int(v) for v in self.client.hvals(keys["claims"])]  # a hold's is negative
        failures = [int(v) for v in self.client.hvals(keys["failures"])]
        every, read = self._destination_shares()
        counts = StoreCounts(
            total=total,
            due=int(self.client.zcount(keys["bydue"], "-inf", now)),
            claimed=sum(c > now for c in claims),
            failing=sum(f > 0 for f in failures),
            next_due=None,
            by_destination=read,
            held=sum(-c > now for c in claims),
        )
        return counts if every else sampled(counts, read)

    def _destination_shares(self) -> tuple[bool, dict[str, int]]:
        """Messages per destination: all of them counted (True), or a sample (False), taken
        again at most every :data:`SHARES_KEPT_FOR` seconds (a dispatcher's metrics ask every
        ten: each sample is fifty small calls that Redis serves between deliveries)."""
        now = time.monotonic()
        if self._shares is not None and now - self._shares[0] < SHARES_KEPT_FOR:
            return False, self._shares[1]
        read: Counter[bytes] = Counter()
        every = False
        for _ in range(DESTINATION_SAMPLES):
            every, *pairs = self._destinations_script(
                keys=[self.keys["payload"]], args=[DESTINATIONS_COUNTED, DESTINATIONS_READ]
            )
            for name, n in zip(pairs[::2], pairs[1::2], strict=True):
                read[name] += int(n)
            if every:
                break
        shares = {json.loads(b'"' + name + b'"'): n for name, n in read.items()}
        if not every:  # a whole count is not kept: it is true only now
            self._shares = (now, shares)
        return bool(every), shares

    def _close(self) -> None:
        close_redis(self.client)


#: HSET of a field that is there (HSET's XX flag is Redis 8's own).
_SET_IF_THERE = (
    "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then "
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end return 0"
)


#: A compare-and-set of a record (flow control's shared state): ARGV 1 name, 2 "1" if there is an
#: old value (3) to find, 4 the new; answers {set, there, what is there}.
_SWAP = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (ARGV[2] == '0' and not current) or (ARGV[2] == '1' and current == ARGV[3]) then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
    return {1, 0, ''}
end
return {0, current and 1 or 0, current or ''}
"""
#: Hold messages back (a flow-control limit's, duetime.limits), ARGV pairs of id and end: each
#: scored at its end and recorded in the claims hash as the negative of it (no claim's: a cancel,
#: reschedule or replace reaches it; a claim's positive time replaces it).
_HOLD = """
local held = 0
for i = 1, #ARGV, 2 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
        redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i])
        redis.call('HSET', KEYS[3], ARGV[i], -tonumber(ARGV[i + 1]))
        held = held + 1
    end
end
return held
"""
#: Every held message (a negative time in the claims hash) scored at its due time again.
_RELEASE_HELD = """
local flat, released = redis.call('HGETALL', KEYS[1]), 0
for i = 1, #flat, 2 do
    if tonumber(flat[i + 1]) < 0 then
        redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[3], flat[i]), flat[i])
        redis.call('HDEL', KEYS[1], flat[i])
        released = released + 1
    end
end
return released
"""
#: Rotation: each (id, payload as read, payload sealed again) changed if the payload is still
#: the one read and no claim holds the message (a held one's negative time is no claim).
_RESEAL = """
local changed = 0
for i = 1, #ARGV, 3 do
    local claim = redis.call('HGET', KEYS[2], ARGV[i])
    if not (claim and tonumber(claim) >= 0) and redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
        redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
        changed = changed + 1
    end
end
return changed
"""


class RedisStore(AsyncStoreBridge):
    """The async Redis store: the sync store on a thread, plus pub/sub wake-ups across processes."""

    sync: SyncRedisStore

    def __init__(self, sync: SyncRedisStore) -> None:
        super().__init__(sync, name="redis-store", watch=self._listen, reads_apart=True)

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> RedisStore:
        return cls(SyncRedisStore.from_url(url, claim_timeout=claim_timeout))

    async def check_keeping(self) -> None:
        await self._call(self.sync.check_keeping)

    async def _listen(self, subscribers: Subscribers) -> None:
        """Subscribe to the store's channel; after a dropped connection, subscribe again and tell
        the dispatcher to look again, since a wake-up may have been missed meanwhile."""
        channel = self.sync.keys["channel"]
        while True:
            client = async_redis_client(
                self.sync.url, socket_keepalive=True, socket_keepalive_options=socket_options()
            )
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    subscribers.notify(None)
                    while True:
                        note = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                        if note is not None:
                            with contextlib.suppress(ValueError):
                                subscribers.notify(from_micros(int(note["data"])))
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("Redis wake-up subscription lost (%s); subscribing again", type(error).__name__)
                subscribers.notify(None)
                await asyncio.sleep(0.5)
            finally:
                await aclose_redis(client)
