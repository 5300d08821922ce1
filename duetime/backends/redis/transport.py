"""Redis transport (redis-py, asyncio): deliver to a stream (consumer group) or a list.

``redis://host:6379/0?mode=stream`` (default) appends with XADD; consumers read with XREADGROUP
and acknowledge with XACK, and a consumer that died leaves its entries pending until another
reclaims them (XAUTOCLAIM after ``visibility_timeout``, looked for every second at most).
``mode=list`` LPUSHes an envelope; the consumer side moves it to a processing list (LMOVE) and
removes it on acknowledgement.

Queues must be declared (``SADD <prefix>queues``): Redis creates keys on write, so without that a
typo in a destination would silently create a queue nobody reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, InvalidResponse, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from duetime.backends._keepalive import socket_options
from duetime.backends._redis_database import (
    NO_WAIT,
    Replication,
    aclose_redis,
    async_redis_client,
    check_database,
    no_such_database,
    not_redis,
)
from duetime.backends.queue_rows import first, received, those
from duetime.errors import ConfigurationError, DestinationNotFound, TransportUnavailable, server_reason
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import number_option, redact, split_options
from duetime.interfaces import AsyncClosing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers

MODES = {"stream", "list"}
#: The send of a batch (send.lua), called by its SHA1: the server is given the text only when it
#: does not know it yet.
SEND = resources.files("duetime.backends.redis").joinpath("send.lua").read_text(encoding="utf-8")
SEND_SHA = hashlib.sha1(SEND.encode()).hexdigest()
#: Entries read per round trip when an operator looks through a queue.
BROWSE_PAGE = 1000
#: Move one particular list entry to the processing list, if it is still there.
MOVE_ONE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


def _envelope(m: DelayedMessage) -> bytes:
    head = json.dumps(
        {"id": m.message_id, "headers": outgoing_headers(m)}, separators=(",", ":"), ensure_ascii=False
    )
    return head.encode() + b"\n" + m.body


def _open_envelope(raw: bytes, receipt: str, queue: str) -> ReceivedMessage:
    """A list entry is ``{"id":…,"headers":…}`` newline body; anything else is read as well as it can be."""
    head, _, body = raw.partition(b"\n")
    try:
        meta = json.loads(head)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        item = received(queue, "", "{}", raw, receipt, 1)
        return replace(item, problem="the entry is not a duetime envelope (JSON head, newline, body)")
    return received(queue, meta.get("id"), meta.get("headers"), body, receipt, 1)


class RedisTransport(AsyncClosing):
    def __init__(
        self,
        url: str,
        *,
        mode: str = "stream",
        prefix: str = "duetime:",
        group: str = "duetime",
        visibility_timeout: float = 30.0,
        replication: Replication = NO_WAIT,
        reclaim_every: float = 1.0,
    ) -> None:
        if mode not in MODES:
            raise ConfigurationError(f"mode must be one of {sorted(MODES)}, got {mode!r}.")
        self.url, self.mode, self.prefix, self.group = check_database(url), mode, prefix, group
        #: A batch is sent once this many replicas have it (else it goes again: at-least-once).
        self.replication = replication
        self.visibility_ms = int(visibility_timeout * 1000)
        #: Seconds between two looks for entries a consumer took and left (a fraction of the
        #: visibility timeout when that is short, so that they are taken back soon after it).
        self.reclaim_every = max(0.05, min(reclaim_every, visibility_timeout / 4))
        self._next_reclaim: dict[str, float] = {}
        self.consumer = f"duetime-{uuid.uuid4().hex[:12]}"
        self._redis: aioredis.Redis | None = None

    @classmethod
    def from_url(cls, url: str) -> RedisTransport:
        ours = {"mode", "prefix", "group", "visibility_timeout", "wait", "wait_timeout"}
        plain, options = split_options(url, ours)
        return cls(
            plain,
            mode=options.get("mode", "stream"),
            prefix=options.get("prefix", "duetime:"),
            group=options.get("group", "duetime"),
            visibility_timeout=number_option(options, "visibility_timeout", 30.0),
            replication=Replication.of(options),
        )

    @property
    def redis(self) -> aioredis.Redis:
        if self._redis is None:
            raise ConfigurationError("The Redis transport is not started: await transport.start() first.")
        return self._redis

    def key(self, queue: str) -> str:
        return f"{self.prefix}q:{queue}"

    def processing_key(self, queue: str) -> str:
        return f"{self.prefix}processing:{queue}"

    async def start(self) -> None:
        if self._redis is None:
            client = async_redis_client(
                self.url, socket_keepalive=True, socket_keepalive_options=socket_options()
            )
            try:
                await client.ping()
            except AuthenticationError as error:
                await aclose_redis(client)
                raise ConfigurationError(f"cannot connect to {redact(self.url)}: {error}") from None
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                await aclose_redis(client)
                raise TransportUnavailable(
                    f"cannot connect to {redact(self.url)}: {server_reason(error)}"
                ) from None
            except ResponseError as error:
                await aclose_redis(client)
                raise no_such_database(self.url, error) or error from None
            except InvalidResponse as error:
                await aclose_redis(client)
                raise not_redis(self.url, error) from None
            except TypeError as error:  # redis-py hands URL options it does not know to its connection
                await aclose_redis(client)
                raise ConfigurationError(
                    f"{redact(self.url)} has an option the Redis client does not take ({error}); duetime's "
                    "own are mode, prefix, group and visibility_timeout."
                ) from None
            self._redis = client

    async def declare(self, queue: str) -> None:
        await self.start()
        await self.redis.sadd(f"{self.prefix}queues", check_name("queue", queue))
        if self.mode == "stream":
            with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists already
                await self.redis.xgroup_create(self.key(queue), self.group, id="0", mkstream=True)

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        if not messages:
            return []
        keys: list[str] = [f"{self.prefix}queues"]
        args: list[str | bytes] = ["stream" if self.mode == "stream" else "list"]
        for m in messages:
            keys.append(self.key(m.destination))
            if self.mode == "stream":
                headers = json.dumps(outgoing_headers(m), separators=(",", ":"), ensure_ascii=False)
                args += [m.destination, m.message_id, headers, m.body]
            else:
                args += [m.destination, "", "", _envelope(m)]
        appended, short = await self._send(keys, args)
        results: list[Exception | None] = [
            None if flag else DestinationNotFound(f"Queue {m.destination!r} is not declared on Redis.")
            for m, flag in zip(messages, appended, strict=True)
        ]
        if short is not None:  # sent again later: at-least-once, never lost with the master
            return [
                r if r is not None else TransportUnavailable(f"{redact(self.url)}: {short}") for r in results
            ]
        return results

    async def _send(self, keys: list[str], args: list[str | bytes]) -> tuple[list[int], str | None]:
        """send.lua's answer, and what the replicas fell short of (None: enough, or none asked
        for). One round trip: the script alone, or with WAIT in a pipeline on its connection. A
        server that does not know the script yet (new, restarted) is given it and asked again:
        a script it does not know ran nothing."""
        for known in (True, False):
            if not known:
                await self.redis.script_load(SEND)
            try:
                if not self.replication.replicas:
                    return list(await self.redis.evalsha(SEND_SHA, len(keys), *keys, *args)), None
                async with self.redis.pipeline(transaction=False) as pipe:  # WAIT: after its writes
                    pipe.evalsha(SEND_SHA, len(keys), *keys, *args)
                    pipe.execute_command("WAIT", self.replication.replicas, self.replication.timeout_ms)
                    answers = await pipe.execute()
                return list(answers[0]), self.replication.short(answers[1])
            except NoScriptError:
                if not known:
                    raise
        raise AssertionError("unreachable")

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        """What is waiting, up to ``max_messages``, waiting up to ``wait`` seconds for the first.
        A stream receive is one round trip: the acknowledgements of ``done`` and the read go in one
        pipeline. Entries another consumer took and left for ``visibility_timeout`` are looked
        for (XAUTOCLAIM) on the first receive and then at most every ``reclaim_every`` seconds,
        a long wait included, not on every receive."""
        if self.mode == "list":
            if done:
                await self.acknowledge(done)
            return await self._receive_list(queue, max_messages, wait)
        key = self.key(queue)
        deadline = time.monotonic() + max(wait, 0.0)
        try:
            while True:
                entries: list[Any] = []
                if time.monotonic() >= self._next_reclaim.get(key, 0.0):
                    self._next_reclaim[key] = time.monotonic() + self.reclaim_every
                    if done:
                        await self.acknowledge(done)
                        done = ()
                    # redis-py's stubs are one union for the sync and async clients; the async answers are these.
                    claimed: Any = await self.redis.xautoclaim(
                        key, self.group, self.consumer, self.visibility_ms, "0-0", count=max_messages
                    )
                    entries = list(claimed[1])
                if len(entries) < max_messages:
                    now = time.monotonic()  # a block ends by the wait's end and by the next look
                    left = min(deadline, self._next_reclaim[key]) - now
                    block = max(1, int(left * 1000)) if deadline > now and not entries else None
                    async with self.redis.pipeline(transaction=False) as pipe:
                        self._acknowledgements(pipe, done)
                        pipe.xreadgroup(
                            self.group,
                            self.consumer,
                            {key: ">"},
                            count=max_messages - len(entries),
                            block=block,
                        )
                        answers: Any = await pipe.execute()
                    done = ()
                    for _, rows in answers[-1] or []:
                        entries += rows
                items = [
                    self._entry(queue, entry_id, fields) for entry_id, fields in entries if fields
                ]  # none: deleted
                if items or time.monotonic() >= deadline:
                    return items
        except ResponseError as error:
            if "NOGROUP" in str(error):  # no stream or no consumer group: never declared
                raise DestinationNotFound(
                    f"Queue {queue!r} is not declared on {redact(self.url)}; declare it first "
                    f"(duetime queues declare {queue})."
                ) from None
            raise

    async def _receive_list(self, queue: str, max_messages: int, wait: float) -> list[ReceivedMessage]:
        key, processing = self.key(queue), self.processing_key(queue)
        raws: list[bytes] = []
        r: Any = self.redis  # BLMOVE takes a float timeout (Redis 6+); the stubs say int
        first = (
            await r.blmove(key, processing, wait, "RIGHT", "LEFT")
            if wait > 0
            else await r.lmove(key, processing, "RIGHT", "LEFT")
        )
        if first is not None:
            raws.append(first)
            while len(raws) < max_messages:
                more = await r.lmove(key, processing, "RIGHT", "LEFT")
                if more is None:
                    break
                raws.append(more)
        return [_open_envelope(raw, raw.hex(), queue) for raw in raws]

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        if not messages:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            self._acknowledgements(pipe, messages)
            answers = await pipe.execute()
        # a stream's: XACK and XDEL a queue, the count of what XDEL removed; a list's: LREM each
        return sum(answers[1::2]) if self.mode == "stream" else sum(1 for a in answers if a)

    def _acknowledgements(self, pipe: Any, messages: Sequence[ReceivedMessage]) -> None:
        """The commands that acknowledge ``messages`` on a pipeline: for a stream, one XACK and one
        XDEL a queue (XDEL also removes one taken by id, never read by the group); for a list,
        the envelope's LREM from the processing list."""
        if self.mode == "stream":
            by_queue: dict[str, list[str]] = {}
            for m in messages:
                by_queue.setdefault(m.queue, []).append(m.receipt)
            for name, receipts in by_queue.items():
                pipe.xack(self.key(name), self.group, *receipts)
                pipe.xdel(self.key(name), *receipts)
        else:
            for m in messages:
                pipe.lrem(self.processing_key(m.queue), 1, bytes.fromhex(m.receipt))

    def _entry(self, queue: str, entry_id: Any, fields: Any) -> ReceivedMessage:
        receipt = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return received(queue, fields.get(b"id"), fields.get(b"headers"), fields.get(b"body"), receipt, 1)

    async def _entries(self, queue: str) -> AsyncIterator[ReceivedMessage]:
        """Everything in the queue, oldest first, read a page at a time and left where it is."""
        if self.mode == "stream":
            start = "-"
            while True:
                page: Any = await self.redis.xrange(self.key(queue), start, "+", count=BROWSE_PAGE)
                for entry_id, fields in page:
                    yield self._entry(queue, entry_id, fields)
                if len(page) < BROWSE_PAGE:
                    return
                start = "(" + (page[-1][0].decode() if isinstance(page[-1][0], bytes) else page[-1][0])
        else:  # LPUSHed, so the oldest is at the right
            end = -1
            while True:
                raws: Any = await self.redis.lrange(self.key(queue), end - BROWSE_PAGE + 1, end)
                for raw in reversed(raws):
                    yield _open_envelope(raw, raw.hex(), queue)
                if len(raws) < BROWSE_PAGE:
                    return
                end -= BROWSE_PAGE

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        return await first(self._entries(queue), limit)

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Find them by reading the queue through. A stream entry stays until acknowledged
        (XDEL); a list entry moves to the processing list, as a receive would move it."""
        found = await those(self._entries(queue), message_ids)
        if self.mode == "stream":
            return found
        moved: list[ReceivedMessage] = []
        for item in found:
            keys = [self.key(queue), self.processing_key(queue)]
            if await self.redis.eval(MOVE_ONE, 2, *keys, bytes.fromhex(item.receipt)):
                moved.append(item)
        return moved

    async def has_queue(self, queue: str) -> bool:
        return bool(await self.redis.sismember(f"{self.prefix}queues", queue))

    async def depth(self, queue: str) -> int:
        key = self.key(queue)
        return int(await (self.redis.xlen(key) if self.mode == "stream" else self.redis.llen(key)))

    async def close(self) -> None:
        if self._redis is not None:
            await aclose_redis(self._redis)
            self._redis = None
