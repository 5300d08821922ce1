"""The SQL that lets a same-database move leave rows in the server, held to the Python rule.

``plainly_fine_sql`` may vouch only for rows :func:`problem` finds nothing wrong with and whose headers a
store keeps as they are; whatever it does not vouch for is checked in Python. Generated rows are
put through both, in the real PostgreSQL. ``timestamptz_sql`` must turn µs since 1970 into the
same instant Python does, to the microsecond, over the whole supported range.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.backends.postgres.bulk_records import plainly_fine_sql
from duetime.backends.postgres.bulk_rows import timestamptz_sql
from duetime.bulk.records import Record, problem, store_ready
from duetime.clock import from_micros
from tests.services import POSTGRES

#: Text PostgreSQL can hold and psycopg can send: no NUL, no lone surrogate.
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)
_ASCII = st.text(st.characters(min_codepoint=0x01, max_codepoint=0x7F), max_size=30)


def _headers() -> st.SearchStrategy[str | None]:
    values = st.one_of(_TEXT, st.none(), st.integers())
    objects = st.dictionaries(_TEXT, values, max_size=4)
    compact = objects.map(lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False))
    escaped = objects.map(lambda d: json.dumps(d, separators=(",", ":")))
    spaced = objects.map(json.dumps)
    return st.one_of(
        compact,
        escaped,
        spaced,
        st.none(),
        st.just(""),
        _TEXT,
        st.just('{"NServiceBus.Timeouts.Properties.x":"1"}'),
        st.just('<?xml version="1.0"?><ArrayOfHeaderInfo/>'),
        st.builds(lambda k, v: '{"' + k + '":"' + v + '"}', _ASCII, _ASCII),
    )


_ROW = st.tuples(
    st.one_of(_TEXT, _ASCII, st.just("a" * 251), st.just("a" * 250)),
    st.one_of(_TEXT, _ASCII, st.none(), st.just("q" * 201), st.just("q" * 200)),
    st.one_of(st.integers(-(10**12), 260_000_000_000_000_000), st.none(), st.just(253_370_764_800_000_000)),
    _headers(),
    st.integers(-2, 3),
)


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        yield conn


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROW, min_size=1, max_size=40))
def test_the_server_vouches_only_for_rows_python_finds_nothing_wrong_with(
    conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]
) -> None:
    columns = list(zip(*rows, strict=True))
    sure = plainly_fine_sql(["i", "d", "u", "h", "NULL", "f", "NULL"])
    found = conn.execute(
        f"SELECT {sure} FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::int[]) "
        "WITH ORDINALITY AS t(i, d, u, h, f, n) ORDER BY n",
        [list(c) for c in columns],
    ).fetchall()
    for (vouched,), row in zip(found, rows, strict=True):
        if vouched:
            record = Record("e", row[0], row[1], row[2], row[3], b"", row[4])
            assert problem(record) is None, row
            assert store_ready(row[3]), row


def test_what_nservicebus_and_duetime_write_is_vouched_for(conn: psycopg.Connection[Any]) -> None:
    """Else the fast path never fires: compact JSON, escapes and any language's letters."""
    headers = [
        json.dumps({"NServiceBus.MessageId": "7", "Ünïcode": "✓"}, separators=(",", ":"), ensure_ascii=False),
        json.dumps({"a": 'quote " and \\ slash', "b": "line\nbreak"}, separators=(",", ":")),
        "{}",
    ]
    sure = plainly_fine_sql(["'Sales@host'", "'orders'", "1800000000000000", "h", "NULL", "0", "NULL"])
    got = conn.execute(f"SELECT {sure} FROM unnest(%s::text[]) AS t(h)", [headers]).fetchall()
    assert got == [(True,)] * len(headers)


@pytest.mark.parametrize(
    "micros",
    [0, 1, 999_999, 1_000_000, 1_700_000_000_123_456, 9_007_199_254_740_993, 253_370_764_799_999_999],
)
def test_microseconds_become_the_same_instant_in_the_server(
    conn: psycopg.Connection[Any], micros: int
) -> None:
    """``micros * interval '1 microsecond'`` multiplies in double precision: 9998-12-31
    23:59:59.999999 came out as 9999-01-01 00:00:00, outside the supported years."""
    got = conn.execute(
        f"SELECT {timestamptz_sql('m')} FROM (SELECT %s::bigint AS m) AS t", [micros]
    ).fetchone()
    assert got is not None and got[0] == from_micros(micros)


def test_the_server_leaves_a_body_or_headers_over_the_size_limits_to_python(
    conn: psycopg.Connection[Any],
) -> None:
    from duetime.message import MAX_BODY_BYTES, MAX_HEADERS_BYTES

    sure = plainly_fine_sql(["'id'", "'orders'", "1800000000000000", "h", "b", "0", "NULL"])
    wide = '{"h":"' + "x" * MAX_HEADERS_BYTES + '"}'
    cases = [("{}", b"b" * (MAX_BODY_BYTES + 1)), (wide, b""), ("{}", b"b")]
    got = [
        conn.execute(f"SELECT {sure} FROM (SELECT %s::text AS h, %s::bytea AS b) AS t", c).fetchone()
        for c in cases
    ]
    assert got == [(False,), (False,), (True,)]
    assert problem(Record("e", "id", "orders", 1800000000000000, wide, b"", 0)) == (
        f"the headers are {len(wide):,} bytes (as JSON); the limit is {MAX_HEADERS_BYTES:,} (256 KiB). "
        "Send fewer or shorter headers; put data in the body."
    )
