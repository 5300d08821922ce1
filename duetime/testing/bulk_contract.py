"""The bulk contract: what the bulk jobs ask of a store's bulk writer, run by every store they
write (``tests/contract/test_bulk_writers.py``) and by a store of one's own that offers one.

A SQL store gives :class:`SqlBulkContract` its :class:`~duetime.bulk_interfaces.SqlDatabase`
(opened by the registry from the store's URL) and the store itself; a store of keys gives
:class:`KeyedBulkContract` its :class:`~duetime.bulk_interfaces.KeyedBulkRows`. Each checks the
promises bulk builds on: a row goes in once and comes back as the store's own reads give it,
an id the store holds is never overwritten, a write is part of the caller's transaction (or
ledgered once, for keys), and a job's ids are its own once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime.bulk_interfaces import KeyedBulkRows, Selection, SqlDatabase
from duetime.clock import to_micros
from duetime.interfaces import SyncDelayedMessageStore
from duetime.message import DelayedMessage
from duetime.settings import TransactionMode

ENDPOINT = "bulkcontract"


def row(
    message_id: str, *, due: datetime | None = None, body: bytes = b"\x00body\xff", group: str | None = None
) -> tuple[Any, ...]:
    """A store row as bulk writes it: id, destination, due µs, headers JSON, body, failures, group."""
    due = due or datetime.now(UTC) + timedelta(hours=1)
    headers = json.dumps({"h": "v \u00e9", "NServiceBus.MessageId": message_id})
    return (message_id, "dest.queue", to_micros(due), headers, body, 2, group)


def check_stored(store: SyncDelayedMessageStore, written: tuple[Any, ...]) -> None:
    """The store's own read gives back every byte bulk wrote."""
    found = store.get(written[0])
    assert found is not None, f"{written[0]} is not in the store"
    assert isinstance(found, DelayedMessage)
    assert found.destination == written[1]
    assert to_micros(found.due_at) == written[2]
    assert dict(found.headers) == json.loads(written[3])
    assert found.body == written[4]
    assert found.failure_count == written[5]
    assert found.group == written[6]


