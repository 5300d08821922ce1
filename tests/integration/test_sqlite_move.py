"""The SQLite exactly-once move done by SQL alone matches the move done row by row in Python.

``SyncSqliteStore.move_due`` copies most batches into the queue with one ``INSERT … SELECT`` that
splices ``duetime-due-at`` into the stored headers text itself; the rule it must follow is
:func:`duetime.message.outgoing_headers_json`, which the row-by-row move (still used for batches
holding an NServiceBus timeout, a missing destination or headers that are not a bare JSON object)
applies. These tests hold the two to the same queue rows, byte for byte.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime import TransactionMode
from duetime.backends.sqlite import SyncSqliteQueue, SyncSqliteStore
from duetime.backends.sqlite.connection import write_transaction
from duetime.clock import from_micros, to_micros
from duetime.interfaces import MoveOutcome
from duetime.message import DUE_AT_HEADER, LATEST_DUE, outgoing_headers_json
from tests.integration.test_sqlite_realtime import prepare

ENDPOINT = "moves"
QUEUES = ("moves.a", "moves.b")
TABLE = '"moves.delayed"'
LATEST_US = to_micros(LATEST_DUE) - 1

header_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
compact_headers = st.dictionaries(header_text, header_text, max_size=4).map(
    lambda h: json.dumps(h, separators=(",", ":"), ensure_ascii=False)
)
#: Headers a store may hold: its own compact JSON (by far the most), or a bulk source's text kept
#: byte for byte (spaces, escapes, a traceparent) — these must move the same way either path.
stored_headers = st.one_of(
    compact_headers,
    compact_headers,
    st.sampled_from(
        [
            "{}",
            '{ "a": "b" }',
            ' {"a":"b"}',
            '{"a":"b"} ',
            '{"a":"\\u00e9"}',
            '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
        ]
    ),
)
due_micros = st.one_of(
    st.integers(0, LATEST_US),
    st.integers(0, LATEST_US // 1_000_000).map(lambda s: s * 1_000_000),  # whole seconds: no fraction
    st.integers(-5, 5).map(lambda s: 1_764_000_000_000_000 + s),
)
rows = st.lists(
    st.tuples(stored_headers, due_micros, st.sampled_from(QUEUES), st.binary(max_size=8)),
    min_size=1,
    max_size=30,
)


#: An NServiceBus timeout stored as the second message (m001) of a batch, routed to QUEUES[1]:
#: only the row-by-row move gives it what the timeout manager adds when it dispatches.
TIMEOUT = json.dumps(
    {
        "NServiceBus.Timeout.Expire": "2025-11-24 16:00:00:000000 Z",
        "NServiceBus.Timeout.RouteExpiredTimeoutTo": QUEUES[1],
        "NServiceBus.MessageId": "m001",
    },
    separators=(",", ":"),
)


def fresh(folder: Path, name: str, content: list[tuple[str, int, str, bytes]]) -> SyncSqliteStore:
    path = folder / f"{name}.db"
    store = prepare(path, ENDPOINT, *QUEUES, mode=TransactionMode.EXACTLY_ONCE)
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            f"INSERT INTO {TABLE} (message_id, destination, due_at, headers, body) VALUES (?, ?, ?, ?, ?)",
            [(f"m{i:03d}", dest, due, headers, body) for i, (headers, due, dest, body) in enumerate(content)],
        )
    conn.close()
    return store


def queued(store: SyncSqliteStore) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(store.path)
    got = conn.execute(
        "SELECT queue, message_id, headers, body, enqueued_at, visible_at FROM duetime_queue_messages ORDER BY seq"
    ).fetchall()
    left = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
    conn.close()
    return [*got, ("left in the store", left)]


def no_error_headers(message: object, reason: str) -> dict[str, str]:
    raise AssertionError(f"nothing here should be dead-lettered: {reason}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=rows, limit=st.integers(1, 40))
def test_the_sql_move_writes_what_the_row_by_row_move_writes(
    content: list[tuple[str, int, str, bytes]], limit: int
) -> None:
    at = from_micros(LATEST_US)
    now = to_micros(at)
    with tempfile.TemporaryDirectory() as folder:
        by_sql, by_hand = fresh(Path(folder), "sql", content), fresh(Path(folder), "hand", content)
        try:
            sql_outcome = by_sql.move_due(at, limit, "error", no_error_headers)
            with by_hand._lock, write_transaction(by_hand._conn):
                known = dict.fromkeys(QUEUES, True)
                hand_outcome = by_hand._move_by_hand(now, limit, known, "error", no_error_headers)
            assert (sql_outcome.moved, sql_outcome.dead_lettered) == hand_outcome
            assert queued(by_sql) == queued(by_hand)
            assert len(sql_outcome.moved) == min(limit, len(content))
        finally:
            by_sql.close()
            by_hand.close()


def test_each_header_is_readable_json_with_the_due_time_added(tmp_path: Path) -> None:
    due = 1_764_000_000_123_456
    store = fresh(
        tmp_path, "one", [('{"k":"v","é":"\\""}', due, QUEUES[0], b"x"), ("{}", due + 1, QUEUES[1], b"")]
    )
    outcome = store.move_due(datetime.now(UTC), 10, "error", no_error_headers)
    store.close()
    assert [m.message_id for m in outcome.moved] == ["m000", "m001"]
    rows = queued(store)
    assert json.loads(rows[0][2]) == {"k": "v", "é": '"', DUE_AT_HEADER: "2025-11-24T16:00:00.123456+00:00"}
    assert json.loads(rows[1][2]) == {DUE_AT_HEADER: "2025-11-24T16:00:00.123457+00:00"}
    assert rows[0][2] == outgoing_headers_json('{"k":"v","é":"\\""}', from_micros(due), "m000")


def test_a_batch_with_a_missing_destination_or_a_timeout_is_moved_row_by_row(tmp_path: Path) -> None:
    """Neither can be moved by SQL alone: one goes to the error queue, the other gets the headers
    NServiceBus's timeout manager adds when it dispatches. The rest of the batch moves with them."""
    due = 1_764_000_000_000_000
    store = fresh(
        tmp_path,
        "mixed",
        [
            ('{"a":"1"}', due, QUEUES[0], b"1"),
            (TIMEOUT, due + 1, QUEUES[1], b"2"),
            ("{}", due + 2, "gone", b"3"),
        ],
    )
    queue = SyncSqliteQueue(store.path)
    queue.declare("error")
    queue.close()
    outcome: MoveOutcome = store.move_due(
        datetime.now(UTC), 10, "error", lambda m, reason: {"reason": reason}
    )
    store.close()
    assert [m.message_id for m in outcome.moved] == ["m000", "m001"]
    assert [(m.message_id, reason) for m, reason in outcome.dead_lettered] == [
        ("m002", "Destination 'gone' does not exist.")
    ]
    rows = queued(store)
    by_id = {r[1]: r for r in rows[:3]}
    assert {i: r[0] for i, r in by_id.items()} == {"m000": QUEUES[0], "m001": QUEUES[1], "m002": "error"}
    dispatched = json.loads(by_id["m001"][2])  # with what the timeout manager adds when it dispatches
    assert dispatched["NServiceBus.RelatedToTimeoutId"] == "m001"
    assert rows[3] == ("left in the store", 0)
