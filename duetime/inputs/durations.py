"""Human durations and times for the CLI: ``90``, ``1.5s``, ``250ms``, ``10m``, ``1h30m``, ``2d``."""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime, timedelta

from duetime.errors import InvalidMessage

#: No duration duetime takes is longer than this: due times end in year 9998.
LONGEST = timedelta(days=365 * 8000)


class NegativeDuration(InvalidMessage):
    """A duration written with a minus sign."""


class DurationTooLong(InvalidMessage):
    """A duration past :data:`LONGEST`."""


_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@functools.lru_cache(maxsize=1024)  # producers repeat the same few ("1h"): read each once
def parse_duration(text: str) -> timedelta:
    raw = text.strip().lower().replace(" ", "")
    if raw.startswith("-"):
        raise NegativeDuration(
            f"A delay must not be negative, got {text!r}; a message cannot be due in the past."
        )
    try:
        plain: float | None = float(raw)
    except ValueError:
        plain = None
    if plain is not None:
        return _span(text, plain)
    pos, seconds = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise InvalidMessage(
            f"Cannot read the duration {text!r}; write e.g. 90, 1.5s, 250ms, 10m, 1h30m or 2d."
        )
    return _span(text, seconds)


def _span(text: str, seconds: float) -> timedelta:
    """Seconds as a timedelta, or a clear error for inf, nan and spans past year 9998."""
    if math.isnan(seconds):
        raise InvalidMessage(
            f"Cannot read the duration {text!r}; write e.g. 90, 1.5s, 250ms, 10m, 1h30m or 2d."
        )
    if math.isinf(seconds) or seconds > LONGEST.total_seconds():
        raise DurationTooLong(f"The duration {text!r} is too long; due times end in year 9998.")
    return timedelta(seconds=seconds)


def parse_time(text: str, *, naive_is_utc: bool = False) -> datetime:
    """ISO 8601, the one reader of a time a user gives. A time without an offset is refused
    rather than guessed, unless the form it came from says its times are UTC
    (``naive_is_utc``: the dashboard's search boxes, labelled so)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidMessage(
            f"Cannot read the time {text!r}; write ISO 8601 with an offset, e.g. 2030-01-01T09:00:00+01:00."
        ) from None
    if moment.tzinfo is None and naive_is_utc:
        moment = moment.replace(tzinfo=UTC)
    if moment.tzinfo is None:
        raise InvalidMessage(f"The time {text!r} has no UTC offset; add one, e.g. {text}+00:00 or {text}Z.")
    try:
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidMessage(
            f"The time {text!r} is outside the years duetime supports (1970-9998 in UTC)."
        ) from None


def readable_duration(seconds: float) -> str:
    """A duration in the unit that reads best, as the dashboard, the summary line and reports show
    it: ``0.4 ms``, ``12.6 ms``, ``850 ms``, ``12.6 s``, ``14 min``, ``3.2 h``."""
    if math.isinf(seconds):
        return "over 1 h" if seconds > 0 else "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
