"""`bulk schedule --if-exists replace` on every store: rows whose id is waiting replace it through
the store's own replace (never a message a dispatcher holds), a re-run replaces nothing twice, and
a task that dies after storing a batch but before replacing replaces on the re-run."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.bulk.records import Record
from duetime.bulk.schedule import schedule
from duetime.bulk.targets import open_store_target
from duetime.clock import to_micros
from duetime.interfaces import IfExists
from duetime.message import DelayedMessage
from duetime.registry import open_sync_store
from duetime.settings import TransactionMode
from tests.bulk.test_migrate import store_rows
from tests.services import store_url

LATER = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)
SCHEMA = "id string, destination string, due_at timestamp, body binary, headers map<string,string>"


@contextmanager
def _waiting(url: str) -> Iterator[None]:
    """w0-w4 waiting, and `busy` due a moment ago and claimed by a dispatcher (this store, open
    meanwhile: a store that closes gives back what it claimed)."""
    store = open_sync_store(url)
    try:
        store.setup_infrastructure("rep")
        store.initialize("rep", TransactionMode.AT_LEAST_ONCE)
        store.store_many([DelayedMessage(f"w{i}", "orders", LATER, b"old", {"v": "old"}) for i in range(5)])
        now = datetime.now(UTC)
        store.store(DelayedMessage("busy", "orders", now - timedelta(seconds=1), b"old", {"v": "old"}))
        assert [m.message_id for m in store.fetch_due(now, 10)] == ["busy"]
        yield
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb", "redis"])
def test_replace_puts_each_row_in_place_of_the_waiting_message_once(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    new_due = LATER + timedelta(days=1)
    rows = [(f"w{i}", "shipping", new_due, b"new", {"v": "new"}) for i in range(5)]
    rows += [("busy", "orders", new_due, b"new", {"v": "new"})]
    rows += [(f"n{i}", "orders", new_due, b"new", {"v": "new"}) for i in range(3)]
    frame = spark.createDataFrame(rows, SCHEMA).repartition(2)
    with store_url(kind, tmp_path) as url, _waiting(url):
        done = schedule(spark, frame, url, endpoint="rep", job="rep-1", if_exists="replace")
        assert (done.stored, done.replaced, done.in_flight, done.skipped) == (3, 5, 1, 0), done
        stored = store_rows(url, "rep")
        for i in range(5):
            m = stored[f"w{i}"]
            assert (m.destination, m.due_at, m.body, dict(m.headers)) == (
                "shipping",
                new_due,
                b"new",
                {"v": "new"},
            )
        assert stored["busy"].body == b"old"  # a dispatcher holds it: never replaced
        # changed since by someone else: a re-run of the job replaces nothing twice
        store = open_sync_store(url)
        store.initialize("rep", TransactionMode.AT_LEAST_ONCE)
        store.put(DelayedMessage("w0", "orders", LATER, b"newer", {}), IfExists.REPLACE)
        store.close()
        again = schedule(spark, frame, url, endpoint="rep", job="rep-1", if_exists="replace")
        assert (again.stored, again.replaced, again.in_flight, again.skipped) == (0, 0, 0, 9), again
        assert store_rows(url, "rep")["w0"].body == b"newer"
        # the default keeps what waits, as before
        kept = schedule(spark, frame, url, endpoint="rep", job="rep-2")
        assert (kept.stored, kept.replaced, kept.skipped) == (0, 0, 9), kept
        assert store_rows(url, "rep")["w1"].body == b"new"


@pytest.mark.parametrize("kind", ["postgresql", "redis"])
def test_a_task_that_dies_before_replacing_replaces_on_the_rerun(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    """The batch's commit leaves the waiting ids out of the job's own, so a task killed between
    that commit and the replaces (here: the commit alone) replaces them when the job runs again."""
    new_due = LATER + timedelta(days=1)
    with store_url(kind, tmp_path) as url, _waiting(url):
        records = [
            Record("rep", f"w{i}", "orders", to_micros(new_due), '{"v":"new"}', b"new", 0) for i in range(5)
        ]
        target = open_store_target(url)
        target.prepare(["rep"])
        written = target.write_once("rep-1", records, keep_held=False)  # ... and the task dies here
        assert (written.inserted, sorted(written.conflicts)) == (0, [f"w{i}" for i in range(5)])
        rows = [(f"w{i}", "orders", new_due, b"new", {"v": "new"}) for i in range(5)]
        done = schedule(
            spark, spark.createDataFrame(rows, SCHEMA), url, endpoint="rep", job="rep-1", if_exists="replace"
        )
        assert (done.replaced, done.skipped) == (5, 0), done
        assert {m.body for k, m in store_rows(url, "rep").items() if k != "busy"} == {b"new"}
