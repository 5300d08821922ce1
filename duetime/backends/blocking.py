"""The base of a transport over a blocking client library (kombu, Dramatiq's brokers, ...), on
:class:`~duetime.backends.transport_base.TransportBase`.

Everything runs on one thread of the transport's own, which keeps one connection: a subclass says
how to connect (:meth:`~BlockingTransport._connect`), how to let the connection go
(:meth:`~BlockingTransport._drop`), how to send one message and how to make sure of one queue,
and which of its library's errors mean the broker cannot be reached. The base does the rest as
every duetime transport must (``duetime.interfaces.Transport``): a batch that cannot reach the
broker fails as a whole, a message the broker refuses is that message's answer alone
(:func:`duetime.backends.refusals.send_each`), a close waits for the calls in flight, and a call
after it says the transport is closed.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from duetime.backends._on_a_thread import BlockingCalls, transport_closed
from duetime.backends.refusals import send_each
from duetime.backends.transport_base import TransportBase
from duetime.inputs.identifiers import check_name
from duetime.message import DelayedMessage


class BlockingTransport(TransportBase):
    """A transport whose client blocks: each call on the transport's one thread."""

    def __init__(self, thread_name: str) -> None:
        self._calls = BlockingCalls(1, thread_name, transport_closed)

    # --- what a subclass says ------------------------------------------------------------------
    @abstractmethod
    def _connect(self) -> Any:
        """Connect if not connected (on the transport's thread); TransportUnavailable when the
        broker cannot be reached, ConfigurationError for what waiting will not mend."""

    @abstractmethod
    def _drop(self) -> None:
        """Let the connection go, quietly (it may be broken already); the next call connects."""

    @abstractmethod
    def _send_one(self, message: DelayedMessage) -> None:
        """Publish ``message`` and return once the broker has it; raise what the library raises."""

    @abstractmethod
    def _declare_one(self, queue: str) -> None:
        """Make sure ``queue`` (a checked name) exists, as the library's own users expect it."""

    @property
    @abstractmethod
    def outages(self) -> tuple[type[BaseException], ...]:
        """The library's errors that mean the broker cannot be reached (not this message's fault)."""

    @property
    @abstractmethod
    def shown(self) -> str:
        """The broker as the errors name it: ``the Celery broker amqp://guest:***@host/``."""

    # --- the rest, the same for every such transport -------------------------------------------
    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self._calls.call(fn, *args)

    async def _open(self) -> None:
        await self._run(self._connect)

    async def _let_go(self) -> None:
        await self._run(self._drop)
        self._calls.shutdown()

    async def declare(self, queue: str) -> None:
        await self._run(self._declare_one, check_name("queue", queue))

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        return list(await self._run(self._send_all, list(messages)))

    def _send_all(self, messages: list[DelayedMessage]) -> list[Exception | None]:
        self._connect()  # a broker that cannot be reached fails the batch as a whole

        def one(message: DelayedMessage) -> None:
            self._connect()  # again after a refusal dropped the connection
            self._send_one(message)

        return send_each(messages, one, outages=self.outages, reset=self._drop, broker=self.shown)
