"""When recurring schedules tick: daylight-saving rules against tables written by hand, intervals
in elapsed time, bounds, bad input, and the catch-up policies of planning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise

import pytest

from duetime.errors import InvalidSchedule
from duetime.recurring.rules import Recurrence
from duetime.recurring.schedule import PLANNED_HEADER, SCHEDULE_HEADER, new_schedule, plan, tick_id


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def first(r: Recurrence, after: str, n: int) -> list[datetime]:
    return list(islice(r.ticks(utc(after)), n))


# Each case: the zone, the expression, where to start, and the UTC instants a person works out
# from the zone's rules (comments give the wall time).
DST_TABLE = [
    pytest.param(  # Paris, spring 2026-03-29: 02:00 CET becomes 03:00 CEST
        "Europe/Paris",
        "30 2 * * *",
        "run",
        "2026-03-27T12:00",
        ["2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30"],  # 02:30+1, the jump (03:00+2), 02:30+2
        id="paris-spring-run",
    ),
    pytest.param(
        "Europe/Paris",
        "30 2 * * *",
        "skip",
        "2026-03-27T12:00",
        ["2026-03-28T01:30", "2026-03-30T00:30"],  # 29 March has no 02:30: no tick that day
        id="paris-spring-skip",
    ),
    pytest.param(  # every half hour through the jump: 01:30+1, then 03:00+2 once (not three times)
        "Europe/Paris",
        "*/30 * * * *",
        "run",
        "2026-03-29T00:15",
        ["2026-03-29T00:30", "2026-03-29T01:00", "2026-03-29T01:30"],
        id="paris-spring-half-hours",
    ),
    pytest.param(  # Paris, autumn 2026-10-25: 03:00 CEST becomes 02:00 CET, 02:30 comes twice
        "Europe/Paris",
        "30 2 * * *",
        "run",
        "2026-10-24T12:00",
        ["2026-10-25T00:30", "2026-10-26T01:30"],  # the first 02:30 (+2) only; then 02:30+1
        id="paris-autumn-once",
    ),
    pytest.param(  # every half hour through the repeated hour: each wall time once
        "Europe/Paris",
        "*/30 * * * *",
        "run",
        "2026-10-24T23:45",
        [
            "2026-10-25T00:00",
            "2026-10-25T00:30",
            "2026-10-25T02:00",
            "2026-10-25T02:30",
        ],  # 02:00+2 02:30+2 03:00+1 03:30+1
        id="paris-autumn-half-hours",
    ),
    pytest.param(  # New York, spring 2026-03-08: 02:00 EST becomes 03:00 EDT
        "America/New_York",
        "15 2 * * *",
        "run",
        "2026-03-07T00:00",
        ["2026-03-07T07:15", "2026-03-08T07:00", "2026-03-09T06:15"],  # 02:15-5, the jump, 02:15-4
        id="new-york-spring-run",
    ),
    pytest.param(  # New York, autumn 2026-11-01: 02:00 EDT becomes 01:00 EST, 01:30 comes twice
        "America/New_York",
        "30 1 * * *",
        "run",
        "2026-10-31T12:00",
        ["2026-11-01T05:30", "2026-11-02T06:30"],  # 01:30-4 once, then 01:30-5
        id="new-york-autumn-once",
    ),
    pytest.param(  # Lord Howe, spring 2026-10-04: 02:00 (+10:30) becomes 02:30 (+11), a half hour
        "Australia/Lord_Howe",
        "15 2 * * *",
        "run",
        "2026-10-02T12:00",
        ["2026-10-02T15:45", "2026-10-03T15:30", "2026-10-04T15:15"],  # 02:15+10:30, the jump, 02:15+11
        id="lord-howe-spring-run",
    ),
    pytest.param(
        "Australia/Lord_Howe",
        "15 2 * * *",
        "skip",
        "2026-10-02T12:00",
        ["2026-10-02T15:45", "2026-10-04T15:15"],
        id="lord-howe-spring-skip",
    ),
    pytest.param(  # Lord Howe, autumn 2026-04-05: 02:00 (+11) becomes 01:30 (+10:30), 01:45 twice
        "Australia/Lord_Howe",
        "45 1 * * *",
        "run",
        "2026-04-03T12:00",
        ["2026-04-03T14:45", "2026-04-04T14:45", "2026-04-05T15:15"],  # 01:45+11, 01:45+11 once, 01:45+10:30
        id="lord-howe-autumn-once",
    ),
]


@pytest.mark.parametrize(("zone", "cron", "skipped", "after", "expected"), DST_TABLE)
def test_daylight_saving_transitions_match_the_table(
    zone: str, cron: str, skipped: str, after: str, expected: list[str]
) -> None:
    r = Recurrence(cron=cron, zone=zone, skipped=skipped)  # type: ignore[arg-type]
    assert first(r, after, len(expected)) == [utc(t) for t in expected]


def test_an_interval_is_elapsed_time_through_a_clock_change() -> None:
    r = Recurrence(every=timedelta(hours=1), zone="Europe/Paris", start=utc("2026-03-29T00:00"))
    got = first(r, "2026-03-29T00:00", 3)
    assert got == [utc("2026-03-29T01:00"), utc("2026-03-29T02:00"), utc("2026-03-29T03:00")]
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(got))


def test_an_interval_counts_from_its_anchor_and_bounds_hold() -> None:
    start = utc("2030-01-01T00:00:10")
    r = Recurrence(every=timedelta(seconds=30), start=start, end=utc("2030-01-01T00:01:40"))
    assert first(r, "2029-12-31T00:00", 10) == [start + timedelta(seconds=30 * i) for i in range(4)]
    assert first(r, "2030-01-01T00:00:41", 1) == [utc("2030-01-01T00:01:10")]
    assert Recurrence.parse("every 1h30m").every == timedelta(minutes=90)


def test_seconds_in_a_cron_expression() -> None:
    r = Recurrence.parse("*/20 * * * * *")
    assert first(r, "2030-01-01T00:00:00", 3) == [
        utc("2030-01-01T00:00:20"),
        utc("2030-01-01T00:00:40"),
        utc("2030-01-01T00:01:00"),
    ]


@pytest.mark.parametrize(
    ("when", "options", "said"),
    [
        ("0 0 30 2 *", {}, r"never fires: no month it names \(2\) has the days it names \(30\)"),
        ("0 0 31 4,6,9,11 *", {}, "never fires"),
        ("0 0 32 1 *", {}, "Cannot read the cron expression '0 0 32 1 \\*': Bad day-of-month"),  # a typo
        ("0 9 * *", {}, "has 4"),
        ("every 0s", {}, "at least 1 s"),
        ("every 1.5s", {}, "whole seconds"),
        ("every soon", {}, "Cannot read the interval"),
        ("0 9 * * *", {"zone": "Mars/Olympus"}, "Unknown time zone"),
        ("0 9 * * *", {"count": 0}, "at least 1"),
        (
            "0 9 * * *",
            {"start": utc("2030-01-02T00:00"), "end": utc("2030-01-01T00:00")},
            "ends before it starts",
        ),
        ("0 9 * * *", {"catch_up": "some"}, "catch_up"),
    ],
)
def test_a_schedule_that_cannot_be_kept_is_one_clear_line(
    when: str, options: dict[str, object], said: str
) -> None:
    with pytest.raises(InvalidSchedule, match=said) as caught:
        Recurrence.parse(when, **options)
    assert "\n" not in str(caught.value)


def test_the_host_time_zone_plays_no_part(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    r = Recurrence(cron="0 9 * * *", zone="Europe/Paris")
    before = first(r, "2030-06-01T00:00", 2)
    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    try:
        assert first(r, "2030-06-01T00:00", 2) == before == [utc("2030-06-01T07:00"), utc("2030-06-02T07:00")]
    finally:
        monkeypatch.undo()
        time.tzset()


NOW = utc("2030-01-01T12:00:00")


def test_planning_stores_up_to_the_first_tick_past_the_horizon_with_stable_ids() -> None:
    s = new_schedule("ping", "health", Recurrence(every=timedelta(seconds=10)), NOW)
    step = plan(s, NOW, timedelta(seconds=25))
    assert [t.due_at for t in step.ticks] == [NOW + timedelta(seconds=k) for k in (10, 20, 30)]
    assert (
        next(t.message_id for t in step.ticks)
        == tick_id("ping", NOW + timedelta(seconds=10))
        == "ping@2030-01-01T12:00:10Z"
    )
    tick = step.ticks[0]
    assert (
        tick.headers[SCHEDULE_HEADER] == "ping"
        and tick.headers[PLANNED_HEADER] == "2030-01-01T12:00:10+00:00"
    )
    assert step.after.planned_until == NOW + timedelta(seconds=30) and step.missed == 0
    again = plan(step.after, NOW + timedelta(seconds=1), timedelta(seconds=25))
    assert again.ticks == []  # planned already: nothing new
    monthly = new_schedule("bill", "billing", Recurrence(cron="0 0 1 * *"), NOW)
    assert [t.due_at for t in plan(monthly, NOW, timedelta(seconds=25)).ticks] == [utc("2030-02-01T00:00")]


@pytest.mark.parametrize(
    ("policy", "window", "sent_minutes", "missed"),
    [
        ("none", None, [], 10),
        ("latest", None, [10], 9),
        ("all", None, list(range(1, 11)), 0),
        ("all", timedelta(minutes=3, seconds=30), [7, 8, 9, 10], 6),
    ],
)
def test_ticks_missed_while_no_dispatcher_ran_follow_the_catch_up_policy(
    policy: str, window: timedelta | None, sent_minutes: list[int], missed: int
) -> None:
    r = Recurrence(cron="* * * * *", catch_up=policy, catch_up_window=window)  # type: ignore[arg-type]
    s = new_schedule("m", "q", r, NOW)
    away = NOW + timedelta(minutes=10, seconds=30)  # back after ten ticks went by
    step = plan(s, away, timedelta(seconds=5))
    past = [t.due_at for t in step.ticks if t.due_at < away]
    assert past == [NOW + timedelta(minutes=m) for m in sent_minutes]
    assert step.missed == missed == step.after.ticks_missed
    assert step.ticks[-1].due_at == NOW + timedelta(minutes=11)  # and the next one is stored


def test_a_count_ends_the_schedule_and_paused_plans_nothing() -> None:
    s = new_schedule("three", "q", Recurrence(every=timedelta(seconds=1), count=3), NOW)
    step = plan(s, NOW, timedelta(seconds=60))
    assert len(step.ticks) == 3 and step.after.planned_until is None and step.after.state() == "ended"
    assert plan(step.after, NOW, timedelta(seconds=60)).ticks == []
    paused = new_schedule("p", "q", Recurrence(every=timedelta(seconds=1)), NOW, paused=True)
    assert plan(paused, NOW, timedelta(seconds=60)).ticks == [] and paused.state() == "paused"


def test_a_schedule_id_that_would_break_tick_ids_is_refused() -> None:
    for bad in ("", "a@b", "x" * 171, "tab\there"):
        with pytest.raises(InvalidSchedule):
            new_schedule(bad, "q", Recurrence(every=timedelta(seconds=1)), NOW)


async def test_a_planner_whose_store_fails_says_so_once_and_plans_again_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store outage (or one set up before schedules) is one warning, not one a second, and never
    ends the dispatcher; the planner says when it plans again."""
    from duetime.engine.planning import Planner
    from duetime.errors import StoreNotReady
    from duetime.recurring.schedule import PlanReport

    answers: list[object] = [
        ConnectionError("down"),
        ConnectionError("down"),
        PlanReport(),
        StoreNotReady("run setup"),
    ]

    class Store:
        async def plan_schedules(
            self, now: datetime | None = None, *, steady_since: datetime | None = None
        ) -> PlanReport:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            assert isinstance(answer, PlanReport)
            return answer

    caplog.set_level("INFO", "duetime.recurring")
    planner = Planner(Store(), lambda: NOW)  # type: ignore[arg-type]
    for _ in range(4):
        await planner.plan_once()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "planning recurring schedules failed: ConnectionError: down",
        "planning recurring schedules again",
        "run setup",
    ], said


