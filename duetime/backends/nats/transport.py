"""NATS JetStream transport (nats-py): publish with an acknowledgement from the stream.

Each declared queue is a stream of its own whose only subject is ``<subject_prefix><queue>``, so a
message for an undeclared queue finds no stream and fails alone (DestinationNotFound) instead of
vanishing. ``Nats-Msg-Id`` carries the message id: JetStream drops a re-publish of the same id
within its duplicate window, which absorbs most at-least-once re-sends at the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import nats
from nats.errors import ConnectionClosedError, NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NoStreamResponseError, NotFoundError

from duetime.closing import AsyncClosing
from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    TransportError,
    TransportUnavailable,
    server_reason,
)
from duetime.interfaces import ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers
from duetime.names import check_name
from duetime.received import first, those
from duetime.urls import redact


def stream_name(queue: str) -> str:
    """Stream names allow no dots: a readable part plus a hash, so distinct queues never collide."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", queue)[:40]
    return f"DUETIME_{readable}_{hashlib.sha1(queue.encode()).hexdigest()[:8]}"


log = logging.getLogger("duetime.nats")


class NatsTransport(AsyncClosing):
    def __init__(self, url: str, *, subject_prefix: str = "duetime.q.", durable: str = "duetime") -> None:
        self.url, self.subject_prefix, self.durable = url, subject_prefix, durable
        self._nc: Any = None
        self._last_error = "no answer"
        self._js: Any = None
        self._subs: dict[str, Any] = {}
        self._in_flight: dict[str, Any] = {}
        self._taken: dict[str, tuple[str, int]] = {}  # receipt -> (stream, sequence), taken by id
        self.declared: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> NatsTransport:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        plain = urlunsplit(parts._replace(query=""))
        return cls(
            plain,
            subject_prefix=options.get("subject_prefix", "duetime.q."),
            durable=options.get("durable", "duetime"),
        )

    def subject(self, queue: str) -> str:
        return self.subject_prefix + queue

    @property
    def js(self) -> Any:
        if self._js is None:
            raise ConfigurationError("The NATS transport is not started: await transport.start() first.")
        return self._js

    async def start(self) -> None:
        if self._nc is None:
            try:
                # nats-py retries the first connect forever too; the outer deadline ends that.
                self._nc = await asyncio.wait_for(
                    nats.connect(
                        servers=[self.url],
                        connect_timeout=5,
                        max_reconnect_attempts=-1,
                        error_cb=self._on_error,
                    ),
                    6,
                )
            except Exception as error:  # nats-py raises several kinds for a server it cannot reach
                reason = self._last_error if isinstance(error, TimeoutError) else server_reason(error)
                raise TransportUnavailable(f"cannot connect to {redact(self.url)}: {reason}") from None
            self._js = self._nc.jetstream()

    async def declare(self, queue: str) -> None:
        await self.start()
        name = stream_name(check_name("queue", queue))
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            await self.js.add_stream(name=name, subjects=[self.subject(queue)])
        self.declared.add(queue)

    async def delete(self, queue: str) -> None:
        await self.js.delete_stream(stream_name(queue))
        self.declared.discard(queue)

    async def _on_error(self, error: Exception) -> None:
        """nats-py's own handler prints a traceback per failed attempt; one line is enough."""
        self._last_error = server_reason(error)
        log.info("NATS %s: %s", redact(self.url), self._last_error)

    def _connected(self) -> bool:
        return self._nc is not None and bool(self._nc.is_connected)

    async def _publish(self, m: DelayedMessage) -> Exception | None:
        headers = outgoing_headers(m) | {"Nats-Msg-Id": m.message_id, "duetime-message-id": m.message_id}
        try:
            await self.js.publish(self.subject(m.destination), m.body, headers=headers, timeout=10)
        except (NoRespondersError, NoStreamResponseError) as error:
            if not self._connected():
                return TransportUnavailable(f"{redact(self.url)} is not connected: {error!r}")
            return DestinationNotFound(f"Queue {m.destination!r} has no JetStream stream (not declared).")
        except (NatsTimeout, TimeoutError, ConnectionClosedError, OutboundBufferLimitError) as error:
            return TransportUnavailable(f"publishing to {redact(self.url)} failed: {error!r}")
        except Exception as error:  # the whole batch answers per message
            if not self._connected():
                return TransportUnavailable(f"{redact(self.url)} is not connected: {error!r}")
            return TransportError(f"publishing to {m.destination!r} failed: {error!r}")
        return None

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        return list(await asyncio.gather(*(self._publish(m) for m in messages)))

    async def receive(self, queue: str, max_messages: int, wait: float) -> list[ReceivedMessage]:
        sub = self._subs.get(queue)
        if sub is None:
            try:
                sub = await self.js.pull_subscribe(
                    self.subject(queue), durable=self.durable, stream=stream_name(queue)
                )
            except NotFoundError:
                raise DestinationNotFound(
                    f"Queue {queue!r} has no JetStream stream on {redact(self.url)}; declare it first "
                    f"(duetime queues declare {queue})."
                ) from None
            self._subs[queue] = sub
        try:
            msgs = await sub.fetch(batch=max_messages, timeout=max(wait, 0.05))
        except (TimeoutError, NatsTimeout):
            return []
        received = []
        for msg in msgs:
            receipt = uuid.uuid4().hex
            self._in_flight[receipt] = msg
            headers = {
                k: v for k, v in (msg.headers or {}).items() if k not in ("Nats-Msg-Id", "duetime-message-id")
            }
            message_id = (msg.headers or {}).get("duetime-message-id", "")
            received.append(
                ReceivedMessage(queue, message_id, headers, msg.data, receipt, msg.metadata.num_delivered)
            )
        return received

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        done = 0
        for m in messages:
            msg = self._in_flight.pop(m.receipt, None)
            if msg is not None:
                await msg.ack()
                done += 1
            elif (where := self._taken.pop(m.receipt, None)) is not None:
                with contextlib.suppress(NotFoundError):  # gone already: someone else handled it
                    done += bool(await self.js.delete_msg(*where))
        return done

    def _stored(self, queue: str, raw: Any) -> ReceivedMessage:
        headers = dict(raw.headers or {})
        message_id = headers.pop("duetime-message-id", "")
        headers.pop("Nats-Msg-Id", None)
        return ReceivedMessage(queue, message_id, headers, raw.data or b"", f"{queue}@{raw.seq}", 1)

    async def _stream(self, queue: str) -> AsyncIterator[ReceivedMessage]:
        """What the queue's consumer has yet to acknowledge, oldest first, left where it is (read
        from the stream: a stream keeps acknowledged messages too, up to its limits)."""
        name = stream_name(queue)
        try:
            info = await self.js.stream_info(name)
        except NotFoundError:
            raise DestinationNotFound(
                f"Queue {queue!r} has no JetStream stream on {redact(self.url)}; declare it first "
                f"(duetime queues declare {queue})."
            ) from None
        seq = info.state.first_seq
        with contextlib.suppress(NotFoundError):
            consumer = await self.js.consumer_info(name, self.durable)
            seq = max(seq, consumer.ack_floor.stream_seq + 1)
        while seq <= info.state.last_seq:
            try:
                raw = await self.js.get_msg(name, seq=seq, subject=self.subject(queue), next=True)
            except NotFoundError:
                return
            yield self._stored(queue, raw)
            seq = raw.seq + 1

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        return await first(self._stream(queue), limit)

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Find them by reading the stream through; acknowledging one deletes it from the stream."""
        found = await those(self._stream(queue), message_ids)
        for item in found:
            self._taken[item.receipt] = (stream_name(queue), int(item.receipt.rpartition("@")[2]))
        return found

    async def has_queue(self, queue: str) -> bool:
        try:
            await self.js.stream_info(stream_name(queue))
        except NotFoundError:
            return False
        return True

    async def depth(self, queue: str) -> int:
        name = stream_name(queue)
        try:
            consumer = await self.js.consumer_info(name, self.durable)
        except NotFoundError:
            return int((await self.js.stream_info(name)).state.messages)
        return int(consumer.num_pending or 0) + int(consumer.num_ack_pending or 0)

    async def close(self) -> None:
        if self._nc is not None:
            # close, not drain: acknowledgements are sent as they happen, and drain would wait
            # out a pull request still parked on the server (30 s)
            for sub in self._subs.values():
                await sub.unsubscribe()
            await self._nc.close()
        self._nc = self._js = None
        self._subs.clear()
