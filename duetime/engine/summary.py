"""The dispatcher's periodic summary: one log line a minute while it works, for people and machines.

A service writes one line per batch nobody reads, or nothing at all; this sits between: every
``summary_interval`` (and only when something happened) one record says what was forwarded,
dead-lettered and retried since the last one, how late the messages were, and what is waiting.
Lateness is kept in log-spaced buckets (1 ms to 1 h), so a p99 needs no list of every message.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from duetime.inputs.durations import readable_duration
from duetime.interfaces import StoreCounts

#: Upper bounds of the lateness buckets in seconds: ten per decade from 1 ms to one hour.
BUCKETS = [10 ** (k / 10) / 1000 for k in range(0, 66)] + [math.inf]


class LatenessHistogram:
    """Counts of lateness values per bucket; quantiles answer the bucket's upper bound."""

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.total = 0

    def add(self, seconds: Iterable[float]) -> None:
        for value in seconds:
            self.counts[bisect.bisect_left(BUCKETS, max(value, 0.0))] += 1
            self.total += 1

    def copy(self) -> LatenessHistogram:
        return LatenessHistogram.of(self.counts)

    def minus(self, earlier: LatenessHistogram) -> LatenessHistogram:
        """What was added since ``earlier`` (a copy taken then)."""
        return LatenessHistogram.of([a - b for a, b in zip(self.counts, earlier.counts, strict=True)])

    def plus(self, other: LatenessHistogram) -> LatenessHistogram:
        return LatenessHistogram.of([a + b for a, b in zip(self.counts, other.counts, strict=True)])

    @classmethod
    def of(cls, counts: Sequence[int]) -> LatenessHistogram:
        made = cls()
        made.counts = list(counts)
        made.total = sum(counts)
        return made

    def sparse(self) -> dict[str, int]:
        """Only the buckets with counts, by index (JSON keys are text): small enough for a heartbeat."""
        return {str(i): n for i, n in enumerate(self.counts) if n}

    @classmethod
    def from_sparse(cls, buckets: Mapping[str, int]) -> LatenessHistogram:
        counts = [0] * len(BUCKETS)
        for key, n in buckets.items():
            if key.isdigit() and int(key) < len(counts):
                counts[int(key)] = int(n)
        return cls.of(counts)

    def quantile(self, q: float) -> float | None:
        if self.total == 0:
            return None
        wanted = math.ceil(q * self.total)
        seen = 0
        for bound, count in zip(BUCKETS, self.counts, strict=True):
            seen += count
            if seen >= wanted:
                return bound
        return math.inf


@dataclass
class Tally:
    forwarded: int = 0
    dead_lettered: int = 0
    retries: int = 0
    outages: int = 0

    def minus(self, earlier: Tally) -> Tally:
        return Tally(
            self.forwarded - earlier.forwarded,
            self.dead_lettered - earlier.dead_lettered,
            self.retries - earlier.retries,
            self.outages - earlier.outages,
        )

    def __bool__(self) -> bool:
        return any((self.forwarded, self.dead_lettered, self.retries, self.outages))


def _ms(seconds: float | None) -> str:
    """A lateness bucket's upper bound, as the summary line reads it."""
    if seconds is None:
        return "-"
    return "over 1 h" if math.isinf(seconds) else f"under {readable_duration(seconds)}"


def summary_fields(
    interval: float, done: Tally, lateness: LatenessHistogram, backlog: StoreCounts | None
) -> dict[str, float | int | None]:
    """The same as numbers, for ``--log-format json`` (lateness in ms, None when unknown)."""

    def ms(q: float) -> float | None:
        value = lateness.quantile(q)
        return None if value is None or math.isinf(value) else round(value * 1000, 3)

    return {
        "interval_s": interval,
        "forwarded": done.forwarded,
        "dead_lettered": done.dead_lettered,
        "retried": done.retries,
        "outages": done.outages,
        "lateness_p50_ms": ms(0.5),
        "lateness_p99_ms": ms(0.99),
        "stored": None if backlog is None else backlog.total,
        "stored_estimated": None if backlog is None else backlog.estimated,
        "due": None if backlog is None else backlog.due,
        "in_flight": None if backlog is None else backlog.claimed,
    }


def summary_line(
    interval: float, done: Tally, lateness: LatenessHistogram, backlog: StoreCounts | None
) -> str:
    """``last 60 s: forwarded 1,200, dead-lettered 0, retried 3, outages 0; lateness p50 under
    4 ms, p99 under 16 ms; backlog 5,000 stored, 120 due, 100 in flight``."""
    parts = (
        f"last {interval:g} s: forwarded {done.forwarded:,}, dead-lettered {done.dead_lettered:,}, "
        f"retried {done.retries:,}, outages {done.outages:,}; "
        f"lateness p50 {_ms(lateness.quantile(0.5))}, p99 {_ms(lateness.quantile(0.99))}"
    )
    if backlog is None:
        return parts + "; backlog unknown (the store did not answer)"
    stored = backlog.said(backlog.total)
    return parts + f"; backlog {stored} stored, {backlog.due:,} due, {backlog.claimed:,} in flight"
