"""The PostgreSQL exactly-once move done in one statement matches the move done row by row.

``SyncPostgresStore.move_due`` moves most batches with one statement (``move_due_at_once``) that
splices ``duetime-due-at`` into the stored headers text itself and reads the next due time; the
rule it must follow is :func:`duetime.message.outgoing_headers_json`, which the row-by-row move
(still used for batches holding an NServiceBus timeout, a destination with no queue, headers that
are not a bare JSON object or a due time before 1970) applies. These tests hold the two to the
same queue rows, byte for byte, and the next due time to what ``next_due`` says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime import TransactionMode
from duetime.backends.postgres import SyncPostgresQueue, SyncPostgresStore
from duetime.backends.postgres.connection import pooled
from duetime.clock import from_micros, to_micros
from duetime.message import DUE_AT_HEADER, LATEST_DUE
from tests.integration.test_sqlite_move import QUEUES, TIMEOUT, no_error_headers, stored_headers

ENDPOINT = "moves"
LATEST_US = to_micros(LATEST_DUE) - 1

due_micros = st.one_of(
    st.integers(0, LATEST_US),
    st.integers(0, LATEST_US // 1_000_000).map(lambda s: s * 1_000_000),  # whole seconds: no fraction
    st.integers(-5, 5).map(lambda s: 1_764_000_000_000_000 + s),
    st.integers(-5, 5),  # either side of 1970: before it, the row-by-row move
)
rows = st.lists(
    st.tuples(stored_headers, due_micros, st.sampled_from(QUEUES), st.binary(max_size=8)),
    min_size=1,
    max_size=30,
)


def prepared(url: str) -> SyncPostgresStore:
    store = SyncPostgresStore.from_url(url)
    store.setup_infrastructure(ENDPOINT)
    store.initialize(ENDPOINT, TransactionMode.EXACTLY_ONCE)
    queue = SyncPostgresQueue.from_url(url)
    for name in (*QUEUES, "error"):
        queue.declare(name)
    queue.close()
    return store


@pytest.fixture(scope="module")
def two_stores() -> Iterator[tuple[SyncPostgresStore, SyncPostgresStore]]:
    from tests.services import postgres_schema

    with postgres_schema() as one, postgres_schema() as other:
        by_statement, by_hand = prepared(one), prepared(other)
        try:
            yield by_statement, by_hand
        finally:
            by_statement.close()
            by_hand.close()


def fill(store: SyncPostgresStore, content: list[tuple[str, int, str, bytes]]) -> None:
    names = store.names
    with pooled(store.pool, store.options) as conn, conn.transaction():
        conn.execute(f"DELETE FROM {names.qualified}")
        conn.execute(f"DELETE FROM {names.quoted_schema}.duetime_queue_messages")
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {names.qualified} (message_id, destination, due_at, headers, body) "
                "VALUES (%s, %s, %s, %s, %s)",
                [
                    (f"m{i:03d}", dest, from_micros(due), headers, body)
                    for i, (headers, due, dest, body) in enumerate(content)
                ],
            )


def queued(store: SyncPostgresStore) -> list[tuple[Any, ...]]:
    names = store.names
    with pooled(store.pool, store.options) as conn:
        got = conn.execute(
            f"SELECT queue, message_id, headers::text, body FROM {names.quoted_schema}.duetime_queue_messages "
            "ORDER BY seq"
        ).fetchall()
        left = conn.execute(f"SELECT count(*) FROM {names.qualified}").fetchone()
    return [*got, ("left in the store", left)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=rows, limit=st.integers(1, 40))
def test_the_one_statement_move_writes_what_the_row_by_row_move_writes(
    two_stores: tuple[SyncPostgresStore, SyncPostgresStore],
    content: list[tuple[str, int, str, bytes]],
    limit: int,
) -> None:
    by_statement, by_hand = two_stores
    at = from_micros(LATEST_US)
    fill(by_statement, content)
    fill(by_hand, content)
    outcome = by_statement.move_due(at, limit, "error", no_error_headers)
    with pooled(by_hand.pool, by_hand.options) as conn, conn.transaction():
        moved, dead = by_hand._move(conn, at, limit, "error", no_error_headers)
    assert (sorted(outcome.moved), outcome.dead_lettered) == (sorted(moved), dead)
    assert queued(by_statement) == queued(by_hand)
    assert len(outcome.moved) == min(limit, len(content))
    assert outcome.next_due is not None
    assert outcome.next_due.at == by_hand.next_due()


def test_the_due_time_is_spliced_into_the_headers_as_json(pg: str) -> None:
    store = prepared(pg)
    try:
        due = 1_764_000_000_123_456
        fill(store, [('{"k":"v","é":"\\""}', due, QUEUES[0], b"x"), ("{}", due + 1, QUEUES[1], b"")])
        outcome = store.move_due(datetime.now(UTC), 10, "error", no_error_headers)
        assert sorted(m.message_id for m in outcome.moved) == ["m000", "m001"]
        rows = queued(store)
        assert json.loads(rows[0][2]) == {
            "k": "v",
            "é": '"',
            DUE_AT_HEADER: "2025-11-24T16:00:00.123456+00:00",
        }
        assert json.loads(rows[1][2]) == {DUE_AT_HEADER: "2025-11-24T16:00:00.123457+00:00"}
        assert outcome.next_due is not None and outcome.next_due.at is None
    finally:
        store.close()


def test_a_batch_with_a_row_only_python_can_forward_moves_whole_row_by_row(pg: str) -> None:
    """A destination with no queue goes to the error queue, an NServiceBus timeout gets what the
    timeout manager adds when it dispatches; the rest of the batch moves with them, in due order."""
    store = prepared(pg)
    try:
        due = 1_764_000_000_000_000
        fill(
            store,
            [
                ('{"a":"1"}', due, QUEUES[0], b"1"),
                (TIMEOUT, due + 1, QUEUES[1], b"2"),
                ("{}", due + 2, "gone", b"3"),
            ],
        )
        outcome = store.move_due(datetime.now(UTC), 10, "error", lambda m, reason: {"reason": reason})
        assert sorted(m.message_id for m in outcome.moved) == ["m000", "m001"]
        assert [(m.message_id, reason) for m, reason in outcome.dead_lettered] == [
            ("m002", "Destination 'gone' does not exist.")
        ]
        rows = queued(store)
        assert [(r[0], r[1]) for r in rows[:3]] == [
            (QUEUES[0], "m000"),
            (QUEUES[1], "m001"),
            ("error", "m002"),
        ]
        assert json.loads(rows[1][2])["NServiceBus.RelatedToTimeoutId"] == "m001"
        assert rows[3] == ("left in the store", (0,))
    finally:
        store.close()


def test_a_row_another_transaction_holds_is_skipped_and_left_for_later(pg: str) -> None:
    """The statement takes what no one holds (SKIP LOCKED), and its next due time counts a held
    row as due again shortly, as ``next_due`` does: never a spin, never a wait."""
    store = prepared(pg)
    try:
        now = datetime.now(UTC)
        fill(store, [("{}", to_micros(now - timedelta(seconds=2)), QUEUES[0], b"held"),
                     ("{}", to_micros(now - timedelta(seconds=1)), QUEUES[0], b"free")])  # fmt: skip
        with psycopg.connect(pg.split("?")[0]) as holder:
            holder.execute(
                f"SELECT 1 FROM {store.names.qualified} WHERE message_id = 'm000' FOR UPDATE"
            ).fetchall()
            outcome = store.move_due(now, 10, "error", no_error_headers)
            assert [m.message_id for m in outcome.moved] == ["m001"]
            assert outcome.next_due is not None and outcome.next_due.at is not None
            assert now < outcome.next_due.at <= datetime.now(UTC) + timedelta(seconds=1)
        assert [
            m.message_id for m in store.move_due(datetime.now(UTC), 10, "error", no_error_headers).moved
        ] == ["m000"]
    finally:
        store.close()
