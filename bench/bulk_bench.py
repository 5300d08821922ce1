"""Spark migration of NServiceBus ``TimeoutData`` rows into the duetime PostgreSQL store.

    .venv/bin/python bench/bulk_bench.py               # 1,000,000 rows (issue 6's aim: under 60 s)
    .venv/bin/python bench/bulk_bench.py --rows 100000

Prints, for the same rows in the same run: a single-process Python migration (server-side cursor,
convert, COPY into the store table, delete the source, one transaction) and ``duetime bulk
migrate`` (staged, verified, resumable batches as Spark tasks in local mode), each with rows/s,
and the ratio. Spark's start-up is timed apart from the job.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import psycopg

from duetime.bulk.migrate import MigrationSpec, migrate
from duetime.bulk.session import spark_session
from duetime.registry import open_sync_store

BASE = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SOURCE_SCHEMA, BASELINE_SCHEMA, TARGET_SCHEMA = "bulk_bench_src", "bulk_bench_base", "bulk_bench_dst"
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


def store_table(schema: str) -> None:
    store = open_sync_store(f"{BASE}?schema={schema}")
    store.setup_infrastructure("Sales")
    store.close()


def baseline(rows: int) -> float:
    """What a careful one-process script does: stream the rows, convert, COPY, then delete."""
    store_table(BASELINE_SCHEMA)
    start = time.perf_counter()
    with psycopg.connect(BASE) as reader, psycopg.connect(BASE) as writer:
        read = reader.cursor(name="read")
        read.itersize = 20_000
        read.execute(
            f'SELECT "Id", "Destination", "State", "Time", "Headers" FROM "{SOURCE_SCHEMA}"."{TABLE}"'
        )
        with writer.cursor().copy(
            f'COPY "{BASELINE_SCHEMA}"."Sales.delayed" (message_id, destination, due_at, headers, body) FROM STDIN'
        ) as copy:
            for ident, destination, state, due, headers in read:
                json.loads(headers)  # the same validation duetime does
                copy.write_row((str(ident), destination, due.isoformat() + "+00:00", headers, state))
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
    args = parser.parse_args()
    with psycopg.connect(BASE, autocommit=True) as conn:
        print(f"filling {args.rows:,} TimeoutData rows …", flush=True)
        fill(conn, SOURCE_SCHEMA, args.rows)
        conn.execute(f'DROP SCHEMA IF EXISTS "{BASELINE_SCHEMA}" CASCADE')
        base = baseline(args.rows)
        print(f"single-process Python : {base:6.1f} s  {args.rows / base:10,.0f} rows/s", flush=True)
        fill(conn, SOURCE_SCHEMA, args.rows)
        conn.execute(f'DROP SCHEMA IF EXISTS "{TARGET_SCHEMA}" CASCADE')
        start = time.perf_counter()
        spark = spark_session(args.master)
        spark.range(1).count()
        startup = time.perf_counter() - start
        source = f"{BASE}?schema={SOURCE_SCHEMA}&layout=timeoutdata&table={TABLE}"
        start = time.perf_counter()
        result = migrate(
            spark,
            MigrationSpec(source, f"{BASE}?schema={TARGET_SCHEMA}", "Sales", batch_rows=args.batch_rows),
        )
        took = time.perf_counter() - start
        assert result.inserted == args.rows and result.remaining == 0, result
        moved = conn.execute(f'SELECT COUNT(*) FROM "{TARGET_SCHEMA}"."Sales.delayed"').fetchone()
        assert moved is not None and moved[0] == args.rows
        print(
            f"duetime bulk migrate  : {took:6.1f} s  {args.rows / took:10,.0f} rows/s  ({result.batches} batches, "
            f"Spark start-up {startup:.1f} s apart)"
        )
        print(
            f"ratio (duetime / single-process rows/s): {base / took:.2f}x; aim: under 60 s -> "
            f"{'met' if took + startup < 60 else 'NOT met'} ({took + startup:.1f} s with start-up)"
        )
        spark.stop()
        for schema in (SOURCE_SCHEMA, BASELINE_SCHEMA, TARGET_SCHEMA):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