class SqlBulkContract:
    """A SQL store's bulk side. Subclasses give ``database`` (the store's URL opened by
    :func:`duetime.registry.open_sql_database`) and ``store`` (the same store, set up)."""

    @pytest.fixture
    def database(self) -> SqlDatabase:
        raise NotImplementedError

    @pytest.fixture
    def store(self) -> Iterator[SyncDelayedMessageStore]:
        raise NotImplementedError

    @pytest.fixture
    def table(self, database: SqlDatabase, store: SyncDelayedMessageStore) -> str:
        store.setup_infrastructure(ENDPOINT)
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        return database.table or f"{ENDPOINT}.delayed"

    def test_new_rows_go_in_once_and_read_back_byte_for_byte(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        rows = [row("a"), row("b", group="g-1"), row("a", body=b"second")]
        with database.session() as conn:
            assert database.store_rows(table).insert_new(conn, rows) == {"a", "b"}
        check_stored(store, rows[0])  # of an id given twice, the first
        check_stored(store, rows[1])

    def test_an_id_the_store_holds_is_never_overwritten(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        first = row("held")
        with database.session() as conn:
            database.store_rows(table).insert_new(conn, [first])
        with database.session() as conn:
            assert database.store_rows(table).insert_new(conn, [row("held", body=b"other"), row("new")]) == {
                "new"
            }
        check_stored(store, first)

    def test_a_copy_writes_all_or_says_an_id_was_there(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        writer = database.store_rows(table)
        if not writer.copies:
            with database.session() as conn:
                assert writer.copy(conn, [row("c1")]) is None  # nothing written: the caller inserts
            assert store.get("c1") is None
            return
        first = row("c1")
        with database.session() as conn:
            assert writer.copy(conn, [first, row("c2")]) == 2
        with database.session() as conn:
            assert writer.copy(conn, [row("c3"), row("c1", body=b"x")]) is None
        assert store.get("c3") is None
        check_stored(store, first)

    def test_rows_are_part_of_the_callers_transaction(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        with pytest.raises(RuntimeError), database.session() as conn:
            written = database.store_rows(table).insert_new(conn, [row("rolled")])
            database.store_rows(table).written(conn, row("rolled")[2], len(written))
            raise RuntimeError("the ledger row failed")
        assert store.get("rolled") is None

    def test_written_rows_are_due_to_the_stores_own_dispatcher(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        due = datetime.now(UTC) - timedelta(seconds=1)
        with database.session() as conn:
            writer = database.store_rows(table)
            writer.written(conn, to_micros(due), len(writer.insert_new(conn, [row("due-now", due=due)])))
        assert [m.message_id for m in store.fetch_due(datetime.now(UTC), 10)] == ["due-now"]

    def test_a_jobs_ids_are_its_own_once(self, database: SqlDatabase, table: str) -> None:
        with database.session() as conn:
            database.execute(conn, database.query("create_scheduled"))
        for job, ids, fresh in [
            ("j1", ["x", "y"], {"x", "y"}),
            ("j1", ["y", "z"], {"z"}),
            ("j2", ["x"], {"x"}),
        ]:
            with database.session() as conn:
                database.become_only_writer(conn)
                assert database.claim_ids(conn, job, ids) == fresh

    def test_a_selection_picks_rows_by_due_time_and_key_range(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        start = datetime(2031, 1, 1, tzinfo=UTC)
        rows = [row(f"k{i}", due=start + timedelta(minutes=i)) for i in range(8)]
        with database.session() as conn:
            database.store_rows(table).insert_new(conn, rows)
        now = to_micros(datetime.now(UTC))
        later = Selection(
            "due_at", due_from=database.store_due(to_micros(start + timedelta(minutes=2))), key="message_id"
        )
        unclaimed = Selection("due_at", unclaimed_at=database.store_due(now), key="message_id")
        ranged = Selection("due_at", key="message_id", lower="k2", upper="k5")
        before = Selection("due_at", due_before=database.store_due(to_micros(start + timedelta(minutes=3))))
        with database.session(write=False) as conn:
            assert database.count_rows(conn, table, later) == 6
            assert database.count_rows(conn, table, unclaimed) == 8  # none claimed
            assert database.count_rows(conn, table, before) == 3
            assert sorted(database.keys_of(conn, table, ranged)) == ["k2", "k3", "k4"]
            bounds = database.key_bounds(conn, table, later, 4)
            assert [(k, n, total) for k, n, total in bounds] == [("k2", 1, 6), ("k6", 5, 6)]
            (latest,) = database.latest_due_by(conn, table, "destination", later)
            assert latest[0] == "dest.queue"
            assert sorted(
                r[0] for r in database.rows_with_keys(conn, table, ["message_id"], ranged, ["k1", "k3"])
            ) == ["k3"]

    def test_a_batchs_ledger_entry_is_kept_once_until_its_run_is_forgotten(
        self, database: SqlDatabase
    ) -> None:
        with database.session() as conn:
            database.ensure_schema(conn)
            database.create_ledger(conn)
        with database.session() as conn:
            assert database.ledger_entry(conn, "run", 1) is None
            database.keep_ledger_entry(conn, "run", 1, 5, ["held"])
        with database.session(write=False) as conn:
            assert database.ledger_entry(conn, "run", 1) == (5, ["held"])
        with pytest.raises(Exception), database.session() as conn:  # noqa: B017 (each driver's own)
            database.keep_ledger_entry(conn, "run", 1, 9, [])
        with database.session() as conn:
            database.forget_ledger(conn, "run")
            assert database.ledger_entry(conn, "run", 1) is None

    def test_a_store_table_is_told_from_another(self, database: SqlDatabase, table: str) -> None:
        with database.session() as conn:
            database.create_ledger(conn)
        with database.session() as conn:
            assert database.is_store_table(conn, table)
            assert not database.is_store_table(conn, "duetime_bulk_ledger")

    def test_the_store_tables_are_found(self, database: SqlDatabase, table: str) -> None:
        with database.session(write=False) as conn:
            assert database.kept_name(table) in database.store_tables(conn)
            assert database.table_exists(conn, table)
            assert not database.table_exists(conn, "no such table")

    def test_rows_stream_in_bounded_lists(self, database: SqlDatabase, table: str) -> None:
        with database.session() as conn:
            database.store_rows(table).insert_new(conn, [row(f"s{i:02}") for i in range(25)])
        key = database.quote("message_id")
        with database.session(write=False) as conn:
            text = f"SELECT {key} FROM {database.qualified(table)} ORDER BY {key}"
            lists = list(database.stream(conn, text, size=10))
        assert [len(found) for found in lists] == [10, 10, 5]

    def test_a_migration_takes_rows_out_and_puts_them_back(
        self, database: SqlDatabase, store: SyncDelayedMessageStore, table: str
    ) -> None:
        kept = row("taken", group="g")
        with database.session() as conn:
            database.store_rows(table).insert_new(conn, [kept])
        columns = ["message_id", "destination", "due_at", "headers", "body", "failure_count", "group_key"]
        with database.session() as conn:
            taken = [
                row
                for rows in database.read_rows(
                    conn, table, columns, Selection("due_at"), as_stored=["headers"]
                )
                for row in rows
            ]
            assert database.take_rows(conn, table, "message_id", ["taken"]) == 1
        assert store.get("taken") is None
        with database.session() as conn:
            database.put_back(conn, table, columns, taken)
        check_stored(store, kept)


class KeyedBulkContract:
    """A store of keys' bulk side. Subclasses give ``rows`` (its writer, opened by
    :func:`duetime.registry.open_keyed_bulk_rows`) and ``store`` (the same store)."""

    @pytest.fixture
    def rows(self) -> KeyedBulkRows:
        raise NotImplementedError

    @pytest.fixture
    def store(self) -> Iterator[SyncDelayedMessageStore]:
        raise NotImplementedError

    @pytest.fixture
    def ready(self, rows: KeyedBulkRows, store: SyncDelayedMessageStore) -> KeyedBulkRows:
        rows.reach()
        rows.prepare(ENDPOINT)
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        return rows

    def test_new_rows_go_in_once_and_read_back_byte_for_byte(
        self, ready: KeyedBulkRows, store: SyncDelayedMessageStore
    ) -> None:
        given = [row("a"), row("b", group="g-1"), row("a", body=b"second")]
        assert ready.write(ENDPOINT, given, run_id="r", field="0") == (2, ["a"])
        check_stored(store, given[0])
        check_stored(store, given[1])

    def test_a_chunk_is_written_once_however_often_it_is_given(
        self, ready: KeyedBulkRows, store: SyncDelayedMessageStore
    ) -> None:
        assert ready.write(ENDPOINT, [row("once")], run_id="r", field="1") == (1, [])
        store.remove("once")  # delivered meanwhile: a re-run must not bring it back
        assert ready.write(ENDPOINT, [row("once")], run_id="r", field="1") == (1, [])
        assert store.get("once") is None

    def test_the_ledger_keeps_a_batchs_answer_until_forgotten(self, ready: KeyedBulkRows) -> None:
        assert ready.answer("run", "7") is None
        ready.keep("run", "7", 3, ["held"])
        assert ready.answer("run", "7") == (3, ["held"])
        ready.forget("run")
        assert ready.answer("run", "7") is None

    def test_an_id_the_store_holds_is_never_overwritten(
        self, ready: KeyedBulkRows, store: SyncDelayedMessageStore
    ) -> None:
        first = row("held")
        ready.write(ENDPOINT, [first], run_id="r", field="2")
        assert ready.write(ENDPOINT, [row("held", body=b"other")], run_id="r", field="3") == (0, ["held"])
        check_stored(store, first)

    def test_a_jobs_ids_are_its_own_once(self, ready: KeyedBulkRows, store: SyncDelayedMessageStore) -> None:
        assert ready.write(ENDPOINT, [row("j1"), row("j2")], job="job") == (2, [])
        store.remove("j1")
        assert ready.write(ENDPOINT, [row("j1"), row("j3")], job="job") == (1, [])
        assert store.get("j1") is None
        waiting = ready.write(ENDPOINT, [row("j2", body=b"new")], job="other", keep_held=False)
        assert waiting == (0, ["j2"])  # the caller replaces it, then says so
        ready.settled("other", ["j2"])
        assert ready.write(ENDPOINT, [row("j2", body=b"new")], job="other", keep_held=False) == (0, [])
