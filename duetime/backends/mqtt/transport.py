"""MQTT 5 (paho-mqtt): each message published with QoS 1 to the topic its destination names.

MQTT has no delayed delivery (only broker extensions such as EMQX's ``$delayed/`` topics), and a
topic keeps nothing for a subscriber that is not there. So:

- **Publishing**: QoS 1, the broker's PUBACK awaited; a reason code of 0x80 or more (not
  authorized, quota exceeded, a packet too large) is that message's refusal (the error queue),
  a lost connection an outage. The message's headers go as user properties, with ``message-id``
  and ``duetime-due-at`` (MQTT has no id of its own); ``content-type`` as the content type. A
  message is never retained unless its ``mqtt-retain`` header is ``true``.
- **A topic as a queue**: ``declare`` (``duetime setup --queue``, ``duetime queues declare``)
  makes a persistent session subscribed to the topic with QoS 1, so the broker keeps what is
  published while nobody reads; ``receive`` takes from that session and ``acknowledge`` sends
  the PUBACKs, so ``duetime queues receive`` and a program using ``receive`` lose nothing between
  two reads. (Mosquitto keeps sessions in memory unless ``persistence true``.)

Topic names are checked: no wildcards (``+``, ``#``), no ``$`` topics (the broker's own), no NUL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
import threading
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from duetime.backends.transport_base import AsyncClientTransport
from duetime.errors import (
    ConfigurationError,
    MessageRefused,
    TransportUnavailable,
    connection_failed,
)
from duetime.inputs.urls import number_option, redact, url_options
from duetime.interfaces import ReceivedMessage
from duetime.message import DelayedMessage, new_message_id, outgoing_headers

#: The message header that asks for a retained publish.
RETAIN_HEADER = "mqtt-retain"
#: The user property that carries the message id.
ID_PROPERTY = "message-id"
#: How long a topic's session (its subscription and what waits in it) outlives its last reader.
SESSION_EXPIRY = 7 * 24 * 3600
OPTIONS = ("client_id", "connect_timeout", "publish_timeout")


def check_topic(topic: str) -> str:
    """A topic a message may be published to, or MessageRefused saying why not."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        raise MessageRefused(f"{topic!r} is not a topic to publish to: no wildcards (+, #) and no NUL")
    if topic.startswith("$"):
        raise MessageRefused(f"{topic!r} is the broker's own ($ topics): publish to another")
    if len(topic.encode("utf-8", "surrogatepass")) > 65535:
        raise MessageRefused("a topic is at most 65,535 bytes")
    return topic


class _Connection:
    """One paho client on its network thread, its callbacks handed to the event loop."""

    def __init__(self, transport: MqttTransport, client_id: str, clean_start: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
            reconnect_on_failure=False,  # the transport reconnects (a second client of one id would fight it)
        )
        self.clean_start = clean_start
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(0)
        if transport.username is not None:
            self.client.username_pw_set(transport.username, transport.password)
        if transport.tls:
            self.client.tls_set_context(ssl.create_default_context())
        self.connected: asyncio.Future[ReasonCode] = self.loop.create_future()
        self.pending: dict[int, asyncio.Future[ReasonCode]] = {}
        self.early: dict[int, ReasonCode] = {}
        self.lock = threading.Lock()
        self.arrived: asyncio.Queue[mqtt.MQTTMessage] = asyncio.Queue()
        self.subscribed: dict[int, asyncio.Future[list[ReasonCode]]] = {}
        #: SUBACKs that came before ``subscribe`` noted their mid (paho's thread is that quick).
        self.early_subscribed: dict[int, list[ReasonCode]] = {}
        self.lost: str | None = None
        self.maximum_packet: int | None = None
        #: the packet ids of messages handed out and not yet acknowledged
        self.held: set[int] = set()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe

    async def open(self, host: str, port: int, timeout: float) -> None:
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 0 if self.clean_start else SESSION_EXPIRY
        try:
            await asyncio.to_thread(
                self.client.connect, host, port, 30, clean_start=self.clean_start, properties=properties
            )
        except OSError as error:
            raise connection_failed(f"mqtt://{host}:{port}", error) from error
        self.client.loop_start()
        try:
            code = await asyncio.wait_for(asyncio.shield(self.connected), timeout)
        except TimeoutError:
            self.close()
            raise TransportUnavailable(
                f"mqtt://{host}:{port} did not accept the connection in {timeout:g} s"
            ) from None
        if code.is_failure:
            self.close()
            if code.value in (0x86, 0x87, 0x8C):  # bad user or password, not authorized, bad authentication
                raise ConfigurationError(f"mqtt://{host}:{port} refused the connection: {code}")
            raise TransportUnavailable(f"mqtt://{host}:{port} refused the connection: {code}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        with contextlib.suppress(Exception):
            self.client.loop_stop()

    def _set(self, future: asyncio.Future[Any], value: Any) -> None:
        if not future.done():
            future.set_result(value)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, code: ReasonCode, properties: Any) -> None:
        size = getattr(properties, "MaximumPacketSize", None) if properties is not None else None
        self.maximum_packet = int(size) if size else None
        self._tell(self._set, self.connected, code)

    def _tell(self, callback: Any, *args: Any) -> None:
        """Hand an event of paho's network thread to the event loop. A loop closed already (its
        program ended before this connection did) has nobody waiting to hear it: the event is
        dropped, never raised in paho's thread."""
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self.loop.call_soon_threadsafe(callback, *args)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, code: ReasonCode, properties: Any
    ) -> None:
        self.lost = f"the connection was lost ({code})"

        def fail_all() -> None:
            with self.lock:
                pending, self.pending = self.pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(TransportUnavailable(self.lost))

        self._tell(fail_all)

    def _on_publish(self, client: Any, userdata: Any, mid: int, code: ReasonCode, properties: Any) -> None:
        with self.lock:
            future = self.pending.pop(mid, None)
            if future is None:  # answered before publish() could note it
                self.early[mid] = code
        if future is not None:
            self._tell(self._set, future, code)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self._tell(self.arrived.put_nowait, message)

    def _on_subscribe(
        self, client: Any, userdata: Any, mid: int, codes: list[ReasonCode], properties: Any
    ) -> None:
        with self.lock:
            future = self.subscribed.pop(mid, None)
            if future is None:  # answered before subscribe() could note it, as a PUBACK can be
                self.early_subscribed[mid] = codes
        if future is not None:
            self._tell(self._set, future, codes)

    def publish(
        self, topic: str, body: bytes, properties: Properties, retain: bool
    ) -> asyncio.Future[ReasonCode]:
        """The PUBACK's reason code, when it comes. paho is called without our lock held (its
        network thread holds its own while it calls back into ours: holding ours here deadlocked
        the two); a PUBACK that came before the mid was noted waits in ``early``."""
        future: asyncio.Future[ReasonCode] = self.loop.create_future()
        info = self.client.publish(topic, body, qos=1, retain=retain, properties=properties)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            future.set_exception(TransportUnavailable(self.lost or mqtt.error_string(info.rc)))
            return future
        with self.lock:
            code = self.early.pop(info.mid, None)
            if code is None:
                self.pending[info.mid] = future
        if code is not None:
            future.set_result(code)
        return future

    async def subscribe(self, topic: str, timeout: float) -> None:
        future: asyncio.Future[list[ReasonCode]] = self.loop.create_future()
        code, mid = self.client.subscribe(topic, qos=1)
        if code != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise TransportUnavailable(f"cannot subscribe to {topic!r}: {mqtt.error_string(code)}")
        with self.lock:
            early = self.early_subscribed.pop(mid, None)
            if early is None:
                self.subscribed[mid] = future
        if early is not None:
            future.set_result(early)
        try:
            codes = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with self.lock:
                self.subscribed.pop(mid, None)
            raise TransportUnavailable(
                f"the broker did not confirm a subscription to {topic!r} in {timeout:g} s; try again"
            ) from None
        if any(c.is_failure for c in codes):
            raise MessageRefused(f"the broker refused a subscription to {topic!r}: {codes[0]}")


