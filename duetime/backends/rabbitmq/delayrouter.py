"""One scheduling call, two paths: RabbitMQ native delays or a duetime store (NServiceBus.RabbitMQ's
"backwards compatibility"). Both deliver to the same destinations.

The broker cannot list, cancel or reschedule what it holds; the store can. So the usual rule is:
short delays natively, long ones (or ones you may want to cancel) in the store. When the store has
nothing left for the endpoint it can be retired (what NServiceBus calls "disabling the timeout manager") and
everything goes natively.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError
from duetime.interfaces import DelayedMessageStore
from duetime.message import Delay, DelayedMessage

if TYPE_CHECKING:
    from duetime.backends.rabbitmq.native import NativeDelays

NATIVE = "native"
STORE = "store"


class StoreNotEmpty(ConfigurationError):
    """The store still holds messages for the endpoint; retiring it would strand them."""


class DelayRouter:
    """Routes each delayed message natively or to the store by ``native_up_to``.

    ``native_up_to=None`` sends everything the topology can hold natively; ``timedelta(0)`` sends
    everything to the store. With the store retired, everything goes natively.
    """

    def __init__(
        self,
        native: NativeDelays,
        store: DelayedMessageStore | None,
        *,
        native_up_to: timedelta | None = timedelta(hours=1),
    ) -> None:
        self.native = native
        self.store = store
        self.native_up_to = native_up_to

    @property
    def store_enabled(self) -> bool:
        return self.store is not None

    def route_for(self, due_at: datetime, now: datetime | None = None) -> str:
        if self.store is None:
            return NATIVE
        if self.native_up_to is None:
            from duetime.backends.rabbitmq.native import MAX_DELAY

            return NATIVE if due_at - (now or SYSTEM.now()) <= timedelta(seconds=MAX_DELAY) else STORE
        return NATIVE if due_at - (now or SYSTEM.now()) <= self.native_up_to else STORE

    async def schedule(
        self,
        destination: str,
        body: bytes = b"",
        *,
        delay: Delay | None = None,
        due_at: datetime | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Schedule one message; returns the path it took (``"native"`` or ``"store"``)."""
        message = DelayedMessage.create(
            destination, body, delay=delay, due_at=due_at, headers=headers, message_id=message_id
        )
        route = self.route_for(message.due_at)
        if route == STORE:
            assert self.store is not None
            await self.store.store(message)
            return STORE
        [error] = await self.native.send_batch([message])
        if error is not None:
            raise error
        return NATIVE

    async def retire_store(self) -> None:
        """Stop using the store for this endpoint; refused while it still holds messages."""
        if self.store is None:
            return
        counts = await self.store.counts(SYSTEM.now())
        if counts.total:
            raise StoreNotEmpty(
                f"the store still holds {counts.total} delayed messages for this endpoint (next due "
                f"{counts.next_due}); keep its dispatcher running until they are delivered, then retire it."
            )
        self.store = None
