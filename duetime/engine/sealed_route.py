"""A route that delivers messages sealed: ``--route 'payments.*=sealed:amqp://host/'``.

A dispatcher opens every message it takes from the store and delivers plaintext. Where the broker
between duetime and the consumer must not read what messages hold either, a route whose URL
begins ``sealed:`` seals each message again with the keyring's primary key on its way out (the
same sealing as at rest, :mod:`duetime.encryption`: the body and every header value but
duetime's own, bound to the message id and the destination), and the consumer opens it with the
keyring: ``sealer_from_environment().open_parts(message_id, queue, body, headers)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from duetime.encryption import Sealer, sealer_from_environment
from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact
from duetime.interfaces import Located, ReadsFromStore, Transport
from duetime.message import DelayedMessage

#: What a route's URL begins with to deliver its messages sealed.
SEALED_PREFIX = "sealed:"


class SealedDelivery:
    """The transport ``inner``, given each message sealed with the keyring's primary key."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    @property
    def parts(self) -> list[Transport]:
        return [self.inner]

    @property
    def url(self) -> str:
        inner = self.inner.url if isinstance(self.inner, Located) else type(self.inner).__name__
        return SEALED_PREFIX + inner

    def _sealer(self) -> Sealer:
        sealer = sealer_from_environment()
        if sealer is None:
            raise ConfigurationError(
                f"the route to {redact(self.url)} delivers sealed: set DUETIME_ENCRYPTION_KEYS to the keyring file."
            )
        return sealer

    def attach_store(self, store: object) -> None:
        if isinstance(self.inner, ReadsFromStore):
            self.inner.attach_store(store)

    async def start(self) -> None:
        self._sealer()  # no keyring is what waiting will not fix: said at the start
        await self.inner.start()

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        sealer = self._sealer()
        return await self.inner.send_batch([sealer.seal(m) for m in messages])

    async def declare(self, queue: str) -> None:
        await self.inner.declare(queue)

    async def close(self) -> None:
        await self.inner.close()
