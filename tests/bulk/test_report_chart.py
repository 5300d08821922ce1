"""The HTML report's lateness chart with one period: a point on an axis around it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def test_one_period_of_lateness_is_drawn_on_an_axis_of_that_period() -> None:
    """One period was an empty chart on an axis from 2025 to 2029 (a line needs two points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    from duetime.bulk.report import Lateness, Report, draw_lateness

    start = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    report = Report(generated_at=start, lateness=[Lateness(start, 400, 2.0, 9.0, 30.0, 0)])
    fig, ax = plt.subplots()
    try:
        draw_lateness(fig, ax, report)
        low, high = (mdates.num2date(v) for v in ax.get_xlim())
        assert low <= start <= high and high - low == timedelta(minutes=1)
        assert all(line.get_marker() not in (None, "None", "") for line in ax.get_lines())
    finally:
        plt.close(fig)
