"""Writing records into a store, through each SQL store's bulk writer (the contract every store's
``bulk_rows`` keeps: conflicts counted, never overwritten, a batch whole or not at all, once), and
PostgreSQL's own ways: straight COPY into the store table while no id is there already; an id that
is (or comes twice) undoes only that COPY, and the write goes on the careful way (a temporary
table, then INSERT … ON CONFLICT), counting it as a conflict. No Spark."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.bulk.frames import CHUNK_ROWS
from duetime.bulk.records import Record, group_extra
from duetime.bulk.targets import StoreTarget, Written, open_target
from duetime.clock import to_micros
from duetime.interfaces import SyncDelayedMessageStore
from duetime.registry import open_sql_database, open_sync_store
from tests.bulk.test_migrate import store_rows
from tests.services import (
    postgres_schema,
    store_url,
)

DUE = datetime(9998, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)


def _record(i: int, destination: str = "orders") -> Record:
    return Record(
        "Sales",
        f"m{i}",
        destination,
        to_micros(DUE),
        f'{{"n":"{i}"}}',
        bytes([i % 256]),
        i % 3,
        group_extra(f"g{i}"),
    )


def _holding(url: str, message_id: str) -> SyncDelayedMessageStore:
    """The store at ``url``, set up for Sales, already holding ``message_id`` (for elsewhere)."""
    store = open_sync_store(url)
    store.setup_infrastructure("Sales")
    store.initialize("Sales", TransactionMode.AT_LEAST_ONCE)
    store.store(DelayedMessage(message_id, "elsewhere", datetime(2031, 1, 1, tzinfo=UTC)))
    return store


def test_straight_copy_until_an_id_is_there_then_conflicts_are_counted_and_nothing_is_doubled() -> None:
    with postgres_schema() as pg:
        clash = CHUNK_ROWS + 5  # in the second chunk: the first went straight in
        store = _holding(pg, f"m{clash}")
        store.close()
        target = StoreTarget(open_sql_database(pg))
        target.prepare(["Sales"])
        count = 2 * CHUNK_ROWS + 100
        written = target.write("run-1", 0, [_record(i) for i in range(count)])
        assert (written.inserted, written.conflicts) == (count - 1, (f"m{clash}",))
        stored = store_rows(pg, "Sales")
        assert len(stored) == count
        assert stored[f"m{clash}"].destination == "elsewhere"  # never overwritten
        first = stored["m7"]
        assert (first.due_at, first.headers, first.body, first.failure_count, first.group) == (
            DUE,
            {"n": "7"},
            bytes([7]),
            1,
            "g7",
        )
        # the same id twice in one batch of a new run: one stored, one conflict
        again = StoreTarget(open_sql_database(pg))
        twice = again.write("run-2", 0, [_record(count), _record(count, "other"), _record(count + 1)])
        assert (twice.inserted, twice.conflicts) == (2, (f"m{count}",))
        assert store_rows(pg, "Sales")[f"m{count}"].destination == "orders"
        assert len(store_rows(pg, "Sales")) == count + 2


def test_an_id_given_twice_is_written_once_and_counted_as_a_conflict_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    target = StoreTarget(open_sql_database(url))
    target.prepare(["Sales"])
    written = target.write("run-1", 0, [_record(1), _record(1, "other"), _record(2)])
    assert (written.inserted, written.conflicts) == (2, ("m1",))
    assert store_rows(url, "Sales")["m1"].destination == "orders"


#: Every store's bulk writer (duetime/backends/<store>/bulk_rows.py), through the bulk jobs' target.
STORES = ["sqlite", "postgresql", "mariadb", "redis"]


@pytest.mark.parametrize("kind", STORES)
def test_a_stores_bulk_write_keeps_what_is_there_and_writes_a_batch_once(kind: str, tmp_path: Path) -> None:
    """Ids the store holds already are conflicts and never overwritten; an id given twice in a
    batch is written once (the first); an empty batch writes nothing; a batch written once is never
    written again (its ledger row commits with it), even after its messages are gone."""
    with store_url(kind, tmp_path) as url:
        store = _holding(url, "m3")
        target = open_target(url)
        target.prepare(["Sales"])
        assert target.write("run-1", 0, []) == Written(0, ())
        written = target.write("run-1", 1, [_record(i) for i in range(5)] + [_record(1, "other")])
        assert (written.inserted, sorted(written.conflicts)) == (4, ["m1", "m3"])
        stored = store_rows(url, "Sales")
        assert (stored["m3"].destination, stored["m1"].destination) == ("elsewhere", "orders")
        first = stored["m4"]
        assert (first.due_at, first.headers, first.body, first.failure_count, first.group) == (
            DUE,
            {"n": "4"},
            bytes([4]),
            1,
            "g4",
        )
        store.cancel("m0")
        again = target.write("run-1", 1, [_record(i) for i in range(5)])
        assert again == written  # the ledger's answer: m0 is not written a second time
        assert "m0" not in store_rows(url, "Sales")
        store.close()


@pytest.mark.parametrize("kind", STORES)
def test_a_bulk_write_that_fails_half_way_writes_nothing(kind: str, tmp_path: Path) -> None:
    """The records stop with an error after a chunk has gone in: the store keeps none of the
    batch and no ledger row, so the batch's next try writes it whole."""

    def broken() -> Iterator[Record]:
        yield from (_record(i) for i in range(CHUNK_ROWS + 10))
        raise RuntimeError("the source went away")

    with store_url(kind, tmp_path) as url:
        target = open_target(url)
        target.prepare(["Sales"])
        with pytest.raises(RuntimeError, match="went away"):
            target.write("run-1", 0, broken())
        assert store_rows(url, "Sales") == {}
        assert target.ledger("run-1", 0) is None
        written = target.write("run-1", 0, [_record(i) for i in range(CHUNK_ROWS + 10)])
        assert written == Written(CHUNK_ROWS + 10, ())
        assert len(store_rows(url, "Sales")) == CHUNK_ROWS + 10


