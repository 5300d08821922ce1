"""What the topology tests count: for one kind of message, what producers were told (stored, or
the call raised) and what a consumer received (how often, when, against its due time)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: A message that arrives this much before its due time is early (the consumer's clock is the
#: dispatcher's: one machine).
EARLY = 0.05


@dataclass
class Tally:
    sent: set[str] = field(default_factory=set)
    raised: set[str] = field(default_factory=set)
    times: dict[str, int] = field(default_factory=dict)
    early: list[tuple[str, float]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.time() of each
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, message_id: str, due_at: str | None) -> None:
        """One arrival, with the ``duetime-due-at`` header it came with."""
        now = time.time()
        with self.lock:
            self.times[message_id] = self.times.get(message_id, 0) + 1
            self.arrivals.append(now)
            if due_at:
                ahead = datetime.fromisoformat(due_at).timestamp() - now
                if ahead > EARLY:
                    self.early.append((message_id, ahead))

    def missing(self) -> set[str]:
        """Acknowledged to a producer and never received."""
        return self.sent - set(self.times)

    def figures(self, since: float) -> dict[str, Any]:
        """The counts, and how long after ``since`` (time.time()) the first arrival came."""
        with self.lock:
            after = min((t for t in self.arrivals if t >= since), default=None)
        return {
            "sent": len(self.sent),
            "raised": len(self.raised),
            "raised_yet_delivered": len(self.raised & set(self.times)),
            "lost": len(self.missing()),
            "doubled": sum(1 for n in self.times.values() if n > 1),
            "first_after_s": None if after is None else round(after - since, 2),
        }


def until_all_arrived(tallies: Iterable[Tally], seconds: float) -> None:
    """Wait (at most ``seconds``) for every acknowledged message, then a little more: what would
    arrive twice has time to."""
    tallies = list(tallies)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(t.missing() for t in tallies):
        time.sleep(0.3)
    time.sleep(1.5)