def test_a_tick_for_an_nservicebus_endpoint_has_its_own_message_id_and_time_sent() -> None:
    copied = {"NServiceBus.EnclosedMessageTypes": "Billing.CloseInvoices", "NServiceBus.MessageId": "same"}
    s = new_schedule("close", "billing", Recurrence(every=timedelta(seconds=10)), NOW, headers=copied)
    ticks = plan(s, NOW, timedelta(seconds=25)).ticks
    assert [t.headers["NServiceBus.MessageId"] for t in ticks] == [t.message_id for t in ticks]
    assert ticks[0].headers["NServiceBus.TimeSent"] == "2030-01-01 12:00:10:000000 Z"
    plain = plan(
        new_schedule("ping", "health", Recurrence(every=timedelta(seconds=10)), NOW),
        NOW,
        timedelta(seconds=25),
    )
    assert not any(h.startswith("NServiceBus.") for t in plain.ticks for h in t.headers)


def test_ticks_planned_while_planning_kept_on_are_late_not_missed() -> None:
    """Planning that falls behind (a hundred thousand schedules on two cores) made ticks "missed
    while no dispatcher ran" while dispatchers ran, and ``latest`` dropped them. A tick planned
    after the planner's unbroken run began is late and goes; only those before it were missed."""
    s = new_schedule("m", "q", Recurrence(cron="* * * * *"), NOW)
    s = plan(s, NOW, timedelta(seconds=30)).after  # 12:01 stored
    later = NOW + timedelta(minutes=10, seconds=30)
    kept_on = plan(s, later, timedelta(seconds=30), steady_since=NOW)
    assert [t.due_at for t in kept_on.ticks] == [NOW + timedelta(minutes=k) for k in range(2, 13)]
    assert kept_on.missed == 0
    away = plan(s, later, timedelta(seconds=30))  # nobody planned: those before now were missed
    assert [t.due_at for t in away.ticks] == [NOW + timedelta(minutes=k) for k in (10, 11, 12)]
    assert away.missed == 8


