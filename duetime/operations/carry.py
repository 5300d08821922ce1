"""The rule every message meets before it is stored: a destination a sender may write to, and
what the transport it will go to can carry. Stored, such a message would only fail when due.

The command line's ``schedule``, ``load``, ``recurring`` and ``send-delayed`` ask it once per
command; the HTTP API keeps one open for as long as it serves.
"""

from __future__ import annotations

import asyncio
import contextlib

from duetime.errors import ConfigurationError, MessageRefused
from duetime.inputs.urls import redact
from duetime.interfaces import CarryCheck
from duetime.message import DelayedMessage, refused_destination
from duetime.registry import default_transport, open_transport


class CarryRule:
    """Why a message could never be delivered (None: it can), with the transport named.

    A transport that cannot be reached now is checked by its own rules alone (the server's limits
    wait for the dispatcher); no transport at all (a store without queue tables of its own and
    none given) leaves the destination rule."""

    def __init__(self, error_queue: str, transport_url: str = "", checker: CarryCheck | None = None) -> None:
        self.error_queue, self.url, self.checker = error_queue, transport_url, checker

    @classmethod
    async def open(cls, store_url: str, transport: str | None, error_queue: str) -> CarryRule:
        try:
            url = transport or default_transport(store_url)
            t = open_transport(url)
        except ConfigurationError:
            return cls(error_queue)
        if not isinstance(t, CarryCheck):
            with contextlib.suppress(Exception):
                await t.close()
            return cls(error_queue)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t.start(), 5)
        return cls(error_queue, url, t)

    def __call__(self, message: DelayedMessage) -> str | None:
        if why := refused_destination(message.destination, self.error_queue):
            return why
        reason = None if self.checker is None else self.checker.cannot_carry(message)
        return None if reason is None else f"{redact(self.url)} could never carry this message: {reason}"

    def refuse(self, message: DelayedMessage) -> None:
        """MessageRefused, saying why, for a message that could never be delivered."""
        if reason := self(message):
            raise MessageRefused(f"{reason}. Nothing was stored.")

    async def close(self) -> None:
        if self.checker is not None:
            with contextlib.suppress(Exception):
                await self.checker.close()  # type: ignore[attr-defined]
