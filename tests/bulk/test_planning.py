"""How a migration splits a source into batches: block ranges on PostgreSQL, key ranges elsewhere.

No Spark here: the plan and each batch's rows are read straight from the database.
"""

from __future__ import annotations

from itertools import pairwise

from duetime.bulk.sources import Batch, DbSource, block_of
from duetime.clock import SYSTEM, to_micros
from duetime.sqldb import Database
from tests.bulk.conftest import create_timeoutdata, timeout_rows
from tests.services import mariadb_database, postgres_schema

TABLE = "Orders_TimeoutData"


def _source(url: str) -> DbSource:
    return DbSource(Database.from_url(f"{url}{'&' if '?' in url else '?'}layout=timeoutdata&table={TABLE}"))


def _ids(source: DbSource, batch: Batch) -> list[str]:
    return [r.message_id for r in source.read(batch, None, to_micros(SYSTEM.now()))]


def _blocks(source: DbSource, ids: list[str]) -> set[int]:
    with source.db.session(write=False) as conn:
        rows = source.db.execute(
            conn,
            f'SELECT DISTINCT (ctid::text::point)[0]::bigint FROM {source.db.qualified(TABLE)} WHERE "Id"::text = ANY(%s)',
            [ids],
        ).fetchall()
    return {int(r[0]) for r in rows}


def test_postgres_batches_are_block_ranges_covering_every_row_once() -> None:
    with postgres_schema() as pg:
        rows = timeout_rows(5_000)
        create_timeoutdata(pg, TABLE, rows)
        source = _source(pg)
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
        assert sorted(seen) == sorted(str(r[0]) for r in rows)


def test_a_run_planned_by_key_ranges_resumes_by_its_key_ranges() -> None:
    """Runs planned before block ranges kept key bounds in their batches table."""
    with postgres_schema() as pg:
        rows = timeout_rows(600)
        create_timeoutdata(pg, TABLE, rows)
        source = _source(pg)
        keys = sorted(str(r[0]) for r in rows)
        halves = [
            Batch(0, "Orders", TABLE, None, keys[300], 300),
            Batch(1, "Orders", TABLE, keys[300], None, 300),
        ]
        assert [sorted(_ids(source, b)) for b in halves] == [keys[:300], keys[300:]]


def test_other_databases_keep_key_ranges() -> None:
    with mariadb_database() as url:
        rows = timeout_rows(300)
        create_timeoutdata(url, TABLE, rows)
        source = _source(url)
        batches = source.plan(None, None, to_micros(SYSTEM.now()), 100)
        assert len(batches) == 3 and all(block_of(b.lower) is None for b in batches)
        assert sorted(i for b in batches for i in _ids(source, b)) == sorted(str(r[0]) for r in rows)