async def test_a_planner_says_missed_ticks_in_one_line_and_when_it_is_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """201,001 warnings, one a schedule, were one planning pass's missed ticks; now one line a
    pass names a few and counts the rest. A pass whose schedules waited past BEHIND_AFTER says
    planning is behind, once a minute, and the metric has the figure."""
    from duetime.engine.observe import DispatchObserver
    from duetime.engine.planning import BEHIND_AFTER, Planner
    from duetime.recurring.schedule import PlanReport

    missed_by = tuple((f"s{i}", 2) for i in range(7))
    answers = [
        PlanReport(7, 0, 14, None, missed_by, waited=BEHIND_AFTER + 10),
        PlanReport(waited=BEHIND_AFTER + 20),
    ]
    seen: list[float] = []
    steady: list[datetime | None] = []

    class Store:
        async def plan_schedules(
            self, now: datetime | None = None, *, steady_since: datetime | None = None
        ) -> PlanReport:
            steady.append(steady_since)
            return answers.pop(0)

    class Seen(DispatchObserver):
        def planning_behind(self, seconds: float) -> None:
            seen.append(seconds)

    caplog.set_level("INFO", "duetime.recurring")
    planner = Planner(Store(), lambda: NOW, Seen())  # type: ignore[arg-type]
    answers.insert(0, PlanReport(waited=600))  # the first pass: the wait is the time away, not a lag
    for _ in range(3):
        await planner.plan_once()
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == (
        "14 tick(s) of 7 schedule(s) missed while no dispatcher ran (their catch-up policy left them "
        "out): s0 (2), s1 (2), s2 (2), s3 (2), s4 (2) and 2 more"
    )
    assert said[1].startswith("planning recurring schedules is behind: a schedule waited 15 s")
    assert len(said) == 2  # behind is said once a minute
    assert seen == [BEHIND_AFTER + 10, BEHIND_AFTER + 20]  # each step
    assert steady == [None, NOW, NOW]  # later passes know planning kept on since the first


