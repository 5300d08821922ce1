"""The row every duetime store keeps for a delayed message, defined once.

The SQL stores' tables, their queries, the bulk jobs' writes (Arrow's layout and the binary COPY)
and the readers all take these columns in this order; ``tests/unit/test_store_rows.py`` compares
every column list of the project's SQL and Python to this one, so a second definition fails.
A store adds columns of its own for its claims (``claim_token``, ``claimed_until``) after these.
"""

from __future__ import annotations

#: id, destination, due time, headers (JSON), body, failure count, group.
STORE_COLUMNS = ("message_id", "destination", "due_at", "headers", "body", "failure_count", "group_key")
#: The store's own, for the claims of its dispatchers.
CLAIM_COLUMNS = ("claim_token", "claimed_until")
