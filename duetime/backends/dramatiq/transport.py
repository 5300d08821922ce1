"""Enqueues stored Dramatiq messages on their actor's queue through a Dramatiq broker of its own.

``dramatiq+amqp://…`` (RabbitMQ) and ``dramatiq+redis://…`` are the broker's URL with ``dramatiq+``
in front. The message is decoded with Dramatiq's encoder (the JSON default; set the same encoder
as the application with ``dramatiq.set_encoder`` in a process that embeds the dispatcher) and
enqueued without a delay, exactly as the application's broker enqueues it: on RabbitMQ the
queue and its ``.DQ``/``.XQ`` companions are declared as Dramatiq declares them and each publish
waits for the broker's confirm; on Redis it goes through Dramatiq's own enqueue script.

Options: ``?max_priority=N`` (RabbitMQ, as the workers' broker has it: RabbitMQ refuses a queue
declared with other arguments) and ``?namespace=…`` (Redis, default ``dramatiq``).

Dramatiq's brokers are blocking: everything runs on one thread of their own.
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dramatiq import Broker, Message
from dramatiq.errors import BrokerConnectionError, DecodeError

from duetime.backends._redis_database import check_database, no_such_database
from duetime.backends.blocking import BlockingTransport
from duetime.error_headers import ERROR_TYPE
from duetime.errors import (
    ConfigurationError,
    InvalidMessage,
    TransportUnavailable,
    server_reason,
)
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact, url_options
from duetime.message import DelayedMessage
from duetime.recurring.schedule import SCHEDULE_HEADER

BROKERS = {
    "dramatiq+amqp": "amqp",
    "dramatiq+amqps": "amqps",
    "dramatiq+redis": "redis",
    "dramatiq+rediss": "rediss",
}


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean the broker is unreachable (not that one message was refused)."""
    errors: list[type[BaseException]] = [BrokerConnectionError, OSError]
    try:
        import pika.exceptions

        errors.append(pika.exceptions.AMQPConnectionError)
    except ImportError:  # the Redis broker only
        pass
    try:
        import redis.exceptions

        errors += [redis.exceptions.ConnectionError, redis.exceptions.TimeoutError]
    except ImportError:  # the RabbitMQ broker only
        pass
    return tuple(errors)


