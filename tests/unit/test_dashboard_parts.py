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
    # a: 60 in 10 s; b's first report covers its start-up (a burst, not a rate): no rate yet
    assert second.delivered_per_minute == 360.0
    assert second.fresh
    assert second.p99_ms is not None and 500 <= second.p99_ms < 700  # a's slow 60 are new
    assert second.lateness.total == 90
    # A look between two heartbeats learns nothing: the rate stands, the sample is not fresh.
    between = timeline.add(t10 + timedelta(seconds=2), COUNTS, [a, b])
    assert between.forwarded == 0 and not between.fresh and between.delivered_per_minute == 360.0
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


def test_a_start_up_burst_is_counted_but_not_charted_as_a_rate() -> None:
    """A dispatcher that starts on a backlog sends 5,000 in its first 2.7 s: read as a rate, that
    was 110,000/min and flattened the chart's real rate to a line at zero."""
    timeline = Timeline()
    timeline.add(T0, COUNTS, [])
    started = T0 + timedelta(seconds=1)
    burst = timeline.add(
        T0 + timedelta(seconds=10),
        COUNTS,
        [info("new", 5_000, [0.001], started, started + timedelta(seconds=2.7))],
    )
    assert burst.forwarded == 5_000 and burst.delivered_per_minute == 0.0
    steady = timeline.add(
        T0 + timedelta(seconds=20),
        COUNTS,
        [info("new", 5_100, [0.001], started, started + timedelta(seconds=12.7))],
    )
    assert steady.delivered_per_minute == 600.0  # 100 in its 10 s between reports


def test_durations_read_in_the_unit_that_reads_best() -> None:
    from duetime.inputs.durations import readable_duration

    cases = {
        0.0004: "0.4 ms",
        0.0126: "13 ms",
        0.85: "850 ms",
        12.5893: "12.6 s",
        6.924: "6.9 s",
        840: "14 min",
    }
    assert {s: readable_duration(s) for s in cases} == cases
    assert readable_duration(3 * 3600 + 720) == "3.2 h" and readable_duration(float("inf")) == "over 1 h"


def test_the_oldest_due_wait_is_measured_at_the_counts_own_time() -> None:
    """A count taken 10 s ago whose earliest message was then 2 s from due shows no wait (the
    metric says 0 for the same count), not the 8 s that 'now' would make of it."""
    from duetime.dashboard.app import _oldest_due

    counted_at = T0
    counts = StoreCounts(total=5, due=0, claimed=0, failing=0, next_due=T0 + timedelta(seconds=2))
    assert counts.oldest_due_waited(counted_at) is None
    assert _oldest_due(counts, counted_at) == "none due"
    late = StoreCounts(total=5, due=1, claimed=0, failing=0, next_due=T0 - timedelta(seconds=30))
    assert late.oldest_due_waited(counted_at) == 30 and _oldest_due(late, counted_at) == "30.0 s"


def test_every_page_writes_times_one_way_and_the_lateness_axis_fits() -> None:
    from duetime.dashboard.app import _header_time, _time
    from duetime.dashboard.charts import Series, line_chart, seconds_label

    at = datetime(2030, 1, 1, 9, 0, 0, 123456, tzinfo=UTC)
    assert _header_time(at.isoformat()) == _time(at) == "2030-01-01 09:00:00.123 UTC"
    assert _header_time("not a time") == "not a time"
    chart = line_chart(
        "Lateness", [Series("p99", [(T0, 6.294), (T0 + timedelta(seconds=60), 0.012)])], label=seconds_label
    )
    assert ">6.9 s<" in chart and " ms<" not in chart.split("6.9 s")[0]  # not "6,924 ms"
    # each point says its value on hover (an SVG title), times in UTC as on the rest of the page
    assert f"<title>p99 at {T0.astimezone(UTC):%H:%M:%S} UTC: 6.3 s</title>" in chart, chart
    assert f">{(T0 + timedelta(seconds=60)).astimezone(UTC):%H:%M:%S} UTC</text>" in chart
    many = line_chart("Backlog", [Series("stored", [(T0 + timedelta(seconds=i), i) for i in range(3600)])])
    assert 100 <= many.count("<title>stored at") <= 120  # an hour of samples stays a small page


def test_the_login_throttle_counts_per_client_and_overall_and_forgets_with_time() -> None:
    from duetime.dashboard.security import (
        FAILURE_WINDOW,
        OVERALL_FAILURES,
        PER_CLIENT_FAILURES,
        LoginThrottle,
    )

    now = [0.0]
    throttle = LoginThrottle(clock=lambda: now[0])
    for _ in range(PER_CLIENT_FAILURES):
        assert throttle.wait("a") == 0
        throttle.failed("a")
    assert throttle.wait("a") == FAILURE_WINDOW and throttle.wait("b") == 0
    now[0] += FAILURE_WINDOW / 2
    assert throttle.wait("a") == FAILURE_WINDOW / 2
    now[0] += FAILURE_WINDOW / 2 + 0.001
    assert throttle.wait("a") == 0  # the window moved on
    for i in range(OVERALL_FAILURES):  # many addresses, a few each: the overall limit
        throttle.failed(f"c{i}")
    assert throttle.wait("fresh") > 0
    assert throttle.failures_total == PER_CLIENT_FAILURES + OVERALL_FAILURES
