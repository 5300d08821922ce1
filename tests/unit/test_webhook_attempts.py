"""What a webhook transport's attempts came to, as the metrics read them: counted per endpoint and
outcome, timed into the histogram's buckets, and found behind routes and a sealed route."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from duetime.backends.memory import MemoryTransport
from duetime.engine.routes import RoutedTransport, read_routes
from duetime.engine.sealed_route import SealedDelivery
from duetime.observability.metrics import AttemptCollector, LabelCap
from duetime.webhooks import REQUEST_SECONDS_BOUNDS, AttemptLog, status_class


class Counting(MemoryTransport):
    def __init__(self) -> None:
        super().__init__()
        self.attempt_log = AttemptLog()


def test_attempts_are_counted_by_outcome_and_timed_into_buckets() -> None:
    log = AttemptLog()
    log.record("billing", status_class(204), 0.004)
    log.record("billing", status_class(503), 0.2)
    log.record("billing", "timeout", 99.0)
    log.record("billing", "not-sent", None)
    assert log.outcomes == {
        ("billing", "2xx"): 1,
        ("billing", "5xx"): 1,
        ("billing", "timeout"): 1,
        ("billing", "not-sent"): 1,
    }
    counts, total = log.seconds["billing"]
    assert sum(counts) == 3 and counts[0] == 1 and counts[-1] == 1 and total == 99.204
    assert len(counts) == len(REQUEST_SECONDS_BOUNDS) + 1
    assert status_class(99) == "other" and status_class(404) == "4xx"


def test_the_metrics_find_the_counts_behind_routes_and_a_sealed_route() -> None:
    hooks, sealed, rest = Counting(), Counting(), MemoryTransport()
    hooks.attempt_log.record("billing", "2xx", 0.01)
    sealed.attempt_log.record("payments", "5xx", 0.02)
    routes = read_routes("bill*=memory://a pay*=sealed:memory://b")
    transport = RoutedTransport([(routes[0], hooks), (routes[1], SealedDelivery(sealed))], rest)
    registry = CollectorRegistry()
    registry.register(AttemptCollector(transport, "shop", LabelCap(50)))
    text = generate_latest(registry).decode()
    assert 'duetime_webhook_requests_total{endpoint="shop",outcome="2xx",webhook="billing"} 1.0' in text
    assert 'duetime_webhook_requests_total{endpoint="shop",outcome="5xx",webhook="payments"} 1.0' in text
    assert 'duetime_webhook_request_seconds_count{endpoint="shop",webhook="billing"} 1.0' in text
    registry = CollectorRegistry()
    registry.register(AttemptCollector(rest, "shop", LabelCap(50)))
    assert "duetime_webhook" not in generate_latest(registry).decode()  # no webhooks, no series
