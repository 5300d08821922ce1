"""Patterns that vouch for a row without Python: where a database server (PostgreSQL's AREs) or
Arrow (RE2) finds a row's fields plainly fine, the row needs no look from
:func:`duetime.bulk.records.problem`, which stays the one rule; a row they do not vouch for is
simply checked there. So they may be stricter than the rule, never looser, and tests hold
both users of them to it over generated rows.

Both regex dialects read these alike: a backslash stays special inside brackets (``[^"\\\\]`` is
neither ``"`` nor ``\\``) and ``[:cntrl:]`` is the control characters.
"""

from __future__ import annotations

from duetime.clock import to_micros
from duetime.message import EARLIEST_DUE, LATEST_DUE

#: The due times a message may have, as µs since 1970: [EARLIEST_US, LATEST_US).
EARLIEST_US = to_micros(EARLIEST_DUE)
LATEST_US = to_micros(LATEST_DUE)

# A JSON string with no control character and no \u escape.
_JSON_STRING = r'"(?:[^"\\[:cntrl:]]|\\["\\/bfnrt])*"'
_JSON_KEY = r'"(?:[^"\\[:cntrl:]]|\\["\\/bfnrt])+"'
_JSON_PAIR = f"{_JSON_KEY}:{_JSON_STRING}"
#: A compact JSON object of strings to strings: what NServiceBus and duetime write.
COMPACT_HEADERS = rf"^\{{(?:{_JSON_PAIR}(?:,{_JSON_PAIR})*)?\}}$"
#: Printable ASCII without spaces: an id or destination no check refuses.
PLAIN_TEXT = "^[!-~]+$"
#: How a record's ``extra`` starts when it holds duetime's own group (``{"group": "…"}``).
GROUP_OPEN = '{"group": "'
