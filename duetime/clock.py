"""The one place that knows about time.

Everything else asks a :class:`Clock`, so tests can swap in ``duetime.testing.FakeClock`` and never
sleep.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

#: The last stretch of a wait that is slept on a thread (see :meth:`SystemClock.wait`).
FINE_WAIT = 0.002
#: How late asyncio's own timers fire at most (the selector rounds a wait up to whole ms).
TIMER_LATENESS = 0.001


@functools.cache
def _timer_threads(pid: int) -> ThreadPoolExecutor:
    """Threads for the last stretch of waits, apart from the loop's default executor (which
    stores' blocking calls may fill): a wait stopped early leaves its thread asleep for at most
    FINE_WAIT, so two are plenty. One pool per process id (a forked child has none of the
    parent's threads)."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="duetime-timer")


class SystemClock:
    """Wall-clock time for due times, monotonic time for waits."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float, *, slack: float = 0.0) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass; True if the event fired.

        asyncio's timers fire up to a millisecond late (the selector counts whole milliseconds:
        0.6 ms late at the median here), and a dispatcher's wait ends when the next message is
        due, so the last :data:`FINE_WAIT` seconds are slept on a thread instead, which wakes
        within a fraction of that (0.2 ms) and tells the loop through its self-pipe.

        ``slack``: the wait may end anywhere in its last ``slack`` seconds. With a millisecond
        or more (a dispatcher's lateness budget) asyncio's own timer ends it, aimed that much
        early: the thread and its hand-offs cost a third of a delivery's CPU at a few hundred
        messages a second."""
        if event.is_set():
            return True
        if timeout <= 0:
            return False
        deadline = time.monotonic() + timeout
        coarse = slack >= TIMER_LATENESS
        first = timeout - (slack if coarse else FINE_WAIT)
        if first > 0:
            try:
                async with asyncio.timeout(first):  # (no task of its own, unlike wait_for)
                    await event.wait()
                return True
            except TimeoutError:
                pass
        left = deadline - time.monotonic()
        if coarse or left <= 0 or event.is_set():
            return event.is_set()
        sleeper = asyncio.get_running_loop().run_in_executor(_timer_threads(os.getpid()), time.sleep, left)
        woken = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((sleeper, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:  # the thread sleeps out its few milliseconds; nobody waits for it
            woken.cancel()
            sleeper.cancel()
        return event.is_set()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ServerAlignedClock(SystemClock):
    """The system clock moved by ``offset`` onto a store server's time: a dispatcher on a host
    whose clock is wrong still sees the time the store sees (never early; no claim taken from a
    dispatcher whose host is right). Waits and monotonic time are the host's own."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return self.host_now() + self.offset

    def host_now(self) -> datetime:
        """This host's own clock, which the offset is measured against."""
        return super().now()


def to_micros(moment: datetime) -> int:
    """Microseconds since the epoch: the exact integer form every store keeps."""
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The clock for code that is not handed one (a CLI command, a broker callback); everything that
#: can be tested with a fake clock takes a ``clock`` argument instead.
SYSTEM = SystemClock()


def handed_over_at(due_at: datetime, budget: timedelta) -> datetime:
    """When a dispatcher hands over a message it holds ahead of its due time (claimed, or moved
    into a queue): its due time rounded up to a whole ``budget`` (the lateness budget) since the
    epoch, never before it and at most ``budget`` after. The messages of one step then go (or
    show) together: one send, and one wake of a receiver, for each step instead of each message.
    The SQL of a move made ahead (``move_due_enqueue``, ``move_due_at_once``) says the same."""
    step = budget // timedelta(microseconds=1)
    if step <= 0:
        return due_at
    micros = to_micros(due_at)
    return from_micros(-(-micros // step) * step)
