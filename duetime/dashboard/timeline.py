"""The dashboard's memory of the last hours: a sample of each endpoint every few seconds.

A store holds what is waiting now, not what happened; so the dashboard looks every
``sample_every`` seconds and keeps what it saw (backlog, and, from the live dispatchers'
heartbeats, how many they delivered and how late) in a ring. Its charts start when the dashboard
starts; run one dashboard for a long time rather than opening a new one to look back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from duetime.engine.summary import LatenessHistogram
from duetime.interfaces import StoreCounts
from duetime.live_dispatchers import DispatcherInfo

#: Samples kept: six hours at one every ten seconds.
KEEP = 2_160


@dataclass(frozen=True, slots=True)
class Sample:
    at: datetime
    stored: int
    due: int
    in_flight: int
    failing: int
    #: What the live dispatchers reported forwarding since the previous sample (None on the
    #: first), their rate per minute as of their latest reports, and how late it was.
    forwarded: int | None
    delivered_per_minute: float | None
    #: Whether any dispatcher reported since the previous sample.
    fresh: bool
    lateness: LatenessHistogram

    @property
    def p50_ms(self) -> float | None:
        """Upper bound of the bucket holding the median, in ms; None when nothing was forwarded."""
        return _ms(self.lateness.quantile(0.5))

    @property
    def p99_ms(self) -> float | None:
        return _ms(self.lateness.quantile(0.99))


def _ms(seconds: float | None) -> float | None:
    if seconds is None or seconds == float("inf"):
        return None
    return round(seconds * 1000, 3)


class Timeline:
    """Samples of one endpoint, oldest first, and the dispatchers' counts at the last look.

    Dispatchers report every few seconds, not when the dashboard looks: a look between two of
    their heartbeats sees nothing new. So the delivery rate is each dispatcher's change in count
    over the time between *its own* reports (kept until the next one), and a sample says whether
    any report was new (``fresh``), so a chart of lateness skips looks that learned nothing.
    """

    def __init__(self, keep: int = KEEP) -> None:
        self.samples: deque[Sample] = deque(maxlen=keep)
        self._seen: dict[str, DispatcherInfo] = {}
        self._rates: dict[str, float] = {}
        self._last_at: datetime | None = None
        #: The last look's counts and when it was made (the overview shows them while fresh).
        self.latest: tuple[datetime, StoreCounts] | None = None

    def add(self, at: datetime, counts: StoreCounts, dispatchers: Iterable[DispatcherInfo]) -> Sample:
        """Record a look; what each dispatcher did since the last is the change in its counts (one
        that started since then counts from zero; one that restarted is a new dispatcher)."""
        current = {d.dispatcher_id: d for d in dispatchers}
        forwarded = 0
        fresh = False
        lateness = LatenessHistogram()
        for key, now in current.items():
            before = self._seen.get(key)
            if before is None and (self._last_at is None or now.started_at < self._last_at):
                continue  # the first look, or it was there before unseen: no baseline yet
            if before is not None and now.last_seen <= before.last_seen:
                continue  # no report since the last look
            fresh = True
            then = LatenessHistogram.from_sparse(before.lateness) if before else LatenessHistogram()
            done = now.forwarded - (before.forwarded if before else 0)
            # A rate needs two of its reports: its first covers its start-up, when a backlog goes
            # out in a burst (5,000 in 2.7 s read as 110,000/min and flattened the chart).
            if before is not None and (seconds := (now.last_seen - before.last_seen).total_seconds()) > 0:
                self._rates[key] = max(done, 0) * 60 / seconds
            forwarded += done
            lateness = lateness.plus(LatenessHistogram.from_sparse(now.lateness).minus(then))
        first = self._last_at is None
        self._rates = {k: v for k, v in self._rates.items() if k in current}
        sample = Sample(
            at=at,
            stored=counts.total,
            due=counts.due,
            in_flight=counts.claimed,
            failing=counts.failing,
            forwarded=None if first else max(forwarded, 0),
            delivered_per_minute=None if first else round(sum(self._rates.values()), 1),
            fresh=fresh,
            lateness=lateness,
        )
        self.samples.append(sample)
        self._seen = {
            k: d if k not in self._seen or d.last_seen > self._seen[k].last_seen else self._seen[k]
            for k, d in current.items()
        }
        self._last_at = at
        self.latest = (at, counts)
        return sample

    def span_seconds(self, now: datetime) -> float:
        """How far back the samples reach from ``now`` (0 before the first)."""
        return 0.0 if not self.samples else max(0.0, (now - self.samples[0].at).total_seconds())

    def recent(self, seconds: float) -> Sequence[Sample]:
        """The samples of the last ``seconds``."""
        if not self.samples:
            return []
        newest = self.samples[-1].at
        return [s for s in self.samples if (newest - s.at).total_seconds() <= seconds]
