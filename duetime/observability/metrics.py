"""Prometheus metrics for a running dispatcher (``duetime run --metrics-port``).

Counters and histograms are fed by the dispatcher's observer hooks as it works; gauges are read at
scrape time from the dispatcher (its breakers, its last batch) and from the last backlog count,
which a background task takes from the store every few seconds. The backlog comes from the store,
so several dispatchers of one endpoint report the same backlog while each counts its own work.

Destinations become a label only up to a cap (``max_destinations``, 50 by default); further ones
are counted as ``other``, so a flood of one-off destinations cannot blow up the series count.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from datetime import datetime

from duetime.engine.companions import Reported, until_started
from duetime.engine.deadline import within
from duetime.engine.observe import DispatchObserver, Settled
from duetime.errors import CriticalError, MissingExtra, one_line
from duetime.interfaces import DispatcherRegistry, StoreCounts, Transport
from duetime.live_dispatchers import DispatcherInfo
from duetime.message import DelayedMessage
from duetime.observability.attempts import attempt_logs
from duetime.webhooks import REQUEST_SECONDS_BOUNDS

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.process_collector import ProcessCollector
except ImportError as missing:  # pragma: no cover - depends on what is installed
    raise MissingExtra.of("Metrics", "metrics") from missing

log = logging.getLogger("duetime.metrics")

#: Lateness (due time -> handed to the destination), 1 ms to 1 h.
LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
BATCH_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Breaker states as numbers: a gauge an alert can compare.
DISARMED, ARMED, TRIPPED = 0, 1, 2
OTHER = "other"


class LabelCap:
    """The first ``limit`` distinct values keep their names; the rest are ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._known:
            return value
        with self._lock:
            if len(self._known) < self.limit:
                self._known.add(value)
                return value
        return OTHER


class FastHistogram:
    """A histogram fed a batch at a time (one bisect and one increment per value, no lock per
    value: prometheus_client's Histogram takes a lock per observation, which showed in the
    metrics-on bench), exported at scrape time. Only the event loop's thread writes to it."""

    def __init__(self, name: str, text: str, endpoint: str, buckets: Sequence[float]) -> None:
        self.name, self.text, self.endpoint = name, text, endpoint
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe_pairs(self, pairs: Iterable[tuple[object, float]]) -> None:
        """Observe the second of each pair (a negative value counts as 0)."""
        counts, bounds, find, total = self.counts, self.bounds, bisect.bisect_left, 0.0
        for _, value in pairs:
            if value > 0:
                counts[find(bounds, value)] += 1
                total += value
            else:
                counts[0] += 1
        self.sum += total

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.text, labels=["endpoint"])
        cumulative, running = [], 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        family.add_metric([self.endpoint], cumulative, self.sum)
        yield family


