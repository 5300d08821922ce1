"""Dramatiq messages sent with a delay are stored in duetime instead of the broker's delay queue.

Install it once on the broker, where the actors are declared (workers import that module too, so
the Retries middleware's delayed retries are stored as well)::

    broker = RabbitmqBroker(url="amqp://guest:guest@localhost:5672")
    dramatiq.set_broker(broker)
    bridge = duetime.bridges.dramatiq.install(broker, store="postgresql://…/duetime")

and run ``duetime run --store postgresql://…/duetime --transport dramatiq+amqp://guest:guest@localhost:5672``
beside the workers. ``actor.send_with_options(delay=…)`` (milliseconds or a timedelta, as in
Dramatiq) and ``send_with_options(eta=…)`` (epoch milliseconds, or an aware datetime) store the
message; when it is due the dispatcher enqueues it on the actor's queue through a Dramatiq broker
of its own, so an unmodified worker runs it at once instead of holding it in memory.

The broker's middleware sees the enqueue when the message is stored (``before_enqueue`` may add
options, as it would); the dispatcher's broker runs none, so nothing is added twice. The message id
is Dramatiq's; a retry of it is stored under ``<id>.retry-<n>`` in the group of its id, so
:meth:`DramatiqBridge.cancel` cancels every copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from dramatiq import Broker, Message
from dramatiq.common import current_millis, q_name

from duetime.bridges.store import ProcessClient, as_timedelta, put_recurring
from duetime.errors import ConfigurationError
from duetime.message import Delay
from duetime.recurring import Recurrence, Schedule
from duetime.settings import DEFAULT_ENDPOINT

ACTOR_HEADER = "dramatiq-actor"
#: Options that belong to one trip through a broker, not to the message.
_TRIP_OPTIONS = ("eta", "redis_message_id")


def eta_millis(value: Any) -> int | None:
    """An ``eta`` option in epoch milliseconds (an aware datetime is taken too), else None."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return None
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def plain(message: Message[Any]) -> Message[Any]:
    """The message as the worker should get it when due: on its actor's queue, no eta."""
    options = {k: v for k, v in message.options.items() if k not in _TRIP_OPTIONS}
    return dataclasses.replace(message, queue_name=q_name(message.queue_name), options=options)


class DramatiqBridge:
    """Stores the broker's delayed messages in duetime; see the module's documentation."""

    def __init__(
        self,
        broker: Broker,
        store: str | None = None,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        min_delay: Delay = 0,
    ) -> None:
        if not isinstance(broker, Broker):
            raise ConfigurationError(
                f"install() takes a Dramatiq broker (e.g. RabbitmqBroker(...)), got {type(broker).__name__}."
            )
        self.broker = broker
        self.client = ProcessClient(store, endpoint)
        self.min_delay_ms = int(as_timedelta(min_delay) / timedelta(milliseconds=1))
        self._enqueue: Callable[..., Message[Any]] | None = None

    def install(self) -> DramatiqBridge:
        """Route the broker's delayed enqueues through the bridge (once; idempotent)."""
        installed = getattr(self.broker.enqueue, "__self__", None) is self
        if installed:
            return self
        self._enqueue = self.broker.enqueue
        self.broker.enqueue = self.enqueue  # type: ignore[method-assign]
        return self

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """The broker's ``enqueue``: a message due more than ``min_delay`` from now is stored."""
        assert self._enqueue is not None
        now = current_millis()
        due = now + int(delay) if delay is not None else eta_millis(message.options.get("eta"))
        if due is None or due - now <= 0 or due - now < self.min_delay_ms:
            if delay is None and due is not None:
                # an eta already past runs now, as the worker would; a near one stays with the
                # worker, in the epoch milliseconds it understands
                message = plain(message) if due <= now else message.copy(options={"eta": due})
            return self._enqueue(message, delay=delay)
        self.broker.emit_before("enqueue", message, due - now)
        ready = plain(message)
        retries = int(message.options.get("retries") or 0)
        self.client.get().schedule(
            ready.queue_name,
            ready.encode(),
            due_at=datetime.fromtimestamp(due / 1000, UTC),
            headers={ACTOR_HEADER: message.actor_name},
            message_id=message.message_id if not retries else f"{message.message_id}.retry-{retries}",
            group=message.message_id,
        )
        self.broker.emit_after("enqueue", message, due - now)
        return ready.copy(options={"eta": due})

    def recurring(self, schedule_id: str, message: Message[Any], *, when: Recurrence) -> Schedule:
        """Enqueue ``message`` (``actor.message(7)``) at every time ``when`` gives, each tick a
        message of its own (its id the tick's message id), sent once per tick however many
        dispatchers run. A schedule with that id is changed to this one (from its next tick), so
        the app may say it at every start."""
        ready = plain(message)
        headers = {ACTOR_HEADER: message.actor_name}
        return put_recurring(self.client.get(), schedule_id, ready.queue_name, ready.encode(), when, headers)

    def cancel(self, message_id: str) -> int:
        """Cancel the stored message (and its stored retries); how many were removed."""
        return self.client.get().cancel_group(str(message_id))

    def reschedule(self, message_id: str, *, delay: Delay | None = None, eta: datetime | None = None) -> int:
        """Move the stored message to ``delay`` from now (seconds, a timedelta or ``"10m"``, as
        duetime takes delays) or to ``eta``; how many moved (0: already sent, or never stored)."""
        client = self.client.get()
        moved = 0
        for stored in client.list(group=str(message_id), limit=10_000).messages:
            moved += client.reschedule(stored.message_id, delay=delay, due_at=eta)
        return moved

    def close(self) -> None:
        self.client.close()


def install(
    broker: Broker, store: str | None = None, *, endpoint: str = DEFAULT_ENDPOINT, min_delay: Delay = 0
) -> DramatiqBridge:
    """Keep ``broker``'s messages sent with a delay or eta (longer than ``min_delay``) in the
    duetime store at ``store`` (default: ``DUETIME_STORE``, else ``sqlite:///duetime.db``)."""
    return DramatiqBridge(broker, store, endpoint=endpoint, min_delay=min_delay).install()