def test_a_redis_batch_cut_off_between_two_chunks_is_finished_by_its_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis takes a batch a chunk (one script) at a time: a connection lost after the first
    chunk leaves that chunk stored; the batch's retry (its rows in another order, as a
    migration's staged rows may come) reads that chunk's answer from the ledger and stores the
    rest, each row once, and answers as a batch written whole would."""
    from duetime.backends.redis.bulk_rows import ROWS_A_SCRIPT, RedisBulkRows

    count = 2 * ROWS_A_SCRIPT + 10
    with store_url("redis", tmp_path) as url:
        store = _holding(url, f"m{ROWS_A_SCRIPT + 1}")
        target = open_target(url)
        target.prepare(["Sales"])
        real = RedisBulkRows._run
        calls = 0

        def cut_off(self: RedisBulkRows, keys: list[str], args: list[object]) -> object:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise ConnectionError("the connection went away")
            return real(self, keys, args)

        monkeypatch.setattr(RedisBulkRows, "_run", cut_off)
        with pytest.raises(ConnectionError):
            target.write("run-1", 0, [_record(i) for i in range(count)])
        first_chunk = set(sorted(f"m{i}" for i in range(count))[:ROWS_A_SCRIPT])  # in order of ids
        assert set(store_rows(url, "Sales")) == first_chunk | {f"m{ROWS_A_SCRIPT + 1}"}
        store.cancel("m0")  # delivered meanwhile: the retry must not store it again
        written = target.write("run-1", 0, [_record(i) for i in reversed(range(count))])
        assert (written.inserted, written.conflicts) == (count - 1, (f"m{ROWS_A_SCRIPT + 1}",))
        stored = store_rows(url, "Sales")
        assert len(stored) == count - 1 and "m0" not in stored
        assert stored[f"m{ROWS_A_SCRIPT + 1}"].destination == "elsewhere"
        assert target.write("run-1", 0, []) == written  # the batch's answer, from the ledger
        store.close()


async def test_a_bulk_write_wakes_a_sleeping_dispatcher_with_the_due_time_it_announced() -> None:
    """One writer and one reader of a store's due-time announcement: bulk jobs sent an ISO date
    that the store's listener could not read (it fell back to "look again", by luck). Here a
    dispatcher sleeps toward a message an hour away; a bulk write of one due now wakes it at once,
    and the announcement reads as that due time. No Spark."""
    import asyncio

    import psycopg

    from duetime import DelayedDeliverySettings, Dispatcher, open_store, open_transport
    from duetime.backends.postgres.connection import PgNames, announced_due

    with postgres_schema() as pg:
        store = open_store(pg)
        await store.setup_infrastructure("Sales")
        await store.initialize("Sales", TransactionMode.EXACTLY_ONCE)
        transport = open_transport(pg)
        await transport.declare("orders")
        await store.store(DelayedMessage("later", "orders", datetime.now(UTC) + timedelta(hours=1)))
        settings = DelayedDeliverySettings(
            transaction_mode=TransactionMode.EXACTLY_ONCE, max_sleep=timedelta(minutes=5)
        )
        dispatcher = Dispatcher(store, transport, settings, endpoint="Sales")
        task = asyncio.create_task(dispatcher.run())
        schema = dict(p.split("=") for p in pg.split("?", 1)[1].split("&"))["schema"]
        listener = await psycopg.AsyncConnection.connect(pg.split("?")[0], autocommit=True)
        await listener.execute(f"LISTEN {PgNames(schema, 'Sales.delayed').channel}")
        try:
            while not dispatcher.started or dispatcher.stats.rounds == 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # asleep toward "later"
            due = datetime.now(UTC).replace(microsecond=123_456)
            record = Record("Sales", "now", "orders", to_micros(due), "{}", b"b", 0, None)
            target = StoreTarget(open_sql_database(pg))
            await asyncio.to_thread(target.prepare, ["Sales"])
            await asyncio.to_thread(target.write, "run-1", 0, [record])
            started = asyncio.get_running_loop().time()
            got = await transport.receive("orders", 10, 5.0)
            assert [m.message_id for m in got] == ["now"]
            assert asyncio.get_running_loop().time() - started < 2.0  # woken, not the 5-minute sleep
            note = await anext(listener.notifies(timeout=2.0))
            assert announced_due(note.payload) == due
        finally:
            dispatcher.stop()
            await task
            await listener.close()
            await transport.close()
            await store.close()


@pytest.mark.parametrize("kind", ["sqlite", "mariadb", "redis"])
async def test_a_bulk_write_wakes_a_dispatcher_asleep_on_any_store(kind: str, tmp_path: Path) -> None:
    """As on PostgreSQL (above): a dispatcher asleep toward a message an hour away delivers one a
    bulk job stores due now within moments (SQLite's watcher sees the file change, Redis's store
    hears the job's publish, MariaDB's dispatchers look again), not after its five-minute sleep."""
    import asyncio

    from duetime import DelayedDeliverySettings, Dispatcher, open_store, open_transport

    with store_url(kind, tmp_path) as url:
        store = open_store(url)
        own_queue = kind == "sqlite"
        transport = open_transport(url if own_queue else "memory://")
        await transport.declare("orders")
        await store.setup_infrastructure("Sales")
        mode = TransactionMode.EXACTLY_ONCE if own_queue else TransactionMode.AT_LEAST_ONCE
        await store.initialize("Sales", mode)
        await store.store(DelayedMessage("later", "orders", datetime.now(UTC) + timedelta(hours=1)))
        settings = DelayedDeliverySettings(transaction_mode=mode, max_sleep=timedelta(minutes=5))
        dispatcher = Dispatcher(store, transport, settings, endpoint="Sales")
        task = asyncio.create_task(dispatcher.run())
        try:
            while not dispatcher.started or dispatcher.stats.rounds == 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # asleep toward "later"
            record = Record("Sales", "now", "orders", to_micros(datetime.now(UTC)), "{}", b"b", 0, None)
            target = open_target(url)
            await asyncio.to_thread(target.prepare, ["Sales"])
            await asyncio.to_thread(target.write, "run-1", 0, [record])
            started = asyncio.get_running_loop().time()
            got = await transport.receive("orders", 10, 5.0)
            assert [m.message_id for m in got] == ["now"]
            assert asyncio.get_running_loop().time() - started < 2.0  # woken, not the 5-minute sleep
        finally:
            dispatcher.stop()
            await task
            await transport.close()
            await store.close()


@pytest.mark.parametrize("url", ["memory://", "dbm:///tmp/store", "parquet:/tmp/folder"])
def test_a_store_without_a_bulk_writer_is_refused_in_one_line(url: str) -> None:
    """The memory store and a store of one's own (docs/examples/dbm_store.py) have no bulk
    writer: bulk jobs say so before anything starts; a folder is no store to schedule into."""
    from duetime.bulk.targets import open_store_target
    from duetime.errors import ConfigurationError

    if not url.startswith("parquet"):
        with pytest.raises(ConfigurationError, match="not a store bulk jobs can write into") as refused:
            open_target(url)
        assert "redis://" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(
        ConfigurationError, match=r"give --to postgresql://, mysql://, sqlite:/// or redis://\.$"
    ):
        open_store_target(url)


@pytest.mark.parametrize("kind", STORES)
def test_a_bulk_write_for_an_endpoint_as_long_as_allowed_lands_in_the_stores_own_table(
    kind: str, tmp_path: Path
) -> None:
    """A 100-character endpoint's table name is longer than PostgreSQL and MariaDB take: the bulk
    jobs find and write the table the store made for it (the name cut the one way)."""
    endpoint = "Sales" + "x" * 95
    with store_url(kind, tmp_path) as url:
        store = open_sync_store(url)
        store.setup_infrastructure(endpoint)
        store.close()
        target = open_target(url)
        target.prepare([endpoint])
        written = target.write("run-1", 0, [_record(i)._replace(endpoint=endpoint) for i in range(3)])
        assert written == Written(3, ())
        assert sorted(store_rows(url, endpoint)) == ["m0", "m1", "m2"]
