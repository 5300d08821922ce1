"""Sleeping on a descriptor to the microsecond: how a receiver waits for a message's visible time
while staying woken by what arrives (SQLite's write events, PostgreSQL's NOTIFY).

``select`` takes its timeout in microseconds. ``poll`` and ``epoll`` take whole milliseconds:
rounded up, a receiver woke up to a millisecond after the message it waited for showed; rounded
down and looped, as psycopg's own wait does, it spins through the remainder (0.9 ms of CPU for a
wait of 0.9 ms, measured). ``select`` cannot watch a descriptor past 1,024 (a process with that
many files open); there ``poll`` waits, rounded up.
"""

from __future__ import annotations

import math
import select


def wait_readable(fileno: int, seconds: float) -> None:
    """Return once ``fileno`` has something to read or ``seconds`` have passed (never fewer)."""
    try:
        select.select([fileno], [], [], max(seconds, 0.0))
    except ValueError:  # past select's limit
        poller = select.poll()
        poller.register(fileno, select.POLLIN)
        poller.poll(max(math.ceil(seconds * 1000), 0))