class MqttTransport(AsyncClientTransport):
    """``mqtt://[user:password@]host[:port]`` (``mqtts://`` over TLS, port 8883 by default).

    On :class:`~duetime.backends.transport_base.AsyncClientTransport`: a batch is published at
    once (QoS 1), and each PUBACK awaited after."""

    def __init__(
        self,
        url: str,
        *,
        client_id: str | None = None,
        connect_timeout: float = 10.0,
        publish_timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ConfigurationError(f"an MQTT URL is mqtt://host:port (or mqtts://); got {redact(url)!r}.")
        self.url = url
        self.tls = parts.scheme == "mqtts"
        self.host = parts.hostname
        self.port = parts.port or (8883 if self.tls else 1883)
        self.username = unquote(parts.username) if parts.username is not None else None
        self.password = unquote(parts.password) if parts.password is not None else None
        self.client_id = client_id or f"duetime-{uuid.uuid4().hex[:12]}"
        self.connect_timeout = connect_timeout
        self.publish_timeout = publish_timeout
        self._publisher: _Connection | None = None
        self._readers: dict[str, _Connection] = {}

    @classmethod
    def from_url(cls, url: str) -> MqttTransport:
        """``?client_id=`` names the publisher (default: a new one each start);
        ``connect_timeout`` and ``publish_timeout`` are seconds."""
        base, options = url_options(url, OPTIONS, "An MQTT transport")
        return cls(
            base,
            client_id=options.get("client_id"),
            connect_timeout=number_option(options, "connect_timeout", 10.0),
            publish_timeout=number_option(options, "publish_timeout", 30.0),
        )

    async def _open(self) -> None:
        publisher = self._publisher
        # paho's own state too: it knows of a lost connection a moment before its callback sets `lost`
        if publisher is not None and publisher.lost is None and publisher.client.is_connected():
            return
        if self._publisher is not None:
            self._publisher.close()
        connection = _Connection(self, self.client_id, clean_start=True)
        await connection.open(self.host, self.port, self.connect_timeout)
        self._publisher = connection

    async def _let_go(self) -> None:
        for connection in [self._publisher, *self._readers.values()]:
            if connection is not None:
                await asyncio.to_thread(connection.close)
        self._publisher, self._readers = None, {}

    async def declare(self, queue: str) -> None:
        """A persistent session subscribed to the topic, so what is published to it waits there."""
        try:
            check_topic(queue)
        except MessageRefused as wrong:
            raise ConfigurationError(str(wrong)) from None
        await self._reader(queue)

    async def delete(self, queue: str) -> None:
        """End the topic's session: its subscription, and what waits in it, are gone."""
        reader = self._readers.pop(queue, None)
        if reader is not None:
            await asyncio.to_thread(reader.close)
        ending = _Connection(self, _session_id(self.host, self.port, queue), clean_start=True)
        await ending.open(self.host, self.port, self.connect_timeout)
        await asyncio.to_thread(ending.close)

    async def _ready(self) -> None:
        if self._publisher is None or self._publisher.lost is not None:
            raise TransportUnavailable(self._publisher.lost if self._publisher else "not started")

    def _hand_over(self, message: DelayedMessage) -> Awaitable[Exception | None]:
        publisher = self._publisher
        assert publisher is not None  # _ready said so
        topic = check_topic(message.destination)
        properties, retain = _publish_properties(message)
        size = len(message.body) + len(topic) + sum(len(k) + len(v) for k, v in message.headers.items())
        if publisher.maximum_packet is not None and size > publisher.maximum_packet:
            raise MessageRefused(f"over the broker's largest packet ({publisher.maximum_packet:,} bytes)")
        return self._acknowledged(publisher.publish(topic, message.body, properties, retain))

    async def _acknowledged(self, puback: asyncio.Future[ReasonCode]) -> Exception | None:
        """The broker's answer to one publish: None for its PUBACK, else why not."""
        try:
            code = await asyncio.wait_for(puback, self.publish_timeout)
        except TimeoutError:
            return TransportUnavailable(f"no PUBACK in {self.publish_timeout:g} s")
        except TransportUnavailable as lost:
            return lost
        return MessageRefused(f"the broker refused it: {code}") if code.is_failure else None

    async def _reader(self, topic: str) -> _Connection:
        connection = self._readers.get(topic)
        if connection is not None and connection.lost is None:
            return connection
        client_id = (
            "duetime-q-" + hashlib.sha256(f"{self.host}:{self.port}/{topic}".encode()).hexdigest()[:20]
        )
        connection = _Connection(self, client_id, clean_start=False)
        await connection.open(self.host, self.port, self.connect_timeout)
        await connection.subscribe(topic, self.connect_timeout)
        self._readers[topic] = connection
        return connection

    async def receive(
        self, queue: str, max_messages: int, wait: float, *, done: Sequence[ReceivedMessage] = ()
    ) -> list[ReceivedMessage]:
        if done:
            await self.acknowledge(done)
        connection = await self._reader(check_topic(queue))
        taken: list[ReceivedMessage] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while len(taken) < max_messages:
            try:
                if taken:
                    item = connection.arrived.get_nowait()
                else:
                    item = await asyncio.wait_for(connection.arrived.get(), max(0.0, deadline - loop.time()))
            except (TimeoutError, asyncio.QueueEmpty):
                break
            connection.held.add(item.mid)
            taken.append(_received(queue, item))
        return taken

    async def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        count = 0
        for m in messages:
            connection = self._readers.get(m.queue)
            if connection is None or int(m.receipt) not in connection.held:
                continue  # acknowledged already, or its session's connection is gone: it comes again
            connection.held.discard(int(m.receipt))
            code = connection.client.ack(int(m.receipt), 1)
            count += code == MQTTErrorCode.MQTT_ERR_SUCCESS
        return count


def _session_id(host: str, port: int, topic: str) -> str:
    """The client id of a topic's session: the same for every reader of that topic on that broker."""
    return "duetime-q-" + hashlib.sha256(f"{host}:{port}/{topic}".encode()).hexdigest()[:20]


def _publish_properties(message: DelayedMessage) -> tuple[Properties, bool]:
    headers = outgoing_headers(message)
    retain = headers.pop(RETAIN_HEADER, "").strip().lower() == "true"
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    content_type = headers.get("content-type")
    if content_type:
        properties.ContentType = content_type
    pairs = [(ID_PROPERTY, message.message_id), *headers.items()]
    for name, value in pairs:
        if "\x00" in name or "\x00" in value:
            raise MessageRefused(f"header {name!r} holds a NUL, which MQTT's user properties cannot carry")
    properties.UserProperty = pairs
    return properties, retain


def _received(topic: str, item: mqtt.MQTTMessage) -> ReceivedMessage:
    props = getattr(item, "properties", None)
    pairs = list(getattr(props, "UserProperty", []) or [])
    headers = {str(k): str(v) for k, v in pairs if k != ID_PROPERTY}
    # a publisher's message without an id gets one of its own (a redelivery of it is then new)
    message_id = next((str(v) for k, v in pairs if k == ID_PROPERTY), "") or new_message_id()
    return ReceivedMessage(
        topic, message_id, headers, bytes(item.payload), str(item.mid), 2 if item.dup else 1
    )