class PrometheusObserver(DispatchObserver):
    """The dispatcher's and front door's hooks as Prometheus counters and histograms."""

    def __init__(self, registry: CollectorRegistry, endpoint: str, cap: LabelCap) -> None:
        self.endpoint = endpoint
        self.cap = cap
        by_destination = ["endpoint", "destination"]

        def counter(name: str, text: str, labels: Sequence[str] = ("endpoint",)) -> Counter:
            return Counter(name, text, labels, registry=registry)

        self._forwarded = counter(
            "duetime_forwarded", "Messages delivered to their destination.", by_destination
        )
        self._dead = counter(
            "duetime_dead_lettered", "Messages sent to the error queue, by their destination.", by_destination
        )
        self._retried = counter(
            "duetime_retried", "Failed forwards that will be tried again.", by_destination
        )
        self._claimed = counter("duetime_claimed", "Due messages claimed from the store.")
        self._door_stored = counter("duetime_front_door_stored", "Front-door messages stored.")
        self._door_rejected = counter(
            "duetime_front_door_rejected", "Front-door messages that could not be read (to the error queue)."
        )
        self._door_duplicates = counter(
            "duetime_front_door_duplicates", "Front-door messages already stored (redeliveries)."
        )
        self._ticks = counter(
            "duetime_recurring_ticks_stored",
            "Ticks of recurring schedules stored by this dispatcher's planning (each then delivered as a message).",
        )
        self._ticks_missed = counter(
            "duetime_recurring_ticks_missed",
            "Ticks of recurring schedules missed while no dispatcher ran and left out by their catch-up policy.",
        )
        self._planning_behind = Gauge(
            "duetime_recurring_planning_behind_seconds",
            "Seconds the longest-waiting recurring schedule waited to be planned in the last planning "
            "step (about 1 when planning keeps up; more, and ticks go late).",
            ["endpoint"],
            registry=registry,
        ).labels(endpoint)
        self._set_aside = counter(
            "duetime_recurring_schedules_set_aside",
            "Recurring schedules this dispatcher's planning set aside because they cannot be planned "
            "(`duetime recurring list` says why); the others go on.",
        )
        self._parked = counter(
            "duetime_parked",
            "Messages neither their destination nor the error queue could carry, kept stored and tried again later.",
        )
        self._trips = counter(
            "duetime_breaker_trips",
            "Circuit breakers that tripped (each stops its dispatcher with a critical error), by breaker.",
            ["endpoint", "breaker"],
        )
        self._held_back = counter(
            "duetime_held_back",
            "Claimed messages a flow-control limit or pause held back in the store for their turn, "
            "by destination (a message held again counts again).",
            by_destination,
        )
        self._held = Histogram(
            "duetime_held_seconds",
            "Seconds from a message's due time to its delivery, for a destination a flow-control "
            "limit or pause governs: the wait the limit asked for, never counted as lateness.",
            by_destination,
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self._lateness = FastHistogram(
            "duetime_lateness_seconds",
            "Seconds from a message's due time to its delivery (destinations no flow-control limit "
            "or pause governs; theirs is duetime_held_seconds).",
            endpoint,
            LATENESS_BUCKETS,
        )
        registry.register(self._lateness)
        self._batch_size = Histogram(
            "duetime_batch_size",
            "Messages per batch.",
            ["endpoint"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        ).labels(endpoint)
        self._batch_seconds = Histogram(
            "duetime_batch_duration_seconds",
            "Seconds from claiming a batch to having it delivered and removed, not counting the wait "
            "for the due times of what was claimed ahead.",
            ["endpoint"],
            buckets=BATCH_SECONDS_BUCKETS,
            registry=registry,
        ).labels(endpoint)
        for each in (
            self._claimed,
            self._door_stored,
            self._door_rejected,
            self._door_duplicates,
            self._ticks,
            self._ticks_missed,
            self._set_aside,
            self._parked,
        ):
            each.labels(endpoint)  # present (at 0) from the first scrape

    def claimed(self, count: int) -> None:
        self._claimed.labels(self.endpoint).inc(count)

    def delivered(self, done: Sequence[Settled], at: datetime) -> None:
        self._lateness.observe_pairs((s.destination, s.lateness(at)) for s in done if not s.held)
        for s in done:
            if s.held:
                self._held.labels(self.endpoint, self.cap(s.destination)).observe(max(s.lateness(at), 0.0))
        for destination, count in Tally(s.destination for s in done).items():
            self._forwarded.labels(self.endpoint, self.cap(destination)).inc(count)

    def dead_lettered(self, done: Sequence[Settled], at: datetime) -> None:
        for destination, count in Tally(s.destination for s in done).items():
            self._dead.labels(self.endpoint, self.cap(destination)).inc(count)

    def retried(self, message: DelayedMessage, attempts: int, error: Exception) -> None:
        self._retried.labels(self.endpoint, self.cap(message.destination)).inc()

    def held_back(self, destinations: Sequence[str]) -> None:
        for destination, count in Tally(destinations).items():
            self._held_back.labels(self.endpoint, self.cap(destination)).inc(count)

    def parked(self, message: DelayedMessage, reason: BaseException, until: datetime) -> None:
        self._parked.labels(self.endpoint).inc()

    def breaker_tripped(self, name: str, failures: int, error: CriticalError) -> None:
        self._trips.labels(self.endpoint, name).inc()

    def batch(self, size: int, seconds: float) -> None:
        self._batch_size.observe(size)
        self._batch_seconds.observe(seconds)

    def front_door(self, stored: int, rejected: int, duplicates: int) -> None:
        if stored:
            self._door_stored.labels(self.endpoint).inc(stored)
        if rejected:
            self._door_rejected.labels(self.endpoint).inc(rejected)
        if duplicates:
            self._door_duplicates.labels(self.endpoint).inc(duplicates)

    def planned(self, ticks: int, missed: int) -> None:
        if ticks:
            self._ticks.labels(self.endpoint).inc(ticks)
        if missed:
            self._ticks_missed.labels(self.endpoint).inc(missed)

    def schedules_set_aside(self, count: int) -> None:
        self._set_aside.labels(self.endpoint).inc(count)

    def planning_behind(self, seconds: float) -> None:
        self._planning_behind.set(seconds)


class Backlog:
    """The last backlog count and dispatcher list read from the store, refreshed by :meth:`run`."""

    def __init__(self, dispatcher: Reported, interval: float) -> None:
        self.dispatcher = dispatcher
        self.interval = interval
        self.counts: StoreCounts | None = None
        self.counted_at: datetime | None = None
        self.dispatchers: list[DispatcherInfo] = []
        self.error: str | None = None

    async def refresh(self) -> None:
        d = self.dispatcher
        seconds = min(d.settings.operation_timeout.total_seconds(), max(self.interval, 1.0))
        try:
            now = d.clock.now()
            counts = await within(d.store.counts(now), seconds, "counting the backlog")
            dispatchers = self.dispatchers
            if isinstance(d.store, DispatcherRegistry):
                dispatchers = await within(d.store.dispatchers(), seconds, "listing dispatchers")
            # All at once, after both reads: a scrape while the list is being read must not show
            # the new backlog beside the previous list (say, an empty backlog and no dispatcher).
            self.counts, self.counted_at, self.dispatchers = counts, now, dispatchers
            self.error = None
        except Exception as error:  # the gauges keep their last values; readiness says why
            self.error = one_line(error)
            log.debug("counting the backlog failed: %s", self.error)

    async def run(self) -> None:
        if not await until_started(self.dispatcher):  # counted before then, the store refuses
            return
        while not self.dispatcher.stopping:
            await self.refresh()
            if await self.dispatcher.wait_for_stop(self.interval):
                return


class DispatcherCollector:
    """Gauges read at scrape time: the backlog, breakers, the last batch, live dispatchers."""

    def __init__(self, dispatcher: Reported, backlog: Backlog, cap: LabelCap) -> None:
        self.dispatcher = dispatcher
        self.backlog = backlog
        self.cap = cap

    def describe(self) -> Iterable[Metric]:
        return []  # collected on demand; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        d, endpoint = self.dispatcher, self.dispatcher.endpoint

        def gauge(name: str, text: str, value: float, **labels: str) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, text, labels=["endpoint", *labels])
            family.add_metric([endpoint, *labels.values()], value)
            return family

        counts = self.backlog.counts
        if counts is not None and self.backlog.counted_at is not None:
            yield gauge(
                "duetime_backlog_stored",
                "Messages stored for the endpoint (in a large store, an estimate: see duetime_backlog_estimated).",
                counts.total,
            )
            yield gauge(
                "duetime_backlog_estimated",
                "1 when the stored and per-destination figures are estimates (statistics or a sample), not a count.",
                1 if counts.estimated else 0,
            )
            yield gauge("duetime_backlog_due", "Stored messages due now.", counts.due)
            yield gauge(
                "duetime_backlog_in_flight", "Messages claimed by a dispatcher right now.", counts.claimed
            )
            yield gauge(
                "duetime_backlog_failing", "Stored messages that failed at least once.", counts.failing
            )
            yield gauge(
                "duetime_backlog_oldest_due_age_seconds",
                "How long the oldest due message not yet claimed has been due.",
                counts.oldest_due_waited(self.backlog.counted_at) or 0.0,
            )
            per = GaugeMetricFamily(
                "duetime_backlog_by_destination",
                "Messages stored, by destination.",
                labels=["endpoint", "destination"],
            )
            grouped: dict[str, int] = {}
            for destination, count in counts.by_destination.items():
                label = self.cap(destination)
                grouped[label] = grouped.get(label, 0) + count
            for label, count in grouped.items():
                per.add_metric([endpoint, label], count)
            yield per
            yield gauge(
                "duetime_backlog_other_destinations",
                "Destinations left out of duetime_backlog_by_destination (it shows the 1,000 holding the most).",
                counts.more_destinations,
            )
            yield gauge(
                "duetime_backlog_other_destinations_messages",
                "Messages stored for the destinations left out of duetime_backlog_by_destination.",
                counts.more_messages,
            )
            yield gauge(
                "duetime_backlog_counted_timestamp_seconds",
                "When the backlog gauges were last counted (Unix time).",
                self.backlog.counted_at.timestamp(),
            )
        breakers = GaugeMetricFamily(
            "duetime_breaker_state",
            "Circuit breakers: 0 disarmed, 1 armed (failing), 2 tripped (the dispatcher stops).",
            labels=["endpoint", "breaker"],
        )
        armed_for = GaugeMetricFamily(
            "duetime_breaker_armed_seconds",
            "Seconds a breaker has been armed (0 when disarmed).",
            labels=["endpoint", "breaker"],
        )
        for breaker in d.breakers.timed():
            state = TRIPPED if breaker.tripped else ARMED if breaker.armed else DISARMED
            breakers.add_metric([endpoint, breaker.name], state)
            since = 0.0 if breaker.armed_at is None else d.clock.monotonic() - breaker.armed_at
            armed_for.add_metric([endpoint, breaker.name], since)
        yield breakers
        yield armed_for
        if d.last_batch_at is not None:
            yield gauge(
                "duetime_last_batch_timestamp_seconds",
                "When this dispatcher last completed a round with the store (Unix time).",
                d.last_batch_at.timestamp(),
            )
        yield gauge("duetime_dispatcher_in_flight", "Messages this dispatcher holds claimed.", d.in_flight)
        outages = CounterMetricFamily(
            "duetime_transport_outages",
            "Batches given back because the transport was down.",
            labels=["endpoint"],
        )
        outages.add_metric([endpoint], d.stats.outages)
        yield outages
        if self.backlog.dispatchers:
            live = GaugeMetricFamily(
                "duetime_dispatchers",
                "Dispatchers of the endpoint, by status (live, gone, stopped), from the store.",
                labels=["endpoint", "status"],
            )
            now = d.clock.now()
            tally = {"live": 0, "gone": 0, "stopped": 0}
            for info in self.backlog.dispatchers:
                tally[info.status(now)] += 1
            for status, count in tally.items():
                live.add_metric([endpoint, status], count)
            yield live


class AttemptCollector:
    """Each webhook endpoint's requests, read from the transports that count them (the dispatcher's
    own, or each of its routes'): how many came to what, and how long they took."""

    def __init__(self, transport: Transport, endpoint: str, cap: LabelCap) -> None:
        self.transport = transport
        self.endpoint = endpoint
        self.cap = cap

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        logs = attempt_logs(self.transport)
        if not logs:
            return
        requests = CounterMetricFamily(
            "duetime_webhook_requests",
            "Requests to webhook endpoints, by endpoint and what each came to: its answer's status "
            "class (2xx is delivered), or timeout, unreachable, address-refused (an address no one "
            "allowed), not-sent.",
            labels=["endpoint", "webhook", "outcome"],
        )
        seconds = HistogramMetricFamily(
            "duetime_webhook_request_seconds",
            "Seconds from a webhook request's start to its answer (or its failure), by endpoint.",
            labels=["endpoint", "webhook"],
        )
        tallied: dict[tuple[str, str], int] = {}
        timed: dict[str, tuple[list[int], float]] = {}
        for log in logs:
            for (name, outcome), count in list(log.outcomes.items()):
                key = (self.cap(name), outcome)
                tallied[key] = tallied.get(key, 0) + count
            for name, (counts, total) in list(log.seconds.items()):
                had, had_total = timed.get(self.cap(name)) or ([0] * len(counts), 0.0)
                timed[self.cap(name)] = ([a + b for a, b in zip(had, counts, strict=True)], had_total + total)
        for (name, outcome), count in sorted(tallied.items()):
            requests.add_metric([self.endpoint, name, outcome], count)
        for name, (counts, total) in sorted(timed.items()):
            running, buckets = 0, []
            for bound, count in zip([*map(str, REQUEST_SECONDS_BOUNDS), "+Inf"], counts, strict=True):
                running += count
                buckets.append((bound, float(running)))
            seconds.add_metric([self.endpoint, name], buckets, total)
        yield requests
        yield seconds


def instrument(
    dispatcher: Reported, *, backlog_interval: float = 10.0, max_destinations: int = 50
) -> tuple[CollectorRegistry, Backlog]:
    """A registry with the dispatcher's metrics (and the process's CPU and memory); the dispatcher
    reports into it from now on. Run the returned :class:`Backlog` to keep its gauges current."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series double what a scrape shows
    registry = CollectorRegistry(auto_describe=False)
    cap = LabelCap(max_destinations)
    dispatcher.observer.add(PrometheusObserver(registry, dispatcher.endpoint, cap))
    backlog = Backlog(dispatcher, backlog_interval)
    registry.register(DispatcherCollector(dispatcher, backlog, cap))
    registry.register(AttemptCollector(dispatcher.transport, dispatcher.endpoint, cap))
    ProcessCollector(registry=registry)
    return registry, backlog
