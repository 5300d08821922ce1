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
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from duetime._bridge import AsyncStoreBridge
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError, DuplicateMessageId, MessageInFlight, StoreNotReady
from duetime.interfaces import ListQuery, Page, StoreCounts
from duetime.message import DelayedMessage, check_due_time
from duetime.names import check_name
from duetime.settings import TransactionMode
from duetime.urls import number_option

log = logging.getLogger("duetime.redis")
SCHEMA_VERSION = 1


def _script(name: str) -> str:
    return resources.files("duetime.backends.redis").joinpath(name).read_text(encoding="utf-8")


def _payload(m: DelayedMessage) -> bytes:
    head = json.dumps({"d": m.destination, "h": dict(m.headers)}, separators=(",", ":"), ensure_ascii=False)
    return head.encode() + b"\n" + m.body


def _message(message_id: str, payload: bytes, failures: Any, due: Any) -> DelayedMessage:
    head, _, body = payload.partition(b"\n")
    meta = json.loads(head)
    return DelayedMessage.from_store(
        message_id, meta["d"], from_micros(int(due)), body, meta["h"], int(failures)
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SyncRedisStore:
    """Blocking Redis store; redis-py's client is thread-safe (a connection pool)."""

    def __init__(
        self, url: str, *, prefix: str = "duetime:", claim_timeout: timedelta = timedelta(seconds=30)
    ) -> None:
        self.url, self.prefix, self.claim_timeout = url, prefix, claim_timeout
        # Any: redis-py types every answer as one union of its sync and async forms (bytes | str |
        # Awaitable ...); the sync client's real answers are used as such below.
        self.client: Any = redis.Redis.from_url(url)
        self._claim = self.client.register_script(_script("claim.lua"))
        self._store_many = self.client.register_script(_script("store_many.lua"))
        self._change = self.client.register_script(_script("change.lua"))
        self._lock = threading.Lock()
        self.endpoint: str | None = None

    @classmethod
    def from_url(cls, url: str) -> SyncRedisStore:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        unknown = set(options) - {"prefix", "claim_timeout"}
        if unknown:
            raise ConfigurationError(
                f"Unknown Redis store URL option(s) {sorted(unknown)}; known: prefix, claim_timeout."
            )
        plain = urlunsplit(parts._replace(query=""))
        return cls(
            plain,
            prefix=options.get("prefix", "duetime:"),
            claim_timeout=timedelta(seconds=number_option(options, "claim_timeout", 30.0)),
        )

    def keys_for(self, endpoint: str) -> dict[str, str]:
        base = f"{self.prefix}{check_name('endpoint', endpoint)}:"
        names = ("ready", "payload", "claims", "failures", "due", "bydue")
        return {name: base + name for name in names} | {"schema": base + "schema", "channel": base + "wake"}

    @property
    def keys(self) -> dict[str, str]:
        if self.endpoint is None:
            raise StoreNotReady("The store is not initialized: call initialize(endpoint, mode) first.")
        return self.keys_for(self.endpoint)

    def setup_infrastructure(self, endpoint: str) -> None:
        keys = self.keys_for(endpoint)
        self.client.set(keys["schema"], SCHEMA_VERSION, nx=True)

    def initialize(self, endpoint: str, mode: TransactionMode) -> None:
        TransactionMode(mode)
        version = self.client.get(self.keys_for(endpoint)["schema"])
        if version is None:
            raise StoreNotReady(
                f"No duetime store for endpoint {endpoint!r} at {self.url} (prefix {self.prefix!r}): run "
                "`duetime setup` or call setup_infrastructure() first."
            )
        if int(version) > SCHEMA_VERSION:
            raise ConfigurationError(f"Redis keys have schema version {int(version)}; upgrade duetime.")
        self.endpoint = endpoint

    def _k(self, *names: str) -> list[str]:
        keys = self.keys
        return [keys[n] for n in names]

    def store(self, message: DelayedMessage) -> None:
        self.store_many([message])

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        if not messages:
            return 0
        args: list[Any] = []
        for m in messages:
            args += [m.message_id, _payload(m), to_micros(m.due_at)]
        duplicate = self._store_many(keys=self._k("ready", "payload", "bydue", "due"), args=args)
        if duplicate:
            raise DuplicateMessageId(
                f"A delayed message with id {_text(duplicate)!r} is already stored; nothing from this call was "
                "stored. Choose a new id, or cancel the stored one first."
            )
        earliest = min(to_micros(m.due_at) for m in messages)
        self.client.publish(self.keys["channel"], str(earliest))
        return len(messages)

    def fetch_due(self, at: datetime, limit: int) -> list[DelayedMessage]:
        now = to_micros(check_due_time(at, "at"))
        until = now + int(self.claim_timeout.total_seconds() * 1_000_000)
        rows = self._claim(
            keys=self._k("ready", "payload", "claims", "failures", "due"), args=[now, limit, until]
        )
        messages = [_message(_text(r[0]), r[1], r[2], r[3]) for r in rows]
        return sorted(messages, key=lambda m: (m.due_at, m.message_id))

    def next_due(self) -> datetime | None:
        first = self.client.zrange(self.keys["ready"], 0, 0, withscores=True)
        return from_micros(int(first[0][1])) if first else None

    def _act(self, action: str, message_id: str, due: int = 0) -> int:
        now = to_micros(datetime.now(UTC))
        keys = self._k("ready", "payload", "claims", "failures", "due", "bydue")
        return int(self._change(keys=keys, args=[action, message_id, now, due]))

    def remove(self, message_id: str) -> bool:
        return self._act("remove", message_id) == 1

    def remove_many(self, message_ids: Sequence[str]) -> int:
        return sum(self._act("remove", i) == 1 for i in message_ids)

    def increment_failure_count(self, message_id: str) -> bool:
        return self._act("fail", message_id) == 1

    def release(self, message_ids: Sequence[str]) -> int:
        return sum(self._act("release", i) == 1 for i in message_ids)

    def get(self, message_id: str) -> DelayedMessage | None:
        keys = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys["payload"], message_id)
        pipe.hget(keys["failures"], message_id)
        pipe.hget(keys["due"], message_id)
        payload, failures, due = pipe.execute()
        return None if payload is None else _message(message_id, payload, failures or 0, due)

    def _refuse_in_flight(self, result: int, message_id: str) -> bool:
        if result == -1:
            raise MessageInFlight(
                f"Message {message_id!r} is being forwarded right now; it cannot be changed."
            )
        return result == 1

    def cancel(self, message_id: str) -> bool:
        return self._refuse_in_flight(self._act("cancel", message_id), message_id)

    def reschedule(self, message_id: str, due_at: datetime) -> bool:
        due = to_micros(check_due_time(due_at))
        done = self._refuse_in_flight(self._act("reschedule", message_id, due), message_id)
        if done:
            self.client.publish(self.keys["channel"], str(due))
        return done

    def list(self, query: ListQuery) -> Page:
        """Walks the by-due index in pages, filtering as it goes; destination filters scan."""
        keys = self.keys
        low: Any = (
            "-inf" if query.due_after is None else to_micros(check_due_time(query.due_after, "due_after"))
        )
        if query.after is not None:
            low = max(to_micros(query.after[0]), low if isinstance(low, int) else -(2**62))
        high: Any = (
            "+inf"
            if query.due_before is None
            else f"({to_micros(check_due_time(query.due_before, 'due_before'))}"
        )
        picked: list[DelayedMessage] = []
        offset = 0
        while len(picked) <= query.limit:
            rows = self.client.zrangebyscore(keys["bydue"], low, high, start=offset, num=500, withscores=True)
            if not rows:
                break
            offset += len(rows)
            for raw_id, score in rows:
                message_id = _text(raw_id)
                if query.after is not None and (from_micros(int(score)), message_id) <= query.after:
                    continue
                message = self.get(message_id)
                if message is None or message.failure_count < query.min_failures:
                    continue
                if query.destination is not None and message.destination != query.destination:
                    continue
                picked.append(message)
                if len(picked) > query.limit:
                    break
        more = len(picked) > query.limit
        picked = picked[: query.limit]
        return Page(picked, (picked[-1].due_at, picked[-1].message_id) if more and picked else None)

    def counts(self, at: datetime) -> StoreCounts:
        now = to_micros(check_due_time(at, "at"))
        keys = self.keys
        total = int(self.client.zcard(keys["ready"]))
        claims = [int(v) for v in self.client.hvals(keys["claims"])]
        failures = [int(v) for v in self.client.hvals(keys["failures"])]
        by_destination: dict[str, int] = {}
        if total <= 100_000:
            heads = (p.partition(b"\n")[0] for p in self.client.hvals(keys["payload"]))
            by_destination = dict(Counter(json.loads(h)["d"] for h in heads))
        return StoreCounts(
            total=total,
            due=int(self.client.zcount(keys["bydue"], "-inf", now)),
            claimed=sum(c > now for c in claims),
            failing=sum(f > 0 for f in failures),
            next_due=self.next_due(),
            by_destination=by_destination,
        )

    def close(self) -> None:
        self.client.close()


class RedisStore(AsyncStoreBridge):
    """The async Redis store: the sync store on a thread, plus pub/sub wake-ups across processes."""

    sync: SyncRedisStore

    def __init__(self, sync: SyncRedisStore) -> None:
        super().__init__(sync, threaded=True, name="redis-store")
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        return cls(SyncRedisStore.from_url(url))

    def subscribe(self, callback: Callable[[datetime | None], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(callback)
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return unsubscribe

    async def _watch(self) -> None:
        """Subscribe to the store's channel; after a dropped connection, subscribe again and tell
        the dispatcher to look again, since a wake-up may have been missed meanwhile."""
        channel = self.sync.keys["channel"]
        while True:
            client = aioredis.Redis.from_url(self.sync.url)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    self.subscribers.notify(None)
                    while True:
                        note = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                        if note is not None:
                            with contextlib.suppress(ValueError):
                                self.subscribers.notify(from_micros(int(note["data"])))
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("Redis wake-up subscription lost (%s); subscribing again", type(error).__name__)
                self.subscribers.notify(None)
                await asyncio.sleep(0.5)
            finally:
                await client.aclose()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        await super().close()
