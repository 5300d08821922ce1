"""`duetime setup` of a PostgreSQL store in use changes it without stopping its writers.

A set-up that adds a column or an index to a table that dispatchers and producers are writing
to must not hold them up: a plain ``CREATE INDEX`` blocks every insert and delete until it ends
(minutes on ten million rows), and an ``ALTER TABLE`` queued behind one long transaction blocks
every writer that comes after it. Each test keeps a writer's transaction open on the table (a
producer in the middle of a commit) while the set-up runs, and writes from another connection
meanwhile: each of those writes must finish promptly, and the set-up must finish once the open
transaction does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from duetime import DelayedMessage, ListQuery, TransactionMode
from duetime.backends.postgres import SyncPostgresStore
from tests.services import postgres_database, with_option

pytestmark = pytest.mark.slow
ENDPOINT = "online"
TABLE = '"s"."online.delayed"'
GROUP_INDEX = '"s"."online.delayed_group"'
ROWS = 20_000


@pytest.fixture
def url() -> Iterator[str]:
    """A store of its own database: a concurrent index build waits for every older transaction
    of its database, and other tests' must not be among them."""
    with postgres_database() as database:
        store_url = with_option(database, schema="s")
        store = SyncPostgresStore.from_url(store_url)
        store.setup_infrastructure(ENDPOINT)
        due = datetime.now(UTC) + timedelta(days=1)
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        store.store_many([DelayedMessage(f"m{i}", "orders", due, b"x" * 100) for i in range(ROWS)])
        store.close()
        yield store_url


def _plain(store_url: str) -> str:
    return store_url.split("?")[0]


def _insert(conn: psycopg.Connection[Any], message_id: str) -> None:
    conn.execute(
        f"INSERT INTO {TABLE} (message_id, destination, due_at, headers, body) "
        "VALUES (%s, 'orders', now() + interval '1 day', '{}', 'x')",
        [message_id],
    )


def _setup_while_a_transaction_is_open(store_url: str) -> tuple[list[float], float]:
    """Open a writer's transaction, start the set-up, write meanwhile, then end the transaction.
    The seconds each meanwhile write took, and how long after the end the set-up finished."""
    errors: list[BaseException] = []

    def setup() -> None:
        store = SyncPostgresStore.from_url(store_url)
        try:
            store.setup_infrastructure(ENDPOINT)
        except BaseException as error:  # reported by the test, not lost on the thread
            errors.append(error)
        finally:
            store.close()

    with (
        psycopg.connect(_plain(store_url)) as held,
        psycopg.connect(_plain(store_url), autocommit=True) as other,
    ):
        _insert(held, "held-open")  # a transaction in flight, its row lock and table lock held
        other.execute("SET statement_timeout = '5s'")  # a write held up fails rather than hangs
        worker = threading.Thread(target=setup)
        worker.start()
        took = []
        for i in range(15):
            started = time.monotonic()
            _insert(other, f"meanwhile-{i}")
            took.append(time.monotonic() - started)
            time.sleep(0.1)
        assert worker.is_alive(), "the set-up finished while a writer's transaction was open"
        held.commit()
        ended = time.monotonic()
        worker.join(60)
        finished = time.monotonic() - ended
    assert not worker.is_alive() and not errors, errors
    return took, finished


def _group_index_valid(store_url: str) -> bool:
    with psycopg.connect(_plain(store_url)) as conn:
        row = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [GROUP_INDEX]
        ).fetchone()
    return bool(row and row[0])


def _groups_work(store_url: str) -> None:
    store = SyncPostgresStore.from_url(store_url)
    try:
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        due = datetime.now(UTC) + timedelta(hours=1)
        store.store(DelayedMessage("grouped", "orders", due, b"g", group="saga-1"))
        assert [m.message_id for m in store.list(ListQuery(group="saga-1")).messages] == ["grouped"]
        assert store.counts(datetime.now(UTC)).total == ROWS + 1 + 1 + 15  # nothing lost, none twice
    finally:
        store.close()


def test_an_index_is_built_without_holding_up_writers(url: str) -> None:
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute(f"DROP INDEX {GROUP_INDEX}")
    took, finished = _setup_while_a_transaction_is_open(url)
    assert max(took) < 1.0, took
    assert finished < 30, finished
    assert _group_index_valid(url)
    _groups_work(url)


def test_a_column_is_added_without_holding_up_writers(url: str) -> None:
    """A store of schema version 1 (no group column): the set-up asks for its lock a moment at
    a time, so writers queued behind it wait at most that moment."""
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {TABLE} DROP COLUMN group_key")
        conn.execute('UPDATE "s".duetime_schema SET version = 1')
    took, finished = _setup_while_a_transaction_is_open(url)
    assert max(took) < 1.0, took
    assert finished < 30, finished
    assert _group_index_valid(url)
    _groups_work(url)


def test_an_index_a_build_left_unfinished_is_built_again(url: str) -> None:
    """A concurrent build cut short leaves an index marked not valid: ``IF NOT EXISTS`` would
    take it for done, and the store would search a group by reading every row."""
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)", [GROUP_INDEX]
        )
    assert not _group_index_valid(url)
    store = SyncPostgresStore.from_url(url)
    try:
        store.setup_infrastructure(ENDPOINT)
    finally:
        store.close()
    assert _group_index_valid(url)
