"""RabbitMQ transport (aio-pika): persistent messages, publisher confirms, ``mandatory``.

Each batch is written in one go on the connection's own aiormq channel and its confirms are
awaited together, so a batch costs one wait, not one per message (aio-pika's publish waits for
each frame to be flushed before the next is queued: 0.65x the pipelined rate on this machine). A
message whose queue does not exist comes back unroutable and fails alone (DestinationNotFound),
without delaying the others.

A lost connection (a broker restart, a cut network) fails the batch with TransportUnavailable and
drops the connection; the next call connects again. The dispatcher treats that as an outage:
the messages stay stored and nothing is dead-lettered. Reconnecting here, rather than in
aio-pika's robust connection, keeps every wait bounded and every failure visible to the breakers,
and lets a wrong password fail at once instead of retrying in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aio_pika.connection import make_url
from aio_pika.exceptions import DeliveryError
from aiormq.exceptions import (
    AMQPError,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    ChannelPreconditionFailed,
    ConnectionNotAllowed,
    ProbableAuthenticationError,
)
from pamqp.commands import Basic
from pamqp.frame import marshal
from pamqp.header import ContentHeader

from duetime.backends.rabbitmq.arrival import arrival_headers, early_by
from duetime.backends.rabbitmq.batchwrite import MAX_ROUTING_KEY, Publish, write_batch
from duetime.backends.rabbitmq.urloptions import OWN, check_broker_options
from duetime.clock import SYSTEM
from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    DestinationUnavailable,
    MessageRefused,
    TransportError,
    TransportUnavailable,
    no_answer,
    one_line,
)
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import number_option, one_url_per_host, options_of, redact, split_options
from duetime.interfaces import AsyncClosing, ReceivedMessage
from duetime.message import DelayedMessage, outgoing_headers
from duetime.nservicebus_wire import amqp_properties

log = logging.getLogger("duetime.rabbitmq")

QUEUE_TYPES = {"classic", "quorum"}
#: NServiceBus.RabbitMQ's routing topologies: ``direct`` senders publish to the default exchange,
#: ``conventional`` ones (its default) to a fanout exchange named after the queue.
TOPOLOGIES = {"direct", "conventional"}
#: Failures that mean the connection, not the message, is the problem (aiormq's connection
#: errors, ConnectionError and TimeoutError are all OSErrors).
LINK_ERRORS = (ChannelInvalidStateError, OSError)
#: RabbitMQ's default ``max_message_size`` (128 MiB up to 3.13; 4.0 lowered it to 16 MiB: give
#: ``?max_message_size=`` then). A broker never tells its client, so the URL says it.
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
#: AMQP's limit on a header's name (pamqp cuts longer ones, with a warning only), and the frame
#: size assumed before a broker says its own in the handshake.
MAX_HEADER_NAME, DEFAULT_FRAME_MAX = 128, 131_072
#: Room for a content header's properties besides its headers: a header table this much under the
#: frame size is not measured exactly.
HEADER_FRAME_SLACK = 4096


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


class RabbitMqTransport(AsyncClosing):
    """Delivers to queues on RabbitMQ through the default exchange; consumable too."""

    def __init__(
        self,
        url: str,
        *,
        queue_type: str = "classic",
        prefetch: int = 500,
        connect_timeout: float = 10.0,
        publish_timeout: float = 10.0,
        topology: str = "direct",
        max_message_size: int = 0,
    ) -> None:
        if queue_type not in QUEUE_TYPES:
            raise ConfigurationError(f"queue_type must be one of {sorted(QUEUE_TYPES)}, got {queue_type!r}.")
        if topology not in TOPOLOGIES:
            raise ConfigurationError(f"topology must be one of {sorted(TOPOLOGIES)}, got {topology!r}.")
        self.topology = topology
        self.max_message_size = max_message_size or DEFAULT_MAX_MESSAGE_SIZE
        #: One URL per node the URL names (``amqp://u:p@node1:5672,node2:5672,node3/vhost``), tried
        #: in turn from the one that answered last: a cluster's node that dies is left for the next.
        self.urls = [_with_heartbeat(node) for node in one_url_per_host(url)]
        self.url, self.queue_type, self.prefetch = self.urls[0], queue_type, prefetch
        self.connect_timeout, self.publish_timeout = connect_timeout, publish_timeout
        self.display = redact(url)
        self._connect_lock = asyncio.Lock()
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._consume_channel: AbstractChannel | None = None
        self._buffers: dict[str, asyncio.Queue[AbstractIncomingMessage]] = {}
        self._in_flight: dict[str, AbstractIncomingMessage] = {}
        self._receipts = itertools.count()
        self.declared: set[str] = set()
        #: Queues declared with their NServiceBus exchange: deleting one deletes both.
        self.addresses: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> RabbitMqTransport:
        ours = options_of(url)
        check_broker_options(ours, url)
        plain, _ = split_options(url, OWN)
        return cls(
            plain,
            queue_type=ours.get("queue_type", "classic"),
            prefetch=int(number_option(ours, "prefetch", 500, whole=True)),
            connect_timeout=number_option(ours, "connect_timeout", 10.0),
            publish_timeout=number_option(ours, "publish_timeout", 10.0),
            topology=ours.get("topology", "direct"),
            max_message_size=int(ours.get("max_message_size", DEFAULT_MAX_MESSAGE_SIZE)),
        )

    async def start(self) -> None:
        """Connect (again, after a lost connection). Wrong credentials or vhost: ConfigurationError;
        a broker that cannot be reached: TransportUnavailable."""
        async with self._connect_lock:
            if self._connection is not None and not self._connection.is_closed:
                return
            await self._drop()
            connection = await self._open_a_node()
            try:
                self._channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            except BaseException:
                await connection.close()
                raise
            self._connection = connection

    async def _open_a_node(self) -> aio_pika.Connection:
        """A connection to the first node that takes one, starting with the last that did. What
        no waiting mends (credentials, a vhost) fails at once; when no node can be reached, the
        outage names the last node's reason."""
        first = self.urls.index(self.url)
        failed: TransportUnavailable | None = None
        for url in self.urls[first:] + self.urls[:first]:
            self.url = url
            try:
                return await self._open_node()
            except TransportUnavailable as error:
                failed = error
                if len(self.urls) > 1:
                    log.warning("RabbitMQ node %s cannot be reached; trying the next", redact(url))
        self.url = self.urls[first]
        assert failed is not None
        if len(self.urls) > 1:
            raise TransportUnavailable(f"{failed} (none of its {len(self.urls)} nodes answered)")
        raise failed

    async def _open_node(self) -> aio_pika.Connection:
        """A connection to the node at :attr:`url`."""
        try:
            connection = await _open(self.url, self.connect_timeout)
        except (ProbableAuthenticationError, ConnectionNotAllowed) as error:
            raise ConfigurationError(
                f"cannot connect to {self.display}: the broker refused the connection "
                f"({one_line(error)}); check the user, password and vhost."
            ) from None
        except LINK_ERRORS as error:
            reason = one_line(error)
            if isinstance(error, TimeoutError):  # the port took the connection, then silence
                where = urlsplit(self.url)
                reason = no_answer(f"{where.hostname}:{where.port or 5672}", self.connect_timeout, "RabbitMQ")
            raise TransportUnavailable(f"cannot connect to {self.display}: {reason}") from None
        except AMQPError as error:  # e.g. the broker closing the handshake for a missing vhost
            said = "" if " object at 0x" in str(error) else f" ({one_line(error)})"  # a frame's repr
            raise ConfigurationError(
                f"cannot connect to {self.display}: the broker closed the connection while opening it"
                f"{said}; check that the vhost {_vhost(self.url)!r} exists and the user may use it."
            ) from None
        return connection

    async def _drop(self) -> None:
        """Forget a connection that failed; the next call connects again. Consumers start over
        (what they held unacknowledged goes back to its queue on the broker)."""
        connection, self._connection = self._connection, None
        self._channel = self._consume_channel = None
        self._buffers.clear()
        self._in_flight.clear()
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 1.0)
            if not connection.is_closed:
                # Closing a dead link failed or gave up half way, after aio-pika had let the
                # link go: a second close only marks the connection closed. Left unmarked, its
                # __del__ makes a close() coroutine outside the event loop that nothing awaits.
                with contextlib.suppress(Exception):
                    await connection.close()

    @property
    def channel(self) -> AbstractChannel:
        if self._channel is None:
            raise ConfigurationError("The RabbitMQ transport is not started: await transport.start() first.")
        return self._channel

    async def declare(self, queue: str) -> None:
        """Declare a durable queue of the configured type; one that exists already with other
        arguments (a quorum queue NServiceBus declared, say) is accepted as it is. With
        ``topology=conventional`` the queue's fanout exchange comes with it."""
        if self.topology == "conventional":
            await self.declare_address(queue)
        else:
            await self._declare_queue(queue)

    async def declare_address(self, queue: str) -> None:
        """The queue plus a durable fanout exchange of the same name bound to it: what an
        NServiceBus.RabbitMQ sender with the conventional routing topology publishes to. Direct
        senders (the default exchange) reach the queue as before."""
        await self._declare_queue(queue)
        channel = await self._side_channel()
        try:
            exchange = await channel.declare_exchange(queue, aio_pika.ExchangeType.FANOUT, durable=True)
            await (await channel.declare_queue(queue, passive=True)).bind(exchange, routing_key="")
            self.addresses.add(queue)
        except ChannelPreconditionFailed as error:
            raise ConfigurationError(
                f"exchange {queue!r} exists on {self.display} but is not a durable fanout exchange "
                f"({one_line(error)}); NServiceBus senders publish to it, so it must be one."
            ) from None
        finally:
            if not channel.is_closed:
                await channel.close()

    async def _side_channel(self) -> AbstractChannel:
        """A channel of its own: the broker closes a channel on a refused declaration, and the
        publishing channel must not be the one."""
        await self.start()
        assert self._connection is not None
        return await self._connection.channel()

    async def _declare_queue(self, queue: str) -> None:
        check_name("queue", queue)
        arguments: dict[str, Any] = {"x-queue-type": self.queue_type}
        channel = await self._side_channel()
        try:
            await channel.declare_queue(queue, durable=True, arguments=arguments)
        except ChannelPreconditionFailed:  # it exists with other arguments: keep it as it is
            channel = await self._side_channel()
            await channel.declare_queue(queue, passive=True)
        finally:
            if not channel.is_closed:
                await channel.close()
        self.declared.add(queue)

    async def delete(self, queue: str) -> None:
        """Delete the queue (and the exchange :meth:`declare_address` made for it)."""
        await self.start()
        await self.channel.queue_delete(queue)
        if queue in self.addresses:
            await self.channel.exchange_delete(queue)
            self.addresses.discard(queue)
        self.declared.discard(queue)

    async def publish_all(self, publishes: Sequence[Publish]) -> list[BaseException | None]:
        """Write every publish at once (persistent, ``mandatory``) and await their confirms
        together; what each came to, in order: None, or the error it ended in (a publish not
        confirmed within ``publish_timeout`` is a TimeoutError). One write and one deadline for
        the batch, not one of each per publish (see ``batchwrite``)."""
        await self.start()
        channel = await self.channel.get_underlay_channel()
        assert isinstance(channel, aiormq.Channel)
        frame_max = channel.connection.connection_tune.frame_max or DEFAULT_FRAME_MAX
        outcomes: list[BaseException | None] = [self._refusal(p, frame_max) for p in publishes]
        writable = [p for p, refused in zip(publishes, outcomes, strict=True) if refused is None]
        if not writable:
            return outcomes
        deadline = asyncio.get_running_loop().time() + self.publish_timeout
        try:
            async with asyncio.timeout_at(deadline):  # a blocked connection holds the write back
                confirms = await write_batch(channel, writable)
        except TimeoutError:
            confirms = [_failed(TimeoutError(f"not written within {self.publish_timeout:g} s"))] * len(
                writable
            )
        except LINK_ERRORS as error:
            confirms = [_failed(error)] * len(writable)
        try:
            await asyncio.wait(confirms, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        finally:  # timed out, or the caller gave up: no confirm is awaited past the batch
            for confirm in confirms:
                confirm.cancel()
        answers = iter(confirms)
        return [
            _outcome(next(answers), self.publish_timeout) if refused is None else refused
            for refused in outcomes
        ]

    def _refusal(self, p: Publish, frame_max: int) -> MessageRefused | None:
        """Why the broker could never take this publish, found before it is written: a publish
        the broker refuses closes the connection (a header table over the frame size) or the
        channel (a body over ``max_message_size``), which would look like an outage and take
        every other message of the batch down with it."""
        if len(p.routing_key.encode()) > MAX_ROUTING_KEY:
            return MessageRefused(f"the queue name is over AMQP's {MAX_ROUTING_KEY} bytes")
        if len(p.body) > self.max_message_size:
            return MessageRefused(
                f"its body is {len(p.body):,} bytes, over the broker's max_message_size of "
                f"{self.max_message_size:,} (the URL's ?max_message_size= if the broker allows more)"
            )
        headers = p.properties.headers or {}
        for name in headers:
            if len(name.encode()) > MAX_HEADER_NAME:
                return MessageRefused(
                    f"header name {name[:40]!r}... is over AMQP's {MAX_HEADER_NAME} bytes (it would be cut)"
                )
        rough = sum(len(k.encode()) + len(str(v)) * 4 + 16 for k, v in headers.items())  # in bytes, at worst
        if rough + HEADER_FRAME_SLACK > frame_max:  # near the limit: measure it exactly
            size = len(marshal(ContentHeader(properties=p.properties, body_size=len(p.body)), 1))
            if size > frame_max:
                return MessageRefused(
                    f"its headers take {size:,} bytes, over the broker's frame size of {frame_max:,} "
                    "(RabbitMQ's frame_max; a header table must fit one frame): make them smaller"
                )
        return None

    def cannot_carry(self, message: DelayedMessage) -> str | None:
        frame_max = DEFAULT_FRAME_MAX  # until started: then the broker's own
        underlay = self._connection.transport if self._connection is not None else None
        if underlay is not None:
            frame_max = underlay.connection.connection_tune.frame_max or DEFAULT_FRAME_MAX
        refused = self._refusal(self._publish_of(message), frame_max)
        return None if refused is None else str(refused)

    @staticmethod
    def _publish_of(m: DelayedMessage) -> Publish:
        return Publish("", m.destination, m.body, amqp_properties_of(m, outgoing_headers(m)))

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        if not messages:
            return []
        outcomes = await self.publish_all([self._publish_of(m) for m in messages])
        results: list[Exception | None] = []
        lost = False
        for m, outcome in zip(messages, outcomes, strict=True):
            if outcome is None:
                results.append(None)
            elif isinstance(outcome, MessageRefused):
                results.append(MessageRefused(f"RabbitMQ cannot carry message {m.message_id}: {outcome}"))
            elif isinstance(outcome, ChannelPreconditionFailed):  # the broker names this publish
                lost = True  # it closed the channel: what follows in the batch is lost with it
                results.append(
                    MessageRefused(f"RabbitMQ refused message {m.message_id}: {one_line(outcome)}")
                )
            elif isinstance(outcome, DeliveryError) and outcome.message is not None:
                results.append(
                    DestinationNotFound(f"Queue {m.destination!r} does not exist (returned unroutable).")
                )
            elif isinstance(outcome, LINK_ERRORS):
                lost = True
                results.append(TransportUnavailable(f"{self.display}: {one_line(outcome)}"))
            elif isinstance(outcome, DeliveryError):
                # a nack: the broker could not take it now (a quorum queue electing its leader
                # after a node was lost, a queue full with reject-publish), whatever the message:
                # an outage to wait out, never a failure of the message. The channel goes too: one
                # nacked by a quorum queue without a leader (RabbitMQ 3.10) went on being nacked
                # after the queue had one again, while a new channel was taken at once.
                lost = True
                results.append(
                    DestinationUnavailable(
                        f"{redact(self.url)} did not take message {m.message_id} for {m.destination!r} "
                        "(nack: the queue has no leader yet, or is full)"
                    )
                )
            elif isinstance(outcome, Exception):
                results.append(TransportError(f"publishing to {m.destination!r} failed: {outcome!r}"))
            else:
                raise outcome
        if lost:
            await self._drop()
        return results

    async def _buffer(self, queue: str) -> asyncio.Queue[AbstractIncomingMessage]:
        if self._connection is not None and self._connection.is_closed:
            await self._drop()
            raise TransportUnavailable(f"{self.display}: the connection was lost; reconnecting")
        if queue not in self._buffers:
            await self.start()
            assert self._connection is not None
            if self._consume_channel is None:
                self._consume_channel = await self._connection.channel()
                await self._consume_channel.set_qos(prefetch_count=self.prefetch)
            buffer: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            try:
                declared = await self._consume_channel.declare_queue(queue, passive=True)
            except ChannelNotFoundEntity:
                self._consume_channel = None  # the broker closed it
                raise DestinationNotFound(
                    f"Queue {queue!r} does not exist on {self.display}; declare it first "
                    f"(duetime queues declare {queue})."
                ) from None
            await declared.consume(buffer.put)
            self._buffers[queue] = buffer
        return self._buffers[queue]

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        if done:
            await self.acknowledge(done)
        buffer = await self._buffer(queue)
        taken: list[AbstractIncomingMessage] = []
        with contextlib.suppress(TimeoutError, asyncio.QueueEmpty):
            taken.append(await asyncio.wait_for(buffer.get(), wait) if wait > 0 else buffer.get_nowait())
        with contextlib.suppress(asyncio.QueueEmpty):
            while len(taken) < max_messages:
                taken.append(buffer.get_nowait())
        received = []
        hold = timedelta(0)
        for incoming in taken:
            if "x-death" in (incoming.headers or {}):  # came through the native delay levels:
                hold = max(hold, early_by(dict(incoming.headers), SYSTEM.now()))  # never early
            received.append(self._hold(queue, incoming))
        if hold > timedelta(0):  # the broker's clock ran ahead of ours: wait out the difference
            await asyncio.sleep(hold.total_seconds())
        return received

    def _hold(self, queue: str, incoming: AbstractIncomingMessage) -> ReceivedMessage:
        """An incoming message as duetime hands it out, kept until acknowledged."""
        receipt = f"{queue}:{next(self._receipts)}"
        self._in_flight[receipt] = incoming
        raw = arrival_headers(dict(incoming.headers or {}))  # the native delays' bookkeeping
        return ReceivedMessage(
            queue,
            incoming.message_id or "",
            {k: _text(v) for k, v in raw.items()},
            incoming.body,
            receipt,
            2 if incoming.redelivered else 1,
        )

    async def _browse(self, queue: str) -> tuple[AbstractChannel, Any]:
        """A channel of its own and the queue on it: what it gets and does not acknowledge goes
        back to the queue when the channel closes."""
        await self.start()
        assert self._connection is not None
        channel = await self._connection.channel()
        try:
            return channel, await channel.declare_queue(queue, passive=True)
        except ChannelNotFoundEntity:
            raise DestinationNotFound(
                f"Queue {queue!r} does not exist on {self.display}; declare it first "
                f"(duetime queues declare {queue})."
            ) from None

    async def peek(self, queue: str, limit: int) -> list[ReceivedMessage]:
        """Get up to ``limit`` without acknowledging, then close the channel: they go back, in
        their order, marked redelivered."""
        channel, declared = await self._browse(queue)
        try:
            seen: list[ReceivedMessage] = []
            while len(seen) < limit and (incoming := await declared.get(no_ack=False, fail=False)):
                seen.append(self._hold(queue, incoming))
            return seen
        finally:
            for m in seen:
                self._in_flight.pop(m.receipt, None)
            await channel.close()

    async def take(self, queue: str, message_ids: Collection[str]) -> list[ReceivedMessage]:
        """Get messages until all wanted are found or the queue has nothing more to give; the
        others go back at once, the wanted stay unacknowledged on the channel until acknowledged."""
        wanted = set(message_ids)
        channel, declared = await self._browse(queue)
        found: list[ReceivedMessage] = []
        others: list[AbstractIncomingMessage] = []
        try:
            while len(found) < len(wanted) and (incoming := await declared.get(no_ack=False, fail=False)):
                if incoming.message_id in wanted:
                    found.append(self._hold(queue, incoming))
                else:
                    others.append(incoming)
            for incoming in others:
                await incoming.nack(requeue=True)
        except BaseException:
            await channel.close()
            raise
        if not found:
            await channel.close()
        return found  # their channel stays open until acknowledged, or closes with the connection

    async def has_queue(self, queue: str) -> bool:
        try:
            channel, _ = await self._browse(queue)
        except DestinationNotFound:
            return False
        await channel.close()
        return True

    async def depth(self, queue: str) -> int:
        channel, declared = await self._browse(queue)
        await channel.close()
        return int(declared.declaration_result.message_count or 0)

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        done = 0
        for m in messages:
            incoming = self._in_flight.pop(m.receipt, None)
            if incoming is not None:
                try:
                    await incoming.ack()
                except LINK_ERRORS as error:  # the broker hands the message out again
                    await self._drop()
                    raise TransportUnavailable(f"{self.display}: {one_line(error)}") from None
                done += 1
        return done

    async def close(self) -> None:
        await self._drop()


async def _open(url: str, timeout: float) -> aio_pika.Connection:
    """``aio_pika.connect``, except that a connection that fails to open is closed: aio-pika leaves
    it open, and when it is collected outside the event loop its ``__del__`` makes a ``close()``
    coroutine that nothing awaits (a broker restart showed it)."""
    connection = aio_pika.Connection(make_url(url))
    try:
        await connection.connect(timeout=timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return connection


def _failed(error: BaseException) -> asyncio.Future[object]:
    """A publish that ended before it was written, as a settled future like the others'."""
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


def _outcome(confirm: asyncio.Future[object], timeout: float) -> BaseException | None:
    """What one publish of a batch came to: None (confirmed) or its error. Only the batch's
    deadline cancels a confirm (a closing channel fails it with its reason)."""
    if confirm.cancelled():
        return TimeoutError(f"not confirmed within {timeout:g} s")
    return confirm.exception()


def amqp_properties_of(m: DelayedMessage, headers: dict[str, Any]) -> Basic.Properties:
    """A persistent AMQP message's properties as an NServiceBus.RabbitMQ sender fills them (its
    receivers require the message-id); others get duetime's id and their content-type header."""
    named = amqp_properties(headers, m.message_id)
    return Basic.Properties(
        delivery_mode=2,
        headers=headers,
        message_id=named.get("message_id"),
        content_type=named.get("content_type"),
        correlation_id=named.get("correlation_id"),
        message_type=named.get("type"),
        reply_to=named.get("reply_to"),
    )


def _vhost(url: str) -> str:
    """The virtual host an ``amqp://`` URL names (``/`` when its path is empty)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _with_heartbeat(url: str) -> str:
    """Ask for a 10 s heartbeat unless the URL says otherwise: a partitioned connection is then
    noticed within half a minute, also by a consumer that is only waiting."""
    parts = urlsplit(url)
    if "heartbeat" in options_of(url):
        return url
    query = f"{parts.query}&heartbeat=10" if parts.query else "heartbeat=10"
    return urlunsplit(parts._replace(query=query))
