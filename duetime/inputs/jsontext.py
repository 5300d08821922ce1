"""JSON from outside (a file to load, a message's headers, a data set's lines), read one way.

Python refuses to turn a number of more than 4,300 digits into an int, with a ValueError that
names a setting of the interpreter; no field of a message needs more than a few digits, so a
long number is refused here, by its length, in words that say what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

#: Digits a whole number in outside JSON may have (a due time in microseconds has 16).
MOST_DIGITS = 40


class NumberTooLong(ValueError):
    """A whole number longer than :data:`MOST_DIGITS` digits."""


def _whole(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MOST_DIGITS:
        raise NumberTooLong(f"a number of {digits:,} digits (at most {MOST_DIGITS})")
    return int(text)


def read_json(text: str | bytes) -> Any:
    """``json.loads``, refusing whole numbers of over :data:`MOST_DIGITS` digits
    (:class:`NumberTooLong`, a ValueError); RecursionError for nesting too deep to read."""
    return json.loads(text, parse_int=_whole)
