"""When the dispatcher's loop wakes: at the next due time, at a store's word, or at a stop request.

Every sleep is capped (``max_sleep``) by the loop; this holds what it sleeps toward and what it was
told while it was not asleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime


class WakeUps:
    """The loop's wake-up event, and the next due time it learns ahead of its sleep."""

    def __init__(self) -> None:
        #: Set to end a sleep (or a back-off) at once.
        self.event = asyncio.Event()
        #: The due time slept toward (None: nothing stored), while asleep.
        self.target: datetime | None = None
        self.asleep = False
        #: The earliest due time told while not asleep: the next wait ends by it.
        self.told: datetime | None = None
        #: The next due time, asked while a short batch is sent; kept only if every message of
        #: the batch is delivered and removed.
        self._ahead: asyncio.Future[datetime | None] | None = None

    def on_stored(self, due: datetime | None) -> None:
        """A store's word that something changed: the earliest due time, or None (unknown).

        Asleep, the loop wakes if that is before the time it sleeps until. Mid-round, a known due
        time is kept for the coming wait instead of waking it: waking made a second round that
        found nothing whenever something was stored for later while a round ran — and in a SQLite
        file shared with a consumer, every message's receipt and acknowledgement came in as such a
        word.
        """
        if due is None or (self.asleep and (self.target is None or due < self.target)):
            self.event.set()
        else:  # kept for the coming wait: mid-round, or asleep toward an earlier time (a wait for
            # a message claimed ahead, after which the round ends without asking again)
            self.told = due if self.told is None else min(self.told, due)

    def ask_ahead(self, question: Awaitable[datetime | None]) -> None:
        """Start asking the next due time now, beside the round's send and removal; what is told
        from now on is told on top of its answer."""
        self.forget_ahead()
        self.told = None
        self._ahead = asyncio.ensure_future(question)

    def mark(self) -> None:
        """A round is about to read the next due time in its own call (:meth:`know_ahead`): what
        is told from now on is kept on top of that answer; what was told before, it includes."""
        self.forget_ahead()
        self.told = None

    def know_ahead(self, due: datetime | None) -> None:
        """The next due time a round's own call read after :meth:`mark`: the wait that follows
        takes it without asking."""
        self.forget_ahead()
        known: asyncio.Future[datetime | None] = asyncio.get_running_loop().create_future()
        known.set_result(due)
        self._ahead = known

    def forget_ahead(self) -> None:
        """Drop the next due time asked ahead: a message given back or failed is due again, which
        that answer (asked while it was claimed) does not know."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            ahead.add_done_callback(lambda f: f.cancelled() or f.exception())

    def take_ahead(self) -> asyncio.Future[datetime | None] | None:
        """The question asked ahead, if one still stands (the caller awaits it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            self.told = None  # what was told before the caller's own question, its answer includes
        return ahead

    def take_told(self) -> datetime | None:
        told, self.told = self.told, None
        return told
