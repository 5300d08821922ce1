"""A SQL queue's ``receive(..., done=...)``: the consumer's last batch acknowledged in the look that
takes the next (one statement on PostgreSQL, one transaction on SQLite), on each of the two queues.

The transport contract (``duetime.testing.transport_contract``) holds every transport to the
acknowledging; here, what only a queue table can get wrong: a message whose receipt ran out is
both acknowledged and ready to take in the same look, the docs' consumer loop leaves nothing
behind, and an acknowledgement waits for the disk even in a receive's transaction."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, ReceivedMessage
from duetime.backends.postgres import SyncPostgresQueue
from duetime.backends.postgres.connection import PgOptions
from duetime.backends.sqlite import SyncSqliteQueue
from tests.services import postgres_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def make_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Opens a queue of the parameter's kind (``orders`` declared) with the visibility timeout given."""
    with contextlib.ExitStack() as stack:
        url = "" if request.param == "sqlite" else stack.enter_context(postgres_schema())

        def make(visibility: timedelta = timedelta(seconds=30)) -> Any:
            queue: Any = (
                SyncSqliteQueue(tmp_path / "q.db", visibility_timeout=visibility)
                if request.param == "sqlite"
                else SyncPostgresQueue(PgOptions.from_url(url), visibility_timeout=visibility)
            )
            stack.callback(queue.close)
            queue.declare("orders")
            return queue

        yield make


def messages(count: int) -> list[DelayedMessage]:
    return [DelayedMessage(f"m{i}", "orders", datetime.now(UTC)) for i in range(count)]


def test_a_message_whose_receipt_ran_out_is_acknowledged_not_handed_out_again(make_queue: Any) -> None:
    """Its receipt still holds (no one took it since), so the acknowledgement removes it; the
    same look must not also take it (on PostgreSQL one statement would change the row twice)."""
    queue = make_queue(timedelta(seconds=0.2))
    queue.send(messages(1))
    first = queue.receive("orders", 10)
    assert [m.message_id for m in first] == ["m0"]
    time.sleep(0.4)  # its visibility timeout ends: it is ready to take again
    assert queue.receive("orders", 10, 0.3, done=first) == []
    assert queue.depth("orders") == 0


def test_the_docs_consumer_loop_handles_each_message_once_and_leaves_none_behind(make_queue: Any) -> None:
    """The loop of the how-to pages, with a short wait: it ends when nothing comes, and that last
    call acknowledges the last batch."""
    queue = make_queue()
    queue.send(messages(25))
    handled: list[str] = []
    batch: list[ReceivedMessage] = []
    while batch := queue.receive("orders", max_messages=10, wait=0.3, done=batch):
        handled += [m.message_id for m in batch]
    assert sorted(handled) == sorted(f"m{i}" for i in range(25))
    assert queue.depth("orders") == 0


def test_a_sqlite_acknowledgement_waits_for_the_disk_in_a_receives_transaction(tmp_path: Path) -> None:
    """A receipt alone is committed without waiting for the disk; a transaction that also
    acknowledges is not (an acknowledgement a power cut undid would hand the message out again)."""
    queue = SyncSqliteQueue(tmp_path / "q.db")
    try:
        queue.declare("orders")
        queue.send(messages(2))
        first = queue.receive("orders", 1)
        said: list[str] = []
        queue._conn.set_trace_callback(said.append)
        second = queue.receive("orders", 1, done=first)
        assert [m.message_id for m in second] == ["m1"]
        assert "BEGIN IMMEDIATE" in said and "PRAGMA synchronous=NORMAL" not in said, said
        queue.acknowledge(second)
    finally:
        queue.close()
