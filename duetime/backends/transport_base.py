"""The bases every transport of a client library sits on: what a transport does the same whatever
its library, written once.

A transport (``duetime.interfaces.Transport``) starts, sends batches, declares queues and
closes. :class:`TransportBase` holds the part that never changes: a start or a send after the
close says the transport is closed (:func:`~duetime.backends._on_a_thread.transport_closed`), and
a second close does nothing. Two ways to send sit on it:

- :class:`~duetime.backends.blocking.BlockingTransport`, for a client that blocks (kombu,
  Dramatiq's brokers): each call on the transport's own thread, one message after another.
- :class:`AsyncClientTransport`, for a client that answers on the event loop (aiohttp; paho,
  whose callbacks are handed to the loop): every message of a batch is handed to the client at
  once, and the answers awaited after, so a batch costs one round of the network, not one a
  message. A message the transport refuses as it hands it over is that message's answer alone.

A new transport is one module: a subclass that says how to connect, let go, declare a queue and
hand one message over (kombu's virtual transport is the model: its memory transport is 106 lines).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Sequence

from duetime.backends._on_a_thread import transport_closed
from duetime.errors import MessageRefused
from duetime.interfaces import AsyncClosing
from duetime.message import DelayedMessage


class TransportBase(AsyncClosing, ABC):
    """Start, close, and the closed state: the same for every transport of a client library."""

    _closed: bool = False

    @abstractmethod
    async def _open(self) -> None:
        """Be ready to send: connect (or read what is needed); TransportUnavailable when it cannot
        now, ConfigurationError for what waiting will not mend."""

    @abstractmethod
    async def _let_go(self) -> None:
        """Let every connection go, quietly (they may be broken already)."""

    async def start(self) -> None:
        self._refuse_if_closed()
        await self._open()

    async def close(self) -> None:
        if self._closed:  # closed already: a second close does nothing
            return
        self._closed = True
        await self._let_go()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise transport_closed()


class AsyncClientTransport(TransportBase):
    """A transport whose client answers on the event loop: a batch handed over at once."""

    @abstractmethod
    async def _ready(self) -> None:
        """Before a batch: TransportUnavailable when none of it can go (not connected, the
        endpoints cannot be read)."""

    @abstractmethod
    def _hand_over(self, message: DelayedMessage) -> Awaitable[Exception | None]:
        """Give ``message`` to the client now, and return what answers for it: None once the
        other side has it, or the exception that says why not (TransportUnavailable: not this
        message's fault). MessageRefused raised here is this message's answer alone."""

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        self._refuse_if_closed()
        await self._ready()
        handed: list[Awaitable[Exception | None] | Exception] = []
        for message in messages:
            try:
                handed.append(self._hand_over(message))
            except MessageRefused as refused:
                handed.append(refused)
        answers: list[Exception | None] = []
        try:
            for answer in handed:
                answers.append(answer if isinstance(answer, Exception) else await answer)
        finally:
            for left in handed[len(answers) :]:  # an unforeseen failure: nothing left running
                if isinstance(left, asyncio.Future):
                    left.cancel()
                elif asyncio.iscoroutine(left):
                    left.close()
        return answers
