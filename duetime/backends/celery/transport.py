"""Publishes stored Celery tasks to Celery's broker with kombu, exactly as Celery's producer would.

``celery+amqp://…`` (RabbitMQ) and ``celery+redis://…`` are a Celery broker URL with ``celery+``
in front. kombu does the publishing, so the message a worker receives is the one Celery itself
would have sent: same exchange, routing key, body, headers and properties; on Redis, kombu's own
envelope and routing. RabbitMQ publishes wait for the broker's confirm (``confirm_publish``), so a
task counts as forwarded only once the broker has it. Other query options are kombu transport
options (``?global_keyprefix=app1:`` on Redis, ``?confirm_publish=false``).

kombu is blocking: the transport is a :class:`~duetime.backends.blocking.BlockingTransport`,
everything on one thread of its own, which keeps one connection and channel.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kombu import Connection, Exchange, Producer, Queue

from duetime.backends._redis_database import check_database, no_such_database
from duetime.backends.blocking import BlockingTransport
from duetime.backends.celery.envelope import PUBLISH_HEADER, CeleryPublish
from duetime.error_headers import ERROR_TYPE
from duetime.errors import (
    ConfigurationError,
    TransportUnavailable,
    server_reason,
)
from duetime.inputs.urls import options_of, redact
from duetime.message import DelayedMessage
from duetime.recurring.schedule import SCHEDULE_HEADER

BROKERS = {"celery+amqp": "amqp", "celery+amqps": "amqps", "celery+redis": "redis", "celery+rediss": "rediss"}


def _option(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def queue_from_spec(spec: dict[str, Any]) -> Queue:
    """The kombu ``Queue`` Celery declared before publishing, rebuilt from the stored fields."""
    ex = spec.get("exchange") or {}
    exchange = Exchange(
        ex.get("name", ""),
        type=ex.get("type", "direct"),
        durable=ex.get("durable", True),
        auto_delete=ex.get("auto_delete", False),
        arguments=ex.get("arguments"),
    )
    return Queue(
        spec["name"],
        exchange,
        routing_key=spec.get("routing_key"),
        durable=spec.get("durable", True),
        exclusive=spec.get("exclusive", False),
        auto_delete=spec.get("auto_delete", False),
        queue_arguments=spec.get("queue_arguments"),
        binding_arguments=spec.get("binding_arguments"),
        max_priority=spec.get("max_priority"),
    )


class CeleryTransport(BlockingTransport):
    """A duetime transport whose destination is a Celery broker."""

    def __init__(self, broker_url: str, transport_options: dict[str, Any] | None = None) -> None:
        super().__init__("duetime-celery")
        self.broker_url = broker_url
        self.transport_options = dict(transport_options or {})
        self._connection: Any = None
        self._producer: Any = None

    @classmethod
    def from_url(cls, url: str) -> CeleryTransport:
        parts = urlsplit(url)
        scheme = BROKERS.get(parts.scheme.lower())
        if scheme is None:
            raise ConfigurationError(
                f"{redact(url)} is not a Celery broker URL: write celery+amqp://… or celery+redis://…"
            )
        options = {k: _option(v) for k, v in options_of(url).items()}
        if scheme.startswith("amqp"):
            options.setdefault("confirm_publish", True)
        return cls(check_database(urlunsplit(parts._replace(scheme=scheme, query=""))), options)

    @property
    def outages(self) -> tuple[type[BaseException], ...]:
        return (*(self._connection.connection_errors if self._connection else ()), OSError)

    @property
    def shown(self) -> str:
        return f"the Celery broker {redact(self.broker_url)}"

    def _connect(self) -> None:
        if self._producer is not None:
            return
        connection = Connection(self.broker_url, transport_options=self.transport_options)
        try:
            connection.ensure_connection(max_retries=1, timeout=10)
        except Exception as error:
            connection.release()
            if (refused := no_such_database(self.broker_url, error)) is not None:
                raise refused from None
            raise TransportUnavailable(
                f"cannot connect to the Celery broker {redact(self.broker_url)}: {server_reason(error)}"
            ) from None
        self._connection = connection
        self._producer = Producer(connection.channel(), auto_declare=False)

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to release
                self._connection.release()
        self._connection = self._producer = None

    def _declare_one(self, queue: str) -> None:
        """Make sure a queue for copies duetime sends aside (its error queue) exists: one of that
        name is taken as it is (it may be shared with other systems); a missing one is made plain
        and durable. Task queues are declared as Celery declares them, with each publish."""
        self._connect()
        try:
            self._producer.channel.queue_declare(queue, passive=True)
        except self._connection.channel_errors:
            self._drop()  # the broker closed the channel (404): start clean
            self._connect()
            Queue(queue, durable=True).bind(self._producer.channel).declare()

    def _send_one(self, message: DelayedMessage) -> None:
        self._publish(message.body, self._publish_of(message))

    def _publish_of(self, message: DelayedMessage) -> CeleryPublish:
        """The task's publish when it is due; a copy of the message addressed elsewhere (the
        dispatcher's error queue) goes as it is, with its headers, to that queue."""
        text = message.headers.get(PUBLISH_HEADER)
        publish = CeleryPublish.from_header(text) if text else None
        if publish is not None and message.destination == publish.destination:
            tick = message.message_id if SCHEDULE_HEADER in message.headers else None
            return publish.due(message.due_at, task_id=tick)
        if publish is None and ERROR_TYPE not in message.headers:
            CeleryPublish.from_header(text)  # raises: not stored by the bridge
        return CeleryPublish(
            exchange="",
            routing_key=message.destination,
            headers=dict(message.headers),
            properties={"message_id": message.message_id},
            content_type=publish.content_type if publish else "application/octet-stream",
            content_encoding=publish.content_encoding if publish else "binary",
            declare=None,  # the error queue: made sure of by declare(), taken as it is
        )

    def _publish(self, body: bytes, publish: CeleryPublish) -> None:
        declare = [queue_from_spec(publish.declare)] if publish.declare else None
        self._producer.publish(
            body,
            exchange=publish.exchange,
            routing_key=publish.routing_key,
            headers=publish.headers,
            content_type=publish.content_type,
            content_encoding=publish.content_encoding,
            delivery_mode=publish.delivery_mode,
            declare=declare,
            retry=False,
            **publish.properties,
        )
