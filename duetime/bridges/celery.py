"""Celery tasks sent with ``countdown`` or ``eta`` are stored in duetime instead of waiting in a worker.

Install it once where the Celery app is made (the module workers import too, so a task's own
``self.retry(countdown=…)`` is stored as well)::

    app = Celery("shop", broker="amqp://guest:guest@localhost//")
    bridge = duetime.bridges.celery.install(app, store="postgresql://…/duetime")

and run ``duetime run --store postgresql://…/duetime --transport celery+amqp://guest:guest@localhost//``
beside the workers. ``apply_async(countdown=…)`` then goes through Celery as usual (routing,
serialization, signals) up to the moment Celery would publish; the bridge keeps that publish
in the store and the dispatcher makes it, through kombu, when it is due. An unmodified worker
runs the task; its id stays the Celery task id, so ``AsyncResult(id).revoke()`` cancels it in the
store too, and :meth:`CeleryBridge.reschedule` moves it.

Each stored task belongs to the group named after its task id (a retry of the same task is
stored under ``<id>.retry-<n>``, the first may still be in flight): cancelling by task id
cancels every copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import Any

from kombu import Queue
from kombu.compression import compress
from kombu.serialization import dumps

from duetime.backends.celery.envelope import PUBLISH_HEADER, TASK_HEADER, CeleryPublish, unprefixed
from duetime.bridges.store import ProcessClient, as_timedelta, put_recurring
from duetime.errors import ConfigurationError
from duetime.message import Delay
from duetime.recurring import Recurrence, Schedule
from duetime.settings import DEFAULT_ENDPOINT

#: ``Producer.publish`` arguments that say how to publish, not what: not kept.
_HOW = ("retry", "retry_policy", "timeout", "confirm_timeout", "mandatory", "immediate")


class _Taking(threading.local):
    """Per thread: while :meth:`CeleryBridge.recurring` takes a task's publish, where to put it."""

    value: list[tuple[str, bytes, CeleryPublish, str]] | None = None


