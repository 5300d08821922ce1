"""Rules every SQL statement of a store keeps, read from the statements themselves."""

from __future__ import annotations

import re

import pytest

from duetime.backends.postgres.connection import PgNames


@pytest.mark.parametrize("name, text", sorted(PgNames("duetime", "orders.delayed").q.items()))
def test_rows_picked_with_skip_locked_and_a_limit_are_picked_once(name: str, text: str) -> None:
    """A statement that picks up to N rows with SKIP LOCKED and changes them picks them in a
    MATERIALIZED CTE: as a subquery the planner may scan it again for each row it joins, and the
    scan again skips what the statement changed already and picks other rows (a one-row move took
    two on PostgreSQL 15)."""
    if (
        "SKIP LOCKED" not in text
        or "LIMIT" not in text
        or not re.search(r"(?<!FOR )\b(UPDATE|DELETE)\b", text)
    ):
        return
    picks = re.findall(r"(\w+)\s+AS(\s+MATERIALIZED)?\s*\(\s*SELECT[^;]*?LIMIT[^;]*?SKIP LOCKED", text, re.S)
    assert picks, f"{name}: the rows it changes are picked in a subquery, not a MATERIALIZED CTE"
    assert all(materialized for _, materialized in picks), f"{name}: pick the rows in a MATERIALIZED CTE"
