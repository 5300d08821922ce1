"""A SQLite queue receiver's receipt is committed without waiting for the disk; everything else
it writes waits as the file's ``synchronous`` setting says.

A receipt only hides a message for the visibility timeout: a power cut that undoes it hands the
message out again, as a receiver's crash would. Waiting for the disk there cost every message a
second fsync on the consumer's side (its acknowledgement is the first)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from duetime import DelayedMessage
from duetime.backends.sqlite import SyncSqliteQueue


def traced(queue: SyncSqliteQueue) -> list[str]:
    said: list[str] = []
    queue._conn.set_trace_callback(said.append)
    return said


@pytest.mark.parametrize("synchronous", ["full", "extra"])
def test_a_receipt_does_not_wait_for_the_disk_and_the_setting_comes_back(
    tmp_path: Path, synchronous: str
) -> None:
    queue = SyncSqliteQueue(tmp_path / "q.db", synchronous=synchronous)
    try:
        queue.declare("orders")
        queue.send([DelayedMessage("m1", "orders", datetime.now(UTC))])
        said = traced(queue)
        taken = queue.receive("orders", 10)
        receiving = list(said)
        said.clear()
        queue.acknowledge(taken)
        assert [m.message_id for m in taken] == ["m1"]
        assert receiving.index("PRAGMA synchronous=NORMAL") < receiving.index("BEGIN IMMEDIATE")
        assert receiving[-1] == f"PRAGMA synchronous={synchronous.upper()}"
        assert not [s for s in said if s.startswith("PRAGMA synchronous")]  # the acknowledgement waits
        assert queue._conn.execute("PRAGMA synchronous").fetchone()[0] == {"full": 2, "extra": 3}[synchronous]
    finally:
        queue.close()


def test_a_file_that_never_waits_for_the_disk_is_left_as_it_is(tmp_path: Path) -> None:
    queue = SyncSqliteQueue(tmp_path / "q.db", synchronous="normal")
    try:
        queue.declare("orders")
        queue.send([DelayedMessage("m1", "orders", datetime.now(UTC))])
        said = traced(queue)
        assert [m.message_id for m in queue.receive("orders", 10)] == ["m1"]
        assert not [s for s in said if s.startswith("PRAGMA synchronous")]
    finally:
        queue.close()
