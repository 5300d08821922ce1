"""URL helpers every backend shares."""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from duetime.errors import ConfigurationError


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``: the only form that goes into logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


#: Bounds for numeric URL options: seconds from a millisecond to a day, counts up to a million.
#: Beyond them a value is a typo (``1e300``, ``1e-300``) that would hang or spin, not a setting.
SECONDS_RANGE = (0.001, 86_400.0)
COUNT_RANGE = (1.0, 1_000_000.0)


def number_option(
    options: Mapping[str, str], name: str, default: float, *, whole: bool = False, minimum: float = 0.0
) -> float:
    """A numeric URL option (``?claim_timeout=30``), or ConfigurationError naming it and the fix.

    Seconds must lie in :data:`SECONDS_RANGE`, whole numbers in :data:`COUNT_RANGE`.
    """
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(int(raw)) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number (seconds)"
        raise ConfigurationError(
            f"URL option {name}={raw!r} must be {kind}, e.g. {name}={default:g}."
        ) from None
    if not value > minimum:
        raise ConfigurationError(f"URL option {name} must be greater than {minimum:g}, got {raw!r}.")
    low, high = COUNT_RANGE if whole else SECONDS_RANGE
    if not (math.isfinite(value) and low <= value <= high):
        unit = "" if whole else " seconds"
        raise ConfigurationError(f"URL option {name}={raw!r} must be between {low:g} and {high:g}{unit}.")
    return value
