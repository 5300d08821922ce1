"""How a Celery task publish is kept in a duetime message, written by the bridge and read back by the transport.

The body is the task message exactly as Celery serialized (and compressed) it. One header,
``celery-publish``, holds the rest of the publish as JSON: where it goes (exchange, routing key,
the queue Celery would declare first) and the AMQP headers and properties, so the transport can
repeat the publish Celery was about to make, only later. ``celery-task`` names the task, for
people reading ``duetime list``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kombu.utils.json import dumps, loads

from duetime.errors import InvalidMessage

PUBLISH_HEADER = "celery-publish"
TASK_HEADER = "celery-task"

#: kombu's native delayed delivery puts the delay in the first 28 words of the routing key.
_DELAY_WORDS = re.compile(r"^(?:[01]\.){28}")
NO_DELAY = "0." * 28


@dataclass
class CeleryPublish:
    """One ``Producer.publish`` of a task message, minus the body."""

    exchange: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any] = field(default_factory=dict)
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    delivery_mode: int | None = 2
    #: The queue Celery declares before publishing (kombu's ``Queue.as_dict``-like fields), or None.
    declare: dict[str, Any] | None = None
    #: The duetime destination the bridge gave the task; a copy of the message sent elsewhere
    #: (to the error queue) is not the task's publish.
    destination: str = ""

    def to_header(self) -> str:
        return str(
            dumps(
                {
                    "exchange": self.exchange,
                    "routing_key": self.routing_key,
                    "headers": self.headers,
                    "properties": self.properties,
                    "content_type": self.content_type,
                    "content_encoding": self.content_encoding,
                    "delivery_mode": self.delivery_mode,
                    "declare": self.declare,
                    "destination": self.destination,
                }
            )
        )

    @classmethod
    def from_header(cls, text: str | None) -> CeleryPublish:
        if not text:
            raise InvalidMessage(
                f"this message has no {PUBLISH_HEADER} header: it was not stored by the duetime Celery "
                "bridge, so a celery+ transport cannot publish it (send it with another transport)."
            )
        try:
            data = loads(text)
            return cls(
                exchange=str(data["exchange"]),
                routing_key=str(data["routing_key"]),
                headers=dict(data["headers"]),
                properties=dict(data.get("properties") or {}),
                content_type=str(data["content_type"]),
                content_encoding=str(data["content_encoding"]),
                delivery_mode=data.get("delivery_mode"),
                declare=data.get("declare"),
                destination=str(data.get("destination") or ""),
            )
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            raise InvalidMessage(
                f"the {PUBLISH_HEADER} header is not what the bridge writes: {error!r}"
            ) from None

    def due(self, due_at: datetime, *, task_id: str | None = None) -> CeleryPublish:
        """The publish as it leaves when due: the worker sees the stored due time as the ETA (a
        rescheduled task carries its new time), and a routing key meant for RabbitMQ's native
        delayed delivery asks for no delay (the store did the waiting). ``task_id``: the task
        gets that id (each tick of a recurring schedule is a task of its own)."""
        headers = dict(self.headers)
        properties = dict(self.properties)
        if headers.get("eta"):
            headers["eta"] = due_at.isoformat()
        if task_id is not None:
            headers["id"] = headers["root_id"] = task_id
            properties["correlation_id"] = task_id
        return CeleryPublish(
            self.exchange,
            without_delay(self.routing_key),
            headers,
            properties,
            self.content_type,
            self.content_encoding,
            self.delivery_mode,
            self.declare,
            self.destination,
        )


def without_delay(routing_key: str) -> str:
    """A native-delay routing key with all 28 delay bits zero (straight through the levels)."""
    return _DELAY_WORDS.sub(NO_DELAY, routing_key, count=1)


def unprefixed(routing_key: str) -> str:
    """The routing key the task was routed with, before native delayed delivery prefixed it."""
    return _DELAY_WORDS.sub("", routing_key, count=1)
