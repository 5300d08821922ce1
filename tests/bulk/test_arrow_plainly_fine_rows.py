"""The Arrow test that lets typed rows skip the Python check, held to the Python rule.

:func:`split_plainly_fine` may take out only rows :func:`check_row` finds nothing wrong with, and must
give each the very record :func:`check_row` makes of it; every other row comes back to be checked
in Python. Generated batches (text, ids, due times, headers, bodies, endpoints, failure counts
of every kind the columns may hold) are put through both.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.bulk.arrowcheck import split_plainly_fine
from duetime.bulk.frames import _endpoint_fine, check_row, checked_of, plainly_fine_batch
from duetime.bulk.records import group_of

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
_ASCII = st.text(st.characters(min_codepoint=0x00, max_codepoint=0x7F), max_size=30)
_PLAIN = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


def _headers() -> st.SearchStrategy[str | None]:
    values = st.one_of(_TEXT, st.none(), st.integers())
    objects = st.dictionaries(_TEXT, values, max_size=4)
    plain = st.dictionaries(_PLAIN, _PLAIN, max_size=4)
    return st.one_of(
        objects.map(lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False)),
        objects.map(lambda d: json.dumps(d, separators=(",", ":"))),
        objects.map(json.dumps),
        plain.map(lambda d: json.dumps(d, separators=(",", ":"))),
        st.none(),
        st.just(""),
        st.just("{}"),
        st.just('{"":"x"}'),
        st.just('{"a":"\\n\\"\\\\ \\/"}'),
        st.just('{"a":"\\u0041"}'),
        st.just('{"a":null}'),
        _TEXT,
        st.just('<?xml version="1.0"?><ArrayOfHeaderInfo/>'),
    )


_IDS = st.one_of(_PLAIN, _TEXT, _ASCII, st.none(), st.just(""), st.just("a" * 251), st.just("a" * 250))
_DESTINATIONS = st.one_of(_PLAIN, _TEXT, st.none(), st.just(" "), st.just("q" * 201), st.just("q" * 200))
_DUE = st.one_of(
    st.integers(-(10**12), 260_000_000_000_000_000), st.none(), st.just(253_370_764_800_000_000), st.just(0)
)
_ENDPOINTS = st.one_of(
    st.none(), st.just(""), st.just("Sales"), st.just("bad/name"), st.just("a" * 300), _PLAIN
)
_FAILURES = st.one_of(st.none(), st.integers(-3, 5), st.just(2**31 - 1), st.just(2**31))
_BODIES = st.one_of(st.none(), st.binary(max_size=8), _TEXT)
_WILD = {
    "message_id": _IDS,
    "destination": _DESTINATIONS,
    "due_at": _DUE,
    "headers": _headers(),
    "endpoint": _ENDPOINTS,
    "failure_count": _FAILURES,
    "body": _BODIES,
    "body_base64": st.one_of(st.none(), st.just("aGk="), st.just("not base64!")),
    "group": st.one_of(
        st.none(),
        _PLAIN,
        _TEXT,
        st.just(""),
        st.just('a"b'),
        st.just("a\\b"),
        st.just("00000000-0000-0000-0000-000000000000"),
    ),
}
#: A row Arrow should take: each field plain.
_TIDY = st.fixed_dictionaries(
    {
        "message_id": _PLAIN,
        "destination": _PLAIN,
        "due_at": st.integers(0, 253_370_764_799_999_999),
        "headers": st.one_of(
            st.none(),
            st.dictionaries(_TEXT, _TEXT, max_size=3).map(
                lambda d: json.dumps(d, separators=(",", ":"), ensure_ascii=False)
            ),
        ),
        "endpoint": st.sampled_from([None, "", "Sales"]),
        "failure_count": st.one_of(st.none(), st.integers(0, 9)),
        "body": st.one_of(st.none(), st.binary(max_size=8)),
        "body_base64": st.none(),
        "group": st.one_of(st.none(), st.uuids().map(str)),
    }
)
#: Tidy rows, wild rows, and tidy rows with one wild field (the edges of what Arrow takes).
_ROW = st.one_of(
    _TIDY,
    st.fixed_dictionaries(_WILD),
    st.tuples(_TIDY, st.sampled_from(sorted(_WILD)), st.data()).map(
        lambda t: t[0] | {t[1]: t[2].draw(_WILD[t[1]])}
    ),
)


def _batch(rows: list[dict[str, Any]], text_bodies: bool) -> pa.RecordBatch:
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    bodies = [
        (b if isinstance(b, str) else None) if text_bodies else (b.encode() if isinstance(b, str) else b)
        for b in columns["body"]
    ]
    types = {
        "message_id": pa.string(),
        "destination": pa.large_string(),
        "due_at": pa.int64(),
        "headers": pa.string(),
        "endpoint": pa.string(),
        "failure_count": pa.int64(),
        "body": pa.string() if text_bodies else pa.binary(),
        "body_base64": pa.string(),
        "group": pa.string(),
    }
    arrays = {
        name: pa.array(bodies if name == "body" else values, types[name]) for name, values in columns.items()
    }
    return pa.RecordBatch.from_pydict(arrays)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(_ROW, min_size=1, max_size=30),
    text_bodies=st.booleans(),
    endpoint=st.sampled_from([None, "crm"]),
)
def test_arrow_takes_out_only_rows_python_finds_nothing_wrong_with_as_python_makes_them(
    rows: list[dict[str, Any]], text_bodies: bool, endpoint: str | None
) -> None:
    batch = _batch(rows, text_bodies)
    fine, rest = split_plainly_fine(batch, endpoint, _endpoint_fine)
    records = None if fine is None else plainly_fine_batch(fine)
    took = [] if records is None else list(checked_of([records]))
    assert len(took) + rest.num_rows == len(rows)
    if records is not None:  # the group column is the one the Python path derives from extra
        assert records.column("group").to_pylist() == [group_of(record) for record, _ in took]
    expected = [check_row(row, endpoint) for row in batch.to_pylist()]
    left = [check_row(row, endpoint) for row in rest.to_pylist()]
    for pair in took:
        assert pair in expected, pair
        assert pair[1] is None
    # what Arrow took plus what Python checks is every row, each once
    assert sorted(map(repr, took + left)) == sorted(map(repr, expected))


def test_the_rows_of_an_export_all_skip_python() -> None:
    """The point of it: tidy rows (an export's) are all taken out by Arrow."""
    rows = [
        {
            "message_id": f"m{i}",
            "destination": "Sales.Orders",
            "due_at": 1_900_000_000_000_000 + i,
            "headers": '{"NServiceBus.MessageId":"abc","k":"v \\"quoted\\" ü"}',
            "endpoint": "Sales",
            "failure_count": i % 3,
            "body": b"x" * 10,
            "body_base64": None,
            "group": None if i % 2 else f"saga-{i}",
        }
        for i in range(100)
    ]
    fine, rest = split_plainly_fine(_batch(rows, text_bodies=False), None, _endpoint_fine)
    assert fine is not None and rest.num_rows == 0
    assert list(checked_of([plainly_fine_batch(fine)])) == [check_row(row, None) for row in rows]


def test_columns_a_frame_lacks_are_nulls_of_no_type_and_their_rows_still_skip_python() -> None:
    """normalize() gives a missing column as a NULL literal: Arrow's null type."""
    batch = pa.RecordBatch.from_pydict(
        {
            "destination": pa.array(["q", "q"]),
            "due_at": pa.array([1_900_000_000_000_000, 0], pa.int64()),
            "message_id": pa.array(["a", "b"]),
        }
        | {
            name: pa.nulls(2)
            for name in ("body", "body_base64", "headers", "endpoint", "failure_count", "group")
        }
    )
    fine, rest = split_plainly_fine(batch, "crm", _endpoint_fine)
    assert fine is not None and rest.num_rows == 0
    assert list(checked_of([plainly_fine_batch(fine)])) == [
        check_row(row, "crm") for row in batch.to_pylist()
    ]


def test_a_column_of_another_type_leaves_every_row_to_python() -> None:
    rows = [{"message_id": 7, "destination": "q", "due_at": 1_900_000_000_000_000}]
    batch = pa.RecordBatch.from_pylist(
        [
            r
            | {
                "headers": None,
                "endpoint": None,
                "failure_count": None,
                "body": None,
                "body_base64": None,
                "group": None,
            }
            for r in rows
        ]
    )
    fine, rest = split_plainly_fine(batch, "e", _endpoint_fine)
    assert fine is None and rest.num_rows == 1


def test_a_body_or_headers_over_the_size_limits_are_left_to_python_which_names_the_limit() -> None:
    from duetime.message import MAX_BODY_BYTES, MAX_HEADERS_BYTES

    base = {
        "due_at": 1_900_000_000_000_000,
        "endpoint": None,
        "failure_count": None,
        "body_base64": None,
        "group": None,
    }
    rows = [
        base
        | {"message_id": "big", "destination": "q", "headers": None, "body": b"b" * (MAX_BODY_BYTES + 1)},
        base
        | {
            "message_id": "wide",
            "destination": "q",
            "headers": '{"h":"' + "x" * MAX_HEADERS_BYTES + '"}',
            "body": b"",
        },
        base | {"message_id": "ok", "destination": "q", "headers": "{}", "body": b"b"},
    ]
    fine, rest = split_plainly_fine(_batch(rows, text_bodies=False), "e", _endpoint_fine)
    assert fine is not None and rest.column("message_id").to_pylist() == ["big", "wide"]
    reasons = [check_row(row, "e")[1] for row in rest.to_pylist()]
    assert reasons[0] is not None and "the body is 16,777,217 bytes" in reasons[0]
    assert reasons[1] is not None and "the headers are 262,152 bytes" in reasons[1]
