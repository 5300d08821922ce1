"""How a migration splits a source into batches: block ranges on PostgreSQL, key ranges elsewhere.

No Spark here: the plan and each batch's rows are read straight from the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from itertools import pairwise
from uuid import UUID

import pytest

from duetime.bulk import sources
from duetime.bulk.sources import Batch, DbSource, block_of
from duetime.clock import SYSTEM, to_micros
from duetime.registry import open_sql_database
from tests.bulk.conftest import create_timeoutdata, timeout_rows
from tests.services import mariadb_database, postgres_database, postgres_schema

TABLE = "Orders_TimeoutData"


@contextmanager
def _legacy(database: AbstractContextManager[str], n: int) -> Iterator[tuple[DbSource, list[str]]]:
    """A TimeoutData table of ``n`` rows in a fresh database: its source, and its ids in order."""
    with database as url:
        rows = timeout_rows(n)
        create_timeoutdata(url, TABLE, rows)
        sep = "&" if "?" in url else "?"
        yield (
            DbSource(open_sql_database(f"{url}{sep}layout=timeoutdata&table={TABLE}")),
            sorted(str(r[0]) for r in rows),
        )


def _ids(source: DbSource, batch: Batch) -> list[str]:
    return [r.message_id for r in source.read(batch, None, to_micros(SYSTEM.now()))]


def _sql(source: DbSource, sql: str, params: list[object]) -> list[tuple[object, ...]]:
    with source.db.session() as conn:
        cursor = source.db.execute(conn, sql.replace("{table}", source.db.qualified(TABLE)), params)
        return list(cursor.fetchall()) if cursor.description else []


def _blocks(source: DbSource, ids: list[str]) -> set[int]:
    sql = 'SELECT DISTINCT (ctid::text::point)[0]::bigint FROM {table} WHERE "Id"::text = ANY(%s)'
    return {int(str(r[0])) for r in _sql(source, sql, [ids])}


def test_postgres_batches_are_block_ranges_covering_every_row_once() -> None:
    with _legacy(postgres_schema(), 5_000) as (source, keys):
        batches = source.plan(None, None, to_micros(SYSTEM.now()), 1_000)
        assert len(batches) == 5 and sum(b.planned for b in batches) == 5_000
        assert batches[0].lower is None and batches[-1].upper is None
        for before, after in pairwise(batches):
            assert before.upper == after.lower and block_of(after.lower) is not None  # contiguous
        seen: list[str] = []
        for batch in batches:
            ids = _ids(source, batch)
            assert len(ids) == batch.planned
            # a batch reads its own few blocks, not a key range spread over the whole table
            assert len(_blocks(source, ids)) <= 1_000 // 10
            seen += ids
        assert sorted(seen) == keys


def test_slices_of_many_blocks_still_cover_every_row_once_and_count_each_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A big table is counted in slices of many blocks: batches are then within a slice of
    ``batch_rows``, and each one's count is still exactly the rows it reads."""
    monkeypatch.setattr(sources, "MIN_SLICES", 7)
    monkeypatch.setattr(sources, "SLICES_PER_BATCH", 1)
    with _legacy(postgres_schema(), 5_000) as (source, keys):
        _sql(source, "ANALYZE {table}", [])
        batches = source.plan(None, None, to_micros(SYSTEM.now()), 1_000)
        assert 3 <= len(batches) <= 7 and sum(b.planned for b in batches) == 5_000
        seen = [i for batch in batches for i in _ids(source, batch)]
        assert [len(_ids(source, b)) for b in batches] == [b.planned for b in batches]
        assert sorted(seen) == keys


@pytest.mark.parametrize(
    ("blocks", "tuples", "batch_rows", "slices"),
    [
        (0, -1, 1000, 1),  # an empty table: one slice, open-ended
        (50, -1, 1000, 50),  # few blocks: each its own slice
        (47_620, -1, 100_000, 1024),  # never analyzed: the least
        (47_620, 1_000_000, 100_000, 1024),
        (476_200, 10_000_000, 100_000, 6400),  # 64 per expected batch
        (4_762_000, 100_000_000, 10_000, 16_384),  # at most
    ],
)
def test_block_slices(blocks: int, tuples: int, batch_rows: int, slices: int) -> None:
    starts = sources.block_slices(blocks, tuples, batch_rows)
    assert len(starts) == slices and starts[0] == 0
    assert starts == sorted(set(starts)) and all(s < max(blocks, 1) for s in starts)


def test_a_row_updated_into_a_finished_block_range_is_left_for_the_next_run() -> None:
    """The README's promise: a row an UPDATE moves into blocks the run has already done is not read
    twice nor lost; it stays in the table, counted as remaining, and the next plan has it.

    A database of its own: another test's open transaction would keep VACUUM from freeing the
    first batch's space, and the rewritten row would land at the table's end instead."""
    with _legacy(postgres_database(), 5_000) as (source, keys):
        now = to_micros(SYSTEM.now())
        first, *rest = source.plan(None, None, now, 1_000)
        done = _ids(source, first)
        # the first batch's rows leave the table, as staging moves them out; VACUUM offers their space
        _sql(source, 'DELETE FROM {table} WHERE "Id"::text = ANY(%s)', [done])
        with source.db.session() as conn:
            conn.autocommit = True
            conn.execute(f"VACUUM {source.db.qualified(TABLE)}")
        # a row of a later batch is rewritten; its full block has no room, so it lands in the freed space
        later = _ids(source, rest[2])[0]
        moved = _sql(
            source,
            'UPDATE {table} SET "State" = %s WHERE "Id" = %s RETURNING (ctid::text::point)[0]::bigint',
            [b"rewritten " * 4, UUID(later)],
        )
        done_below = block_of(rest[0].lower)
        assert done_below is not None and int(str(moved[0][0])) < done_below, "the row did not move back"
        read = [i for batch in rest for i in _ids(source, batch)]
        assert later not in read and len(read) == len(set(read)) == 5_000 - len(done) - 1
        assert source.remaining(source.tables(None), None, now) == 5_000 - len(done)  # with the moved row
        _sql(source, 'DELETE FROM {table} WHERE "Id"::text = ANY(%s)', [read])
        again = source.plan(None, None, to_micros(SYSTEM.now()), 1_000)
        assert [i for batch in again for i in _ids(source, batch)] == [later]
        assert sorted(done + read + [later]) == keys


def test_a_run_planned_by_key_ranges_resumes_by_its_key_ranges() -> None:
    """Runs planned before block ranges kept key bounds in their batches table."""
    with _legacy(postgres_schema(), 600) as (source, keys):
        halves = [
            Batch(0, "Orders", TABLE, None, keys[300], 300),
            Batch(1, "Orders", TABLE, keys[300], None, 300),
        ]
        assert [sorted(_ids(source, b)) for b in halves] == [keys[:300], keys[300:]]


def test_other_databases_keep_key_ranges() -> None:
    with _legacy(mariadb_database(), 300) as (source, keys):
        batches = source.plan(None, None, to_micros(SYSTEM.now()), 100)
        assert len(batches) == 3 and all(block_of(b.lower) is None for b in batches)
        assert sorted(i for b in batches for i in _ids(source, b)) == keys
