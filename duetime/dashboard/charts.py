"""Line charts as inline SVG, drawn on the server.

A chart here is a few lines over time with a scale and a legend; drawing it as SVG text keeps the
dashboard one Python package that works without JavaScript (its CSP allows no inline script),
loads nothing from the internet (many operators' networks are closed) and shows the same in a
screenshot as in a browser. Each point carries its value as an SVG ``<title>``, which a browser
shows on hover; times are UTC, as everywhere on the dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from duetime.inputs.durations import readable_duration

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 40
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")
#: Points per series that answer a hover (evenly spread): an hour of samples stays a small page.
HOVER_POINTS = 120


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: Sequence[tuple[datetime, float | None]]


def _label(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _clock(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%H:%M:%S")


def seconds_label(value: float) -> str:
    """An axis label for a chart of seconds, in the unit that reads best (``6.9 s``, ``850 ms``)."""
    return "0" if value == 0 else readable_duration(value)


def line_chart(
    title: str, series: Sequence[Series], unit: str = "", label: Callable[[float], str] | None = None
) -> str:
    """An SVG chart of ``series`` (gaps where a value is None), or a line saying there is nothing
    to draw yet. Axis values read ``label(value)``, else a count followed by ``unit``."""
    values = [v for s in series for _, v in s.points if v is not None]
    times = [t for s in series for t, _ in s.points]
    if len(set(times)) < 2 or not values:
        return f'<p class="empty" aria-label="{escape(title)}">{escape(title)}: not enough samples yet.</p>'
    start, end = min(times), max(times)
    span = max((end - start).total_seconds(), 1e-9)
    top = max(values) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: datetime) -> float:
        return LEFT + plot_w * (t - start).total_seconds() / span

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    def shown(value: float) -> str:
        return label(value) if label else _label(value) + unit

    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        value = top * fraction
        parts.append(
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11">'
            f"{escape(shown(value))}</text>"
        )
    middle = start + (end - start) / 2
    for t, anchor, suffix in ((start, "start", ""), (middle, "middle", ""), (end, "end", " UTC")):
        parts.append(
            f'<text x="{x(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="{anchor}" font-size="11">'
            f"{_clock(t)}{suffix}</text>"
        )
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        runs: list[list[str]] = [[]]
        for t, v in s.points:
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            elif run:
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(run)}"/>'
                )
        points = [(t, v) for t, v in s.points if v is not None]
        for t, v in points[:: max(1, -(-len(points) // HOVER_POINTS))]:
            parts.append(
                f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="5" fill="{colour}" fill-opacity="0">'
                f"<title>{escape(s.name)} at {_clock(t)} UTC: {escape(shown(v))}</title></circle>"
            )
        legend_x = LEFT + i * 150
        parts.append(f'<rect x="{legend_x}" y="{HEIGHT - 14}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="{HEIGHT - 5}" font-size="11">{escape(s.name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
