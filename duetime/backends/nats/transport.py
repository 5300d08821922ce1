"""NATS JetStream transport (nats-py): publish with an acknowledgement from the stream.

Each declared queue is a stream of its own whose only subject is ``<subject_prefix><queue>``, so a
message for an undeclared queue finds no stream and fails alone (DestinationNotFound) instead of
vanishing. A queue's stream is found by that subject, whatever its name: two subject prefixes on
one server (two environments) never share or block each other's streams. ``Nats-Msg-Id``
carries the message id and a digest of its content (:func:`~duetime.message.sending_key`):
JetStream drops a re-publish of the same stored message within its duplicate window, which absorbs
most at-least-once re-sends at the broker, and delivers a new message that reuses an id.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from email.header import decode_header
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.js.client
from nats.errors import ConnectionClosedError, NoRespondersError, OutboundBufferLimitError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import BadRequestError, NoStreamResponseError, NotFoundError

from duetime.backends.queue_rows import first, those
from duetime.error_headers import PREFIX as ERROR_PREFIX
from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    DestinationUnavailable,
    MessageRefused,
    TransportError,
    TransportUnavailable,
    no_answer,
    server_reason,
)
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import number_option, one_url_per_host, redact, url_options
from duetime.interfaces import AsyncClosing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers, sending_key

#: The subject prefix unless the URL gives ``subject_prefix``.
DEFAULT_SUBJECT_PREFIX = "duetime.q."


def stream_name(queue: str, subject_prefix: str = DEFAULT_SUBJECT_PREFIX) -> str:
    """The name a new stream for ``queue`` gets. Stream names allow no dots: a readable part plus
    a hash. The hash covers a prefix other than the default, so the same queue under two prefixes
    gets two names; under the default prefix it is the queue's alone, as it always was, so a
    duetime of before finds the streams made now by their names."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", queue)[:40]
    key = queue if subject_prefix == DEFAULT_SUBJECT_PREFIX else subject_prefix + queue
    return f"DUETIME_{readable}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"


log = logging.getLogger("duetime.nats")


#: What a NATS header name may be (printable ASCII, no space, no ':'), and what no value may hold.
HEADER_NAME = re.compile(r"[!-9;-~]+")
BAD_VALUE = re.compile(r"[\r\n\x00]")
#: Header names a NATS client reads as its own, in any case: nats-py takes a message with
#: ``Status`` for a JetStream status message (``404`` hides it from every consumer, ``503``
#: fails the read), ``Description`` goes with it; ``Nats-*`` are JetStream's (a sender's
#: ``Nats-Expected-Stream`` would be obeyed); ``duetime-message-id`` is this transport's.
RESERVED_HEADERS = ("status", "description", "duetime-message-id")
RESERVED_PREFIX = "nats-"


def _is_status_message(msg: Any) -> str | None:
    """nats-py's test for a JetStream status message, made exact: the server's status messages
    come with no reply subject, while every message a stream delivers to a consumer has one
    (``$JS.ACK.…``), whatever its headers say. Without this, a stream message with a ``Status``
    header (a sender's, or one from before duetime refused them) is dropped or fails the read."""
    if msg is None or msg.headers is None or str(getattr(msg, "reply", "") or "").startswith("$JS.ACK."):
        return None
    status = msg.headers.get("Status")
    return None if status is None else str(status)


# nats-py calls this as ``JetStreamContext.is_status_msg`` from its fetch loops: only the class
# attribute reaches them. The replacement differs only for stream messages, which it keeps.
nats.js.client.JetStreamContext.is_status_msg = classmethod(  # type: ignore[method-assign, assignment]
    lambda cls, msg: _is_status_message(msg)
)


def _header_text(value: Any) -> str:
    """A header value read back from the stream, as the text it was: nats-py parses stored
    messages' headers with the email parser, which hands a value holding non-ASCII bytes over as
    an ``email.header.Header``, not text."""
    if isinstance(value, str):
        return value
    parts = decode_header(value)
    return b"".join(part if isinstance(part, bytes) else part.encode() for part, _ in parts).decode(
        "utf-8", "replace"
    )


class _NoStreamAnswered(Exception):
    """A publish no stream answered, before :meth:`NatsTransport._unanswered` says what it means."""


