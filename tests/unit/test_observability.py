"""Metrics, probes and presence on the memory backends and a fake clock (no network)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from duetime.live_dispatchers import DispatcherInfo, describe_claims
from duetime.observability.heartbeat import Heartbeat
from duetime.observability.metrics import OTHER, LabelCap, instrument
from duetime.observability.probes import health, readiness
from tests.unit.helpers import Rig


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


async def test_counters_and_lateness_follow_what_the_dispatcher_did() -> None:
    from prometheus_client import generate_latest

    rig = await Rig(number_of_retries=0).setup("orders")
    registry, backlog = instrument(rig.dispatcher, max_destinations=1)
    await rig.store.store_many([rig.message(1, -0.02), rig.message(2, -3), rig.message(3, 100)])
    await rig.store.store(rig.message(4, -1).with_changes(destination="nowhere"))
    await rig.dispatcher.run_burst()
    await backlog.refresh()
    found = samples(generate_latest(registry))
    assert value(found, "duetime_forwarded_total", endpoint="unit", destination="orders") == 2
    # the cap of one destination label: the second destination is counted as "other"
    assert value(found, "duetime_dead_lettered_total", endpoint="unit", destination=OTHER) == 1
    assert value(found, "duetime_claimed_total", endpoint="unit") == 3
    assert value(found, "duetime_lateness_seconds_count", endpoint="unit") == 2
    assert value(found, "duetime_lateness_seconds_bucket", endpoint="unit", le="0.025") == 1
    assert value(found, "duetime_lateness_seconds_bucket", endpoint="unit", le="5.0") == 2
    assert value(found, "duetime_backlog_stored", endpoint="unit") == 1
    assert value(found, "duetime_backlog_due", endpoint="unit") == 0
    assert value(found, "duetime_breaker_state", endpoint="unit", breaker="fetch") == 0


async def test_recurring_ticks_stored_and_missed_are_counted() -> None:
    from prometheus_client import generate_latest

    from duetime.recurring import every
    from duetime.recurring.schedule import new_schedule

    rig = await Rig().setup("orders")
    registry, _ = instrument(rig.dispatcher, max_destinations=5)
    then = rig.clock.now() - timedelta(minutes=10, seconds=30)
    away = new_schedule("away", "orders", every("1m", start=then), then)
    await rig.store.add_schedule(away, then)  # one tick stored then; nine planned while away
    await rig.dispatcher.run_burst()
    found = samples(generate_latest(registry))
    assert value(found, "duetime_recurring_ticks_missed_total", endpoint="unit") == 8  # the latest goes
    # the latest missed, then up to the first tick more than 30 s ahead (+11 and +12 min)
    assert value(found, "duetime_recurring_ticks_stored_total", endpoint="unit") == 3


async def test_oldest_due_age_and_armed_breakers_show() -> None:
    from prometheus_client import generate_latest

    rig = await Rig().setup("orders")
    registry, backlog = instrument(rig.dispatcher)
    await rig.store.store(rig.message(1, -42))
    rig.dispatcher.fetch_breaker.failure(ConnectionError("database is down"))  # armed
    rig.clock.advance(12)
    await backlog.refresh()
    found = samples(generate_latest(registry))
    assert 53 <= value(found, "duetime_backlog_oldest_due_age_seconds", endpoint="unit") <= 55
    assert value(found, "duetime_breaker_state", endpoint="unit", breaker="fetch") == 1
    assert value(found, "duetime_breaker_armed_seconds", endpoint="unit", breaker="fetch") >= 12
    assert await readiness(rig.dispatcher, ready_after=10) == "circuit breaker fetch armed for 12 s (failing)"
    assert await readiness(rig.dispatcher, ready_after=20) is None


async def test_health_says_when_the_loop_is_stuck_and_readiness_when_the_store_is_down() -> None:
    rig = await Rig().setup("orders")
    d = rig.dispatcher
    assert health(d) is None
    rig.clock.advance(d.stuck_after + 1)
    assert "has not turned for" in (health(d) or "")
    await d.dispatch_once()
    assert health(d) is None
    rig.store.fail_fetch = True
    assert (await readiness(d, 10) or "").startswith("store unreachable: ")


def test_the_health_probe_needs_only_its_view_of_a_dispatcher() -> None:
    """The companions take a narrow view (duetime.engine.companions), not the Dispatcher: the
    health probe reads a breaker list, a clock and when the loop last turned, nothing more."""
    from types import SimpleNamespace

    from duetime.testing import FakeClock

    clock = FakeClock()
    view = SimpleNamespace(
        breakers=SimpleNamespace(timed=lambda: []), clock=clock, turned_at=clock.monotonic(), stuck_after=60.0
    )
    assert health(view) is None  # the fields health reads, and no more
    clock.advance(61)
    assert "has not turned for 61 s" in (health(view) or "")


def test_label_cap() -> None:
    cap = LabelCap(2)
    assert [cap(x) for x in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]


async def test_heartbeat_records_the_dispatcher_and_says_when_it_stopped() -> None:
    rig = await Rig().setup("orders")
    await rig.store.store(rig.message(1, -1))
    await rig.dispatcher.run_burst()
    await rig.store.initialize("unit", rig.dispatcher.mode)
    beat = Heartbeat(rig.dispatcher, "memory://")
    await beat.beat()
    [info] = await rig.store.dispatchers()
    assert (info.forwarded, info.endpoint, info.status(rig.clock.now())) == (1, "unit", "live")
    assert info.last_batch_at == rig.dispatcher.last_batch_at
    rig.clock.advance(16)
    [info] = await rig.store.dispatchers()
    assert info.status(rig.clock.now()) == "gone"
    await beat.beat(stopped=True)
    [info] = await rig.store.dispatchers()
    assert info.status(rig.clock.now()) == "stopped"


def test_what_a_gone_dispatcher_held() -> None:
    t = datetime(2030, 1, 1, tzinfo=UTC)
    info = DispatcherInfo.new("e", "at-least-once", "amqp://mq", t)
    assert describe_claims(info, t) == "held nothing"
    held = info.with_changes(in_flight=100, claims_end_by=t + timedelta(seconds=25))
    assert describe_claims(held, t) == "100 it held come back in 25 s"
    assert describe_claims(held, t + timedelta(seconds=30)) == "100 it held are claimable again"
    assert DispatcherInfo.from_json(held.to_json()) == held


async def test_the_grafana_dashboard_asks_only_for_metrics_duetime_exports() -> None:
    import json
    import re
    from pathlib import Path

    from prometheus_client import generate_latest

    rig = await Rig(number_of_retries=1).setup("orders")
    registry, backlog = instrument(rig.dispatcher)
    await rig.store.store(rig.message(1, -1))
    await rig.dispatcher.run_burst()
    await Heartbeat(rig.dispatcher, "memory://").beat()
    await rig.store.initialize("unit", rig.dispatcher.mode)
    await backlog.refresh()
    names: set[str] = set()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        names |= {family.name, f"{family.name}_total"} | {s.name for s in family.samples}
        if family.type == "histogram":
            names |= {f"{family.name}_{part}" for part in ("bucket", "sum", "count")}
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bduetime_[a-z_]+", target["expr"])
    }
    assert len(asked) >= 12
    assert asked <= names, asked - names


async def test_a_scrape_during_a_refresh_shows_the_last_whole_reading() -> None:
    """The backlog and the dispatcher list change together: a scrape between the two reads once
    showed an empty backlog beside the previous (empty) list, as if no dispatcher ran."""
    import asyncio

    from prometheus_client import generate_latest

    rig = await Rig().setup("orders")
    registry, backlog = instrument(rig.dispatcher)
    await rig.store.store(rig.message(1, 100))
    await Heartbeat(rig.dispatcher, "memory://").beat()
    listed = rig.store.dispatchers
    gate = asyncio.Event()

    async def slow_list() -> list[DispatcherInfo]:
        await gate.wait()
        return await listed()

    rig.store.dispatchers = slow_list  # type: ignore[method-assign]
    refreshing = asyncio.create_task(backlog.refresh())
    await asyncio.sleep(0.01)  # counted; the list is still being read
    assert ("duetime_backlog_stored", frozenset({("endpoint", "unit")})) not in samples(
        generate_latest(registry)
    )
    gate.set()
    await refreshing
    found = samples(generate_latest(registry))
    assert value(found, "duetime_backlog_stored", endpoint="unit") == 1
    assert value(found, "duetime_dispatchers", endpoint="unit", status="live") == 1


def test_an_estimated_backlog_never_reads_as_a_count() -> None:
    from duetime.engine.summary import LatenessHistogram, Tally, summary_line
    from duetime.interfaces import StoreCounts, about

    assert [about(n, True) for n in (0, 339, 52_345, 10_000_000)] == [
        "about 0",
        "about 340",
        "about 52,000",
        "about 10.0 M",
    ]
    assert about(52_345, False) == "52,345"
    big = StoreCounts(10_000_000, 5, 0, 0, None, {"a": 6_000_000}, 199, 4_000_000, estimated=True)
    assert "backlog about 10.0 M stored, 5 due" in summary_line(60, Tally(), LatenessHistogram(), big)
    assert big.rest_said() == "and about 200 more destinations"
    uncounted = StoreCounts(2_000_000, 0, 0, 0, None, {}, 0, 2_000_000, estimated=True)
    assert uncounted.rest_said() == "destinations not counted (a store this large is not scanned)"
    assert StoreCounts(3, 0, 0, 0, None, {"a": 3}).rest_said() == ""


async def test_the_backlog_is_first_counted_once_the_dispatcher_has_started() -> None:
    """Counted before the store is bound to the endpoint, the store refuses: the gauges then stayed
    empty for a whole interval (10 s), which a loaded machine showed as a missing backlog."""
    import asyncio

    from tests.unit.helpers import settle

    rig = Rig()
    _, backlog = instrument(rig.dispatcher)
    counting = asyncio.create_task(backlog.run())
    await settle()
    assert (backlog.counts, backlog.error) == (None, None)  # not asked before the start
    await rig.setup("orders")
    await rig.store.store(rig.message(1, 100))
    await rig.start()
    rig.clock.advance(0.05)
    await settle()
    assert backlog.error is None
    assert backlog.counts is not None and backlog.counts.total == 1
    rig.dispatcher.stop()
    await asyncio.wait_for(counting, 5)
    assert rig.task is not None
    await rig.task
