"""The one place that knows about time.

Everything else asks a :class:`Clock`, so tests can swap in ``duetime.testing.FakeClock`` and never
sleep.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta


class SystemClock:
    """Wall-clock time for due times, monotonic time for waits."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass; True if the event fired."""
        if event.is_set():
            return True
        if timeout <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


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