class NatsTransport(AsyncClosing):
    def __init__(
        self,
        url: str,
        *,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
        durable: str = "duetime",
        replicas: int = 1,
    ) -> None:
        self.url, self.subject_prefix, self.durable = url, subject_prefix, durable
        #: The servers of a cluster (``nats://a:4222,b:4222``): nats-py connects to one and moves
        #: to another when it is lost (and learns the others from the cluster itself).
        self.servers = one_url_per_host(url)
        #: Copies of each stream this transport makes, on that many servers of a cluster.
        self.replicas = replicas
        self._nc: Any = None
        self._last_error = "no answer"
        self._js: Any = None
        self._subs: dict[str, Any] = {}
        self._in_flight: dict[str, Any] = {}
        self._taken: dict[str, tuple[str, int]] = {}  # receipt -> (stream, sequence), taken by id
        self._streams: dict[str, str] = {}  # queue -> its stream's name, as found by its subject
        self.declared: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> NatsTransport:
        # nats-py takes no options in the URL: one would be dropped without a word
        plain, given = url_options(url, ("subject_prefix", "durable", "replicas"), "NATS")
        options = {name: value for name, value in given.items() if value}  # a blank one: the default
        replicas = int(number_option(options, "replicas", 1, whole=True))
        if not 1 <= replicas <= 5:
            raise ConfigurationError(
                f"replicas={replicas} in {redact(url)}: JetStream keeps 1 to 5 copies of a stream."
            )
        return cls(
            plain,
            subject_prefix=options.get("subject_prefix", DEFAULT_SUBJECT_PREFIX),
            durable=options.get("durable", "duetime"),
            replicas=replicas,
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
                        servers=self.servers,
                        connect_timeout=5,
                        # a silent server is found dead in ~30 s (nats-py's default: 4 minutes)
                        ping_interval=10,
                        max_outstanding_pings=3,
                        max_reconnect_attempts=-1,
                        error_cb=self._on_error,
                    ),
                    6,
                )
            except Exception as error:  # nats-py raises several kinds for a server it cannot reach
                reason = self._last_error if isinstance(error, TimeoutError) else server_reason(error)
                if reason in ("TimeoutError", "no answer"):  # a port that took the connection, then silence
                    hosts = [urlsplit(server) for server in self.servers]
                    named = " or ".join(f"{h.hostname}:{h.port or 4222}" for h in hosts)
                    reason = no_answer(named, 5, "NATS")
                raise TransportUnavailable(f"cannot connect to {redact(self.url)}: {reason}") from None
            self._js = self._nc.jetstream()

    async def declare(self, queue: str) -> None:
        await self.start()
        check_name("queue", queue)
        if await self._find(queue) is None:
            name = stream_name(queue, self.subject_prefix)
            try:
                await self.js.add_stream(
                    name=name, subjects=[self.subject(queue)], num_replicas=self.replicas
                )
            except BadRequestError:
                # the name is a stream's of another subject (a duetime of before named streams by
                # the queue alone, whatever the prefix): this queue's stream gets its subject's hash
                name = f"DUETIME_{hashlib.sha1(self.subject(queue).encode()).hexdigest()[:16]}"
                await self.js.add_stream(
                    name=name, subjects=[self.subject(queue)], num_replicas=self.replicas
                )
            self._streams[queue] = name
        self.declared.add(queue)

    async def delete(self, queue: str) -> None:
        name = await self._find(queue)
        if name is not None:
            await self.js.delete_stream(name)
        self._streams.pop(queue, None)
        self.declared.discard(queue)

    async def _find(self, queue: str, *, again: bool = False) -> str | None:
        """The name of the stream that holds the queue's subject; None if there is none (not
        declared). Remembered once found; ``again`` asks the server anyway."""
        if not again and (known := self._streams.get(queue)) is not None:
            return known
        try:
            name = str(await self.js.find_stream_name_by_subject(self.subject(queue)))
        except NotFoundError:
            self._streams.pop(queue, None)
            return None
        self._streams[queue] = name
        return name

    async def _stream_of(self, queue: str) -> str:
        name = await self._find(queue)
        if name is None:
            raise DestinationNotFound(
                f"Queue {queue!r} has no JetStream stream on {redact(self.url)}; declare it first "
                f"(duetime queues declare {queue})."
            )
        return name

    async def _on_error(self, error: Exception) -> None:
        """nats-py's own handler prints a traceback per failed attempt; one line is enough."""
        self._last_error = server_reason(error)
        log.info("NATS %s: %s", redact(self.url), self._last_error)

    def _connected(self) -> bool:
        return self._nc is not None and bool(self._nc.is_connected)

    def _refusal(self, m: DelayedMessage, headers: dict[str, str]) -> MessageRefused | None:
        """Why NATS could never carry this message unchanged, found before it is sent: the server
        refuses a bad header or an oversized message on every try (and the error queue's copy
        with it), and turns CR/LF into spaces, trims values and keeps its own ``Nats-*`` headers."""
        for name, value in m.headers.items():
            if name.startswith(ERROR_PREFIX):  # duetime's own reasons: a stack trace has lines
                continue
            if not HEADER_NAME.fullmatch(name):
                return MessageRefused(
                    f"header name {name[:40]!r} is not allowed on NATS (printable ASCII without "
                    "spaces or ':' only)"
                )
            if name.lower().startswith(RESERVED_PREFIX) or name.lower() in RESERVED_HEADERS:
                return MessageRefused(
                    f"header {name!r} is one NATS's clients read as their own (or duetime's): "
                    "give it another name"
                )
            if BAD_VALUE.search(value) or value != value.strip(" \t"):
                return MessageRefused(
                    f"header {name[:40]!r} has CR, LF or NUL in its value, or spaces around it, which "
                    "NATS would change"
                )
        size = len(m.body) + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()) + 12
        limit = self._nc.max_payload if self._nc is not None else 0
        if limit and size > limit:
            return MessageRefused(
                f"it takes {size:,} bytes with its headers, over the server's max_payload of {limit:,}"
            )
        return None

    def cannot_carry(self, message: DelayedMessage) -> str | None:
        refused = self._refusal(message, self._headers_of(message))
        return None if refused is None else str(refused)

    @staticmethod
    def _headers_of(m: DelayedMessage) -> dict[str, str]:
        return outgoing_headers(m) | {"Nats-Msg-Id": sending_key(m), "duetime-message-id": m.message_id}

    async def _publish(self, m: DelayedMessage) -> Exception | None:
        headers = self._headers_of(m)
        refused = self._refusal(m, headers)
        if refused is not None:
            return MessageRefused(f"NATS cannot carry message {m.message_id}: {refused}")
        try:
            await self.js.publish(self.subject(m.destination), m.body, headers=headers, timeout=10)
        except (NoRespondersError, NoStreamResponseError) as error:
            if not self._connected():
                return TransportUnavailable(f"{redact(self.url)} is not connected: {error!r}")
            return _NoStreamAnswered()
        except (NatsTimeout, TimeoutError, ConnectionClosedError, OutboundBufferLimitError) as error:
            return TransportUnavailable(f"publishing to {redact(self.url)} failed: {error!r}")
        except Exception as error:  # the whole batch answers per message
            if not self._connected():
                return TransportUnavailable(f"{redact(self.url)} is not connected: {error!r}")
            return TransportError(f"publishing to {m.destination!r} failed: {error!r}")
        return None

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        results = list(await asyncio.gather(*(self._publish(m) for m in messages)))
        verdicts: dict[str, Exception] = {}
        for i, (m, result) in enumerate(zip(messages, results, strict=True)):
            if isinstance(result, _NoStreamAnswered):  # asked once per destination of the batch
                if m.destination not in verdicts:
                    verdicts[m.destination] = await self._unanswered(m.destination)
                results[i] = verdicts[m.destination]
        return results

    async def _unanswered(self, queue: str) -> Exception:
        """What it means that no stream answered a publish to ``queue``: none holds its subject
        (not declared: the message fails alone), or its stream is there but cannot take messages
        now (in a cluster, a server was lost and the stream elects a new leader; an outage to wait
        out, never a failure of the message). A server that cannot say which is the latter."""
        try:
            found = await asyncio.wait_for(self._find(queue, again=True), 5)
        except Exception as error:
            return DestinationUnavailable(
                f"no stream of {redact(self.url)} took a message for queue {queue!r}, and the server "
                f"could not say whether it has one ({error!r}); a server of the cluster lost?"
            )
        if found is None:
            return DestinationNotFound(f"Queue {queue!r} has no JetStream stream (not declared).")
        return DestinationUnavailable(
            f"stream {found} of queue {queue!r} on {redact(self.url)} took no message (no leader yet "
            "after a server of the cluster was lost?)"
        )

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        if done:
            await self.acknowledge(done)
        sub = self._subs.get(queue)
        if sub is None:
            stream = await self._stream_of(queue)
            sub = await self.js.pull_subscribe(self.subject(queue), durable=self.durable, stream=stream)
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
                k: _header_text(v)
                for k, v in (msg.headers or {}).items()
                if k not in ("Nats-Msg-Id", "duetime-message-id")
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
        headers = {k: _header_text(v) for k, v in (raw.headers or {}).items()}
        message_id = headers.pop("duetime-message-id", "")
        headers.pop("Nats-Msg-Id", None)
        return ReceivedMessage(queue, message_id, headers, raw.data or b"", f"{queue}@{raw.seq}", 1)

    async def _stream(self, queue: str) -> AsyncIterator[ReceivedMessage]:
        """What the queue's consumer has yet to acknowledge, oldest first, left where it is (read
        from the stream: a stream keeps acknowledged messages too, up to its limits)."""
        name = await self._stream_of(queue)
        info = await self.js.stream_info(name)
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
        name = await self._stream_of(queue)
        for item in found:
            self._taken[item.receipt] = (name, int(item.receipt.rpartition("@")[2]))
        return found

    async def has_queue(self, queue: str) -> bool:
        return await self._find(queue, again=True) is not None

    async def depth(self, queue: str) -> int:
        name = await self._stream_of(queue)
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