class _Capture:
    """Stands in for Celery's producer for one publish: records it instead of sending it."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.published: tuple[Any, dict[str, Any]] | None = None

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.published = (body, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def queue_spec(queue: Any) -> dict[str, Any] | None:
    """The fields of the kombu ``Queue`` Celery declares before publishing, as JSON."""
    if not isinstance(queue, Queue) or not queue.name:
        return None
    exchange = queue.exchange
    return {
        "name": queue.name,
        "routing_key": queue.routing_key,
        "durable": queue.durable,
        "exclusive": queue.exclusive,
        "auto_delete": queue.auto_delete,
        "queue_arguments": queue.queue_arguments,
        "binding_arguments": queue.binding_arguments,
        "max_priority": queue.max_priority,
        "exchange": None
        if exchange is None
        else {
            "name": exchange.name,
            "type": exchange.type,
            "durable": exchange.durable,
            "auto_delete": exchange.auto_delete,
            "arguments": exchange.arguments,
        },
    }


def stored_publish(body: Any, kwargs: dict[str, Any]) -> tuple[bytes, CeleryPublish, str]:
    """Serialize (and compress) the body as kombu's producer would, and keep the rest of the
    publish; with the queue it is meant for, as the duetime destination."""
    kw = dict(kwargs)
    headers = dict(kw.pop("headers", None) or {})
    content_type, content_encoding, data = dumps(body, serializer=kw.pop("serializer", None))
    if isinstance(data, str):
        data = data.encode(content_encoding or "utf-8")
    compression = kw.pop("compression", None)
    if compression:
        data, headers["compression"] = compress(data, compression)
    exchange = kw.pop("exchange", "") or ""
    exchange_name = str(getattr(exchange, "name", exchange) or "")
    routing_key = str(kw.pop("routing_key", "") or "")
    declare = kw.pop("declare", None) or []
    spec = next((s for s in map(queue_spec, declare) if s is not None), None)
    delivery_mode = kw.pop("delivery_mode", None)
    for name in _HOW:
        kw.pop(name, None)
    properties = {k: v for k, v in kw.items() if v is not None}
    destination = (spec or {}).get("name") or unprefixed(routing_key) or exchange_name or "celery"
    publish = CeleryPublish(
        exchange=exchange_name,
        routing_key=routing_key,
        headers=headers,
        properties=properties,
        content_type=str(content_type),
        content_encoding=str(content_encoding),
        delivery_mode=delivery_mode,
        declare=spec,
        destination=destination,
    )
    return bytes(data), publish, destination


def eta_of(value: Any, timezone: tzinfo) -> datetime | None:
    """A task message's ``eta`` header as an aware time (naive ones are in the app's timezone)."""
    if not value:
        return None
    eta = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return eta if eta.tzinfo is not None else eta.replace(tzinfo=timezone)


class CeleryBridge:
    """Stores the app's delayed tasks in duetime; see the module's documentation."""

    def __init__(
        self, app: Any, store: str | None = None, *, endpoint: str = DEFAULT_ENDPOINT, min_delay: Delay = 0
    ) -> None:
        if not (hasattr(app, "amqp") and hasattr(app, "control")):
            raise ConfigurationError(
                f"install() takes a Celery app (celery.Celery(...)), got {type(app).__name__}."
            )
        self.app = app
        self.client = ProcessClient(store, endpoint)
        self.min_delay = as_timedelta(min_delay)
        self._send: Callable[..., Any] | None = None
        self._revoke: Callable[..., Any] | None = None
        #: Set by :meth:`recurring` while it takes a task's publish instead of storing it.
        self._taking = _Taking()

    def install(self) -> CeleryBridge:
        """Route the app's delayed publishes and revokes through the bridge (once; idempotent)."""
        amqp = self.app.amqp
        installed = getattr(amqp.send_task_message, "__self__", None) is self
        if installed:
            return self
        self._send = amqp.send_task_message
        amqp.send_task_message = self.send_task_message
        control = self.app.control
        self._revoke = control.revoke
        control.revoke = self.revoke
        return self

    def send_task_message(self, producer: Any, name: str, message: Any, **options: Any) -> Any:
        """Celery's ``send_task_message``: a task due later than ``min_delay`` from now is stored."""
        assert self._send is not None
        headers = message[0]
        due = eta_of(headers.get("eta") if isinstance(headers, dict) else None, self.app.timezone)
        if due is None or due - datetime.now(UTC) < self.min_delay or due <= datetime.now(UTC):
            return self._send(producer, name, message, **options)
        capture = _Capture(producer)
        self._send(capture, name, message, **options)
        if capture.published is None:  # Celery decided not to publish (nothing to keep)
            return None
        body, publish, destination = stored_publish(*capture.published)
        if self._taking.value is not None:  # recurring(): the task's publish, kept as a schedule's
            self._taking.value.append((destination, body, publish, name))
            return None
        task_id = str(headers["id"])
        retries = int(headers.get("retries") or 0)
        self.client.get().schedule(
            destination,
            body,
            due_at=due,
            headers={PUBLISH_HEADER: publish.to_header(), TASK_HEADER: name},
            message_id=task_id if not retries else f"{task_id}.retry-{retries}",
            group=task_id,
        )
        return None

    def recurring(self, schedule_id: str, signature: Any, *, when: Recurrence) -> Schedule:
        """Run the task ``signature`` (``close_invoices.s(7)``) at every time ``when`` gives,
        each tick a task of its own (its id the tick's message id): what a ``beat_schedule``
        entry did, sent once per tick however many dispatchers run. A schedule with that id is
        changed to this one (from its next tick), so the app may say it at every start."""
        taken: list[tuple[str, bytes, CeleryPublish, str]] = []
        self._taking.value = taken
        try:
            signature.apply_async(countdown=max(3600, self.min_delay.total_seconds() + 3600))
        finally:
            self._taking.value = None
        if not taken:
            raise ConfigurationError("Celery did not publish that task; nothing to repeat.")
        destination, body, publish, name = taken[0]
        headers = {PUBLISH_HEADER: publish.to_header(), TASK_HEADER: name}
        return put_recurring(self.client.get(), schedule_id, destination, body, when, headers)

    def revoke(self, task_id: str | list[str], *args: Any, **kwargs: Any) -> Any:
        """``app.control.revoke``: cancel the stored copies too, then tell the workers as usual
        (which covers a task already forwarded)."""
        assert self._revoke is not None
        for one in [task_id] if isinstance(task_id, str) else list(task_id):
            self.cancel(one)
        return self._revoke(task_id, *args, **kwargs)

    def cancel(self, task_id: str) -> int:
        """Cancel the stored task (and its stored retries); how many were removed."""
        return self.client.get().cancel_group(str(task_id))

    def reschedule(self, task_id: str, *, countdown: Delay | None = None, eta: datetime | None = None) -> int:
        """Move the stored task to ``countdown`` from now or to ``eta``; how many moved (0: it
        was already sent, or never stored)."""
        client = self.client.get()
        moved = 0
        for message in client.list(group=str(task_id), limit=10_000).messages:
            moved += client.reschedule(message.message_id, delay=countdown, due_at=eta)
        return moved

    def close(self) -> None:
        self.client.close()


def install(
    app: Any, store: str | None = None, *, endpoint: str = DEFAULT_ENDPOINT, min_delay: Delay = 0
) -> CeleryBridge:
    """Keep ``app``'s tasks sent with a countdown or eta (longer than ``min_delay``) in the duetime
    store at ``store`` (default: ``DUETIME_STORE``, else ``sqlite:///duetime.db``)."""
    return CeleryBridge(app, store, endpoint=endpoint, min_delay=min_delay).install()