def test_a_jitter_spreads_ticks_over_its_window_the_same_on_every_planning() -> None:
    """A thousand schedules for one minute with a 30 s jitter: every tick due within 30 s after
    its planned time, never before, spread (not bunched), each tick's due time the same on a
    second planning, and its id still its planned time's."""
    jittered = Recurrence(every=timedelta(minutes=1), jitter=timedelta(seconds=30))
    offsets = []
    for n in range(1000):
        s = new_schedule(f"s-{n}", "reminders", jittered, NOW)
        [first] = plan(s, NOW, timedelta(seconds=1), most=1).ticks
        planned = datetime.fromisoformat(first.headers[PLANNED_HEADER])
        assert first.message_id == tick_id(f"s-{n}", planned)
        assert [t.due_at for t in plan(s, NOW, timedelta(seconds=1), most=1).ticks] == [first.due_at]
        offsets.append((first.due_at - planned).total_seconds())
    assert min(offsets) >= 0 and max(offsets) < 30
    assert len({int(o // 3) for o in offsets}) == 10  # every tenth of the window has some
    assert "each up to 30 s later" in jittered.describe()
    assert Recurrence.from_json(jittered.to_json()) == jittered
    with pytest.raises(InvalidSchedule, match="jitter"):
        Recurrence(every=timedelta(minutes=1), jitter=timedelta(days=2))


def test_a_schedule_printed_as_json_keeps_every_byte_of_its_body() -> None:
    """``recurring show`` printed a body that is not UTF-8 with Python's escapes (``a\\xffb``),
    which no reader can undo; it is now ``body_hex``, as ``duetime show --json`` gives a message's,
    and the HTTP API's ``body_base64`` is the same bytes."""
    from duetime.api.models import ScheduleView
    from duetime.recurring.schedule import schedule_json

    every_10s = Recurrence(every=timedelta(seconds=10))
    text = schedule_json(new_schedule("t", "q", every_10s, NOW, body="é".encode()), NOW)
    assert text["body"] == "é" and "body_hex" not in text
    raw = new_schedule("b", "q", every_10s, NOW, body=b"a\xffb\\x")
    printed = schedule_json(raw, NOW)
    assert "body" not in printed and bytes.fromhex(printed["body_hex"]) == b"a\xffb\\x"
    assert ScheduleView.of(raw, NOW).body_base64 == "Yf9iXHg="
