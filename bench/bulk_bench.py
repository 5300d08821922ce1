"""Spark migration of NServiceBus ``TimeoutData`` rows into the duetime PostgreSQL store.

    .venv/bin/python -m bench.bulk_bench                     # 1,000,000 rows (the aim: under 60 s)
    .venv/bin/python -m bench.bulk_bench --rows 100000
    .venv/bin/python -m bench.bulk_bench --other-database    # into a store in another database

Prints, for the same rows in the same run: a single-process Python migration (server-side cursor,
convert, COPY into the store table, delete the source) and ``duetime bulk migrate`` (verified,
resumable batches as Spark tasks in local mode), each with rows/s, and the ratio. Spark's start-up
is timed apart from the job. Both write the same rows: the saga id becomes each message's group.
Under each: the cores it kept busy, and how many of them were PostgreSQL's (``bench/cpu.py``).

Within one database the job moves each batch inside the server; with ``--other-database`` (a
database the bench creates and drops) it takes the cross-database path: each batch is staged in
the source's database, checked, and COPYed into the target from a Spark task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.cpu import CpuWatch
from duetime.bulk.migrate import MigrationSpec, migrate
from duetime.bulk.spark_session import spark_session
from duetime.registry import open_sync_store

BASE = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SOURCE_SCHEMA, BASELINE_SCHEMA, TARGET_SCHEMA = "bulk_bench_src", "bulk_bench_base", "bulk_bench_dst"
OTHER_DATABASE = "duetime_bulk_bench_other"
EMPTY_GUID = "00000000-0000-0000-0000-000000000000"
TABLE = "Sales_TimeoutData"


def fill(conn: psycopg.Connection, schema: str, rows: int) -> None:
    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    conn.execute(f'CREATE SCHEMA "{schema}"')
    conn.execute(
        f'CREATE TABLE "{schema}"."{TABLE}" ("Id" uuid PRIMARY KEY, "Destination" varchar(200), "SagaId" uuid, '
        '"State" bytea, "Time" timestamp, "Headers" text, "PersistenceVersion" varchar(23) NOT NULL)'
    )
    conn.execute(
        f'INSERT INTO "{schema}"."{TABLE}" SELECT gen_random_uuid(), \'orders\', gen_random_uuid(), '
        "convert_to(repeat('x', 200) || i::text, 'UTF8'), now() at time zone 'utc' + make_interval(secs => i), "
        '\'{"NServiceBus.MessageId":"\' || i::text || \'","NServiceBus.ContentType":"application/json"}\', \'4.1.0\' '
        "FROM generate_series(1, %s) AS i",
        [rows],
    )


def store_table(schema: str, database: str = BASE) -> None:
    store = open_sync_store(f"{database}?schema={schema}")
    store.setup_infrastructure("Sales")
    store.close()


def baseline(rows: int, target: str = BASE) -> float:
    """What a careful one-process script does: stream the rows, convert, COPY, then delete."""
    store_table(BASELINE_SCHEMA, target)
    start = time.perf_counter()
    with psycopg.connect(BASE) as reader, psycopg.connect(target) as writer:
        read = reader.cursor(name="read")
        read.itersize = 20_000
        read.execute(
            f'SELECT "Id", "Destination", "State", "Time", "Headers", "SagaId" FROM "{SOURCE_SCHEMA}"."{TABLE}"'
        )
        with writer.cursor().copy(
            f'COPY "{BASELINE_SCHEMA}"."Sales.delayed" (message_id, destination, due_at, headers, body, '
            "group_key) FROM STDIN"
        ) as copy:
            for ident, destination, state, due, headers, saga in read:
                json.loads(headers)  # the same validation duetime does
                group = None if saga is None or str(saga) == EMPTY_GUID else str(saga)
                copy.write_row((str(ident), destination, due.isoformat() + "+00:00", headers, state, group))
        moved = writer.execute(f'SELECT COUNT(*) FROM "{BASELINE_SCHEMA}"."Sales.delayed"').fetchone()
        assert moved is not None and moved[0] == rows
        writer.commit()
        read.close()
        reader.execute(f'DELETE FROM "{SOURCE_SCHEMA}"."{TABLE}"')
        reader.commit()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument(
        "--other-database",
        action="store_true",
        help="migrate into a store in another database (created here)",
    )
    args = parser.parse_args()
    target = BASE
    with psycopg.connect(BASE, autocommit=True) as conn:
        if args.other_database:
            target = urlunsplit(urlsplit(BASE)._replace(path=f"/{OTHER_DATABASE}"))
            conn.execute(f'DROP DATABASE IF EXISTS "{OTHER_DATABASE}"')
            conn.execute(f'CREATE DATABASE "{OTHER_DATABASE}"')
        try:
            run(conn, args, target)
        finally:
            if args.other_database:
                conn.execute(f'DROP DATABASE IF EXISTS "{OTHER_DATABASE}" WITH (FORCE)')


def drop_schemas(target: str) -> None:
    for database in {BASE, target}:
        with psycopg.connect(database, autocommit=True) as conn:
            for schema in (SOURCE_SCHEMA, BASELINE_SCHEMA, TARGET_SCHEMA):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(conn: psycopg.Connection, args: argparse.Namespace, target: str) -> None:
    drop_schemas(target)
    print(f"filling {args.rows:,} TimeoutData rows …", flush=True)
    fill(conn, SOURCE_SCHEMA, args.rows)
    with CpuWatch() as cpu:
        base = baseline(args.rows, target)
    print(f"single-process Python : {base:6.1f} s  {args.rows / base:10,.0f} rows/s", flush=True)
    print(f"    {cpu.usage.line()}", flush=True)
    fill(conn, SOURCE_SCHEMA, args.rows)
    start = time.perf_counter()
    spark = spark_session(args.master)
    spark.range(1).count()
    startup = time.perf_counter() - start
    source = f"{BASE}?schema={SOURCE_SCHEMA}&layout=timeoutdata&table={TABLE}"
    start = time.perf_counter()
    with CpuWatch() as cpu:
        result = migrate(
            spark,
            MigrationSpec(source, f"{target}?schema={TARGET_SCHEMA}", "Sales", batch_rows=args.batch_rows),
        )
    took = time.perf_counter() - start
    assert result.inserted == args.rows and result.remaining == 0, result
    with psycopg.connect(target) as other:
        moved = other.execute(f'SELECT COUNT(*) FROM "{TARGET_SCHEMA}"."Sales.delayed"').fetchone()
    assert moved is not None and moved[0] == args.rows
    print(
        f"duetime bulk migrate  : {took:6.1f} s  {args.rows / took:10,.0f} rows/s  ({result.batches} batches, "
        f"Spark start-up {startup:.1f} s apart)"
    )
    print(f"    {cpu.usage.line()}")
    print(
        f"ratio (duetime / single-process rows/s): {base / took:.2f}x; aim: under 60 s -> "
        f"{'met' if took + startup < 60 else 'NOT met'} ({took + startup:.1f} s with start-up)"
    )
    spark.stop()
    drop_schemas(target)


if __name__ == "__main__":
    main()