class DramatiqTransport(BlockingTransport):
    """A duetime transport whose destination is a Dramatiq actor's queue."""

    def __init__(
        self, broker_url: str, *, max_priority: int | None = None, namespace: str = "dramatiq"
    ) -> None:
        super().__init__("duetime-dramatiq")
        self.broker_url = broker_url
        self.max_priority = max_priority
        self.namespace = namespace
        self._broker: Broker | None = None
        self._unavailable = _unavailable_errors()

    @classmethod
    def from_url(cls, url: str) -> DramatiqTransport:
        parts = urlsplit(url)
        scheme = BROKERS.get(parts.scheme.lower())
        if scheme is None:
            raise ConfigurationError(
                f"{redact(url)} is not a Dramatiq broker URL: write dramatiq+amqp://… or dramatiq+redis://…"
            )
        _, given = url_options(url, ("max_priority", "namespace"), "Dramatiq")
        options = {name: value for name, value in given.items() if value}  # a blank one: the default
        priority = options.get("max_priority")
        if priority is not None and not (priority.isdigit() and 0 < int(priority) <= 255):
            raise ConfigurationError(f"max_priority must be a whole number from 1 to 255, got {priority!r}.")
        return cls(
            check_database(urlunsplit(parts._replace(scheme=scheme, query=""))),
            max_priority=int(priority) if priority else None,
            namespace=options.get("namespace", "dramatiq"),
        )

    @property
    def outages(self) -> tuple[type[BaseException], ...]:
        return self._unavailable

    @property
    def shown(self) -> str:
        return f"the Dramatiq broker {redact(self.broker_url)}"

    def _connect(self) -> Broker:
        if self._broker is not None:
            return self._broker
        try:
            if self._amqp:
                from dramatiq.brokers.rabbitmq import RabbitmqBroker

                broker: Broker = RabbitmqBroker(
                    url=self.broker_url, confirm_delivery=True, max_priority=self.max_priority, middleware=[]
                )
                _ = broker.channel  # type: ignore[attr-defined]  # connects now, so an outage shows here
            else:
                from dramatiq.brokers.redis import RedisBroker

                redis_broker = RedisBroker(url=self.broker_url, namespace=self.namespace, middleware=[])  # type: ignore[no-untyped-call]
                redis_broker.client.ping()
                broker = redis_broker
        except self._unavailable as error:
            raise TransportUnavailable(
                f"cannot connect to the Dramatiq broker {redact(self.broker_url)}: {server_reason(error)}"
            ) from None
        except Exception as error:  # a Redis database the server does not have: it never will
            if (refused := no_such_database(self.broker_url, error)) is not None:
                raise refused from None
            raise
        self._broker = broker
        return broker

    def _drop(self) -> None:
        if self._broker is not None:
            with contextlib.suppress(Exception):  # already broken: nothing more to release
                self._broker.close()
        self._broker = None

    def _declare_one(self, queue: str) -> None:
        """Make sure a queue for copies duetime sends aside (its error queue) exists. On RabbitMQ a
        queue of that name is taken as it is (it may be shared with other systems: declaring it
        with Dramatiq's arguments would be refused); a missing one is made plain and durable.
        Actor queues need nothing: Dramatiq declares them as it enqueues."""
        broker = self._connect()
        if not self._amqp:
            return  # Redis: a queue exists once something is in it
        import pika.exceptions

        try:
            broker.channel.queue_declare(queue, passive=True)  # type: ignore[attr-defined]
        except pika.exceptions.ChannelClosedByBroker:
            del broker.channel  # type: ignore[attr-defined]  # the broker closed it (404)
            broker.channel.queue_declare(queue, durable=True)  # type: ignore[attr-defined]

    @property
    def _amqp(self) -> bool:
        return self.broker_url.startswith("amqp")

    def _send_aside(self, broker: Broker, message: Message[Any], headers: dict[str, str]) -> None:
        """A copy for the error queue, published as it is: on RabbitMQ to the queue ``declare``
        made sure of (Dramatiq's enqueue would declare it with its own arguments), with the
        reason in its headers too, where ``duetime errors`` reads it."""
        if not self._amqp:
            broker.enqueue(message)
            return
        import pika

        broker.channel.basic_publish(  # type: ignore[attr-defined]
            exchange="",
            routing_key=message.queue_name,
            body=message.encode(),
            properties=pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers),
            mandatory=True,
        )

    @staticmethod
    def _message_of(stored: DelayedMessage) -> Message[Any]:
        """The actor's message; a copy addressed elsewhere (the dispatcher's error queue) goes to
        that queue with the reason in its ``duetime_error`` option, for people to read."""
        try:
            message = Message.decode(stored.body)
        except DecodeError as error:
            if ERROR_TYPE not in stored.headers:
                raise InvalidMessage(
                    f"message {stored.message_id} is not a Dramatiq message: {error.__cause__!r}"
                ) from None
            message = Message(
                queue_name=stored.destination,
                actor_name="duetime.undecodable",
                args=(stored.body.decode("utf-8", "replace"),),
                kwargs={},
                options={},
                message_id=stored.message_id,
            )
        if stored.destination == message.queue_name:
            # each tick of a recurring schedule is a message of its own to the worker
            return (
                message.copy(message_id=stored.message_id) if SCHEDULE_HEADER in stored.headers else message
            )
        if ERROR_TYPE not in stored.headers:
            raise InvalidMessage(
                f"message {stored.message_id} is for queue {message.queue_name!r}, not {stored.destination!r}."
            )
        return message.copy(
            queue_name=check_name("queue", stored.destination),
            options={"duetime_error": dict(stored.headers)},
        )

    def _send_one(self, stored: DelayedMessage) -> None:
        message = self._message_of(stored)
        broker = self._connect()
        if ERROR_TYPE in stored.headers:
            self._send_aside(broker, message, dict(stored.headers))
        else:
            broker.enqueue(message)
