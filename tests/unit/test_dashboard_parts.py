"""The dashboard's parts without a server: what the timeline makes of heartbeats, the login check,
the charts, and where an action may send the browser back to."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

from duetime.dashboard.app import _safe_back
from duetime.dashboard.charts import Series, line_chart
from duetime.dashboard.security import Credentials
from duetime.dashboard.timeline import Timeline
from duetime.engine.summary import LatenessHistogram
from duetime.interfaces import StoreCounts
from duetime.live_dispatchers import DispatcherInfo

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
COUNTS = StoreCounts(total=10, due=2, claimed=1, failing=0, next_due=T0)


def info(
    name: str, forwarded: int, late: list[float], started: datetime = T0, seen: datetime | None = None
) -> DispatcherInfo:
    h = LatenessHistogram()
    h.add(late)
    return DispatcherInfo(
        dispatcher_id=name, endpoint="e", host="h", pid=1, version="1", mode="exactly-once",
        transport="t", started_at=started, last_seen=seen or started, forwarded=forwarded, lateness=h.sparse(),
    )  # fmt: skip


def test_delivered_and_lateness_are_the_change_since_the_last_look() -> None:
    timeline = Timeline()
    first = timeline.add(T0, COUNTS, [info("a", 100, [0.001] * 100)])
    assert first.forwarded is None and first.delivered_per_minute is None
    t10 = T0 + timedelta(seconds=10)
    a, b = (
        info("a", 160, [0.001] * 100 + [0.5] * 60, seen=t10),
        info("b", 30, [0.002] * 30, T0 + timedelta(seconds=5), t10),
    )
    second = timeline.add(t10, COUNTS, [a, b])
    assert second.forwarded == 90  # 60 more from a, and b's 30 since it started
    assert second.delivered_per_minute == 720.0  # a: 60 in 10 s, b: 30 in its 5 s
    assert second.fresh
    assert second.p99_ms is not None and 500 <= second.p99_ms < 700  # a's slow 60 are new
    assert timeline.lateness(60).total == 90
    # A look between two heartbeats learns nothing: the rate stands, the sample is not fresh.
    between = timeline.add(t10 + timedelta(seconds=2), COUNTS, [a, b])
    assert between.forwarded == 0 and not between.fresh and between.delivered_per_minute == 720.0
    assert between.p50_ms is None


def test_a_dispatcher_first_seen_late_is_not_counted_whole() -> None:
    """One that was there before, unseen (the store did not answer), has no baseline."""
    timeline = Timeline()
    timeline.add(T0, COUNTS, [])
    later = timeline.add(
        T0 + timedelta(seconds=10), COUNTS, [info("old", 1_000_000, [0.001], T0 - timedelta(hours=1))]
    )
    assert later.forwarded == 0


def test_credentials_take_basic_and_bearer_and_nothing_else() -> None:
    c = Credentials("ops", "s3cret:with colon")
    good = "Basic " + base64.b64encode(b"ops:s3cret:with colon").decode()
    assert c.accept(good)
    assert c.accept("Bearer s3cret:with colon")
    assert not c.accept("Basic " + base64.b64encode(b"ops:wrong").decode())
    assert not c.accept("Basic " + base64.b64encode(b"other:s3cret:with colon").decode())
    assert not c.accept("Basic !!!not base64")
    assert not c.accept("")
    assert Credentials.from_env({}) is None
    assert Credentials.from_env({"DUETIME_DASHBOARD_PASSWORD": "x"}) == Credentials("duetime", "x")


def test_actions_only_return_to_this_site() -> None:
    assert _safe_back("/messages?destination=a", "/") == "/messages?destination=a"
    for foreign in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "", None):
        assert _safe_back(foreign, "/fallback") == "/fallback"


def test_a_chart_draws_lines_with_gaps_and_escapes_names() -> None:
    points = [(T0 + timedelta(seconds=i), None if i == 2 else float(i)) for i in range(5)]
    svg = line_chart("Lateness <p99>", [Series("p<99>", points)], " ms")
    assert svg.startswith("<svg") and svg.count("<polyline") == 2  # the gap splits the line
    assert "<p99>" not in svg and "&lt;p99&gt;" in svg
    assert "not enough samples" in line_chart("Backlog", [Series("stored", points[:1])])
