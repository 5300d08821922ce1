"""Does Spark earn its place? The bulk jobs beside single-process floors, and one executor beside two.

    .venv/bin/python -m bench.cluster_bench                     # 1,000,000 rows
    .venv/bin/python -m bench.cluster_bench --rows 10000000
    .venv/bin/python -m bench.cluster_bench --migrate-rounds 3    # only (floor, migrate) pairs

In one run, on the same rows (NServiceBus ``TimeoutData`` in PostgreSQL, 200-byte bodies):

(a) a same-database move: one SQL statement (``DELETE … RETURNING`` feeding ``INSERT``, the floor)
    beside ``bulk migrate`` in local mode; an export to Parquet: one process (a server-side cursor
    into pyarrow's writer) beside ``bulk export`` in local mode;
(b) ``bulk export`` on a standalone cluster started here from the installed pyspark (a master and
    workers of one core each on loopback, ``tests/bulk/standalone.py``): one executor, then two.

Spark's start-up is timed apart from each job. Under each figure: how many of the machine's cores
the step kept busy, and how much of that was the database server (``bench/cpu.py``), which says
where the bottleneck is. Everything it creates is dropped at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.bulk_bench import BASE, TABLE, fill, store_table
from bench.cpu import CpuWatch
from duetime.bulk.export_import import export, import_
from duetime.bulk.migrate import MigrationSpec, migrate
from duetime.bulk.spark_session import spark_session
from tests.bulk.standalone import StandaloneCluster

FLOOR, JOB, SOURCE = "cluster_bench_floor", "cluster_bench_job", "cluster_bench_src"


#: What the servers and the rest used during the last step :func:`timed` ran (printed under it).
LAST_CPU: list[str] = [""]


def timed(action: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    with CpuWatch() as cpu:
        result = action()
    LAST_CPU[0] = cpu.usage.line()
    return time.perf_counter() - start, result


def cpu_line() -> str:
    """The cores the step just timed kept busy, and who: where the bottleneck is."""
    return f"      {LAST_CPU[0]}"


def floor_move(conn: psycopg.Connection, rows: int, *, group: bool = True) -> float:
    """The same move as one statement in the server: no checks, no batches, no resume. The same
    rows as the job writes, so with the saga id as each message's group (the job keeps it; its
    index costs the insert a third of its time); ``group=False`` is the lighter floor the
    figures before 2026-11-24 were measured against."""
    store_table(FLOOR)
    saga = ", NULLIF(\"SagaId\"::text, '00000000-0000-0000-0000-000000000000')" if group else ""
    took, _ = timed(
        lambda: conn.execute(
            f'WITH moved AS (DELETE FROM "{SOURCE}"."{TABLE}" RETURNING "Id", "Destination", "State", "Time", '
            f'"Headers", "SagaId") INSERT INTO "{FLOOR}"."Sales.delayed" (message_id, destination, due_at, '
            f"headers, body{', group_key' if group else ''}) "
            f'SELECT "Id"::text, "Destination", "Time" AT TIME ZONE \'UTC\', "Headers"::json, "State"{saga} FROM moved'
        )
    )
    count = conn.execute(f'SELECT COUNT(*) FROM "{FLOOR}"."Sales.delayed"').fetchone()
    assert count is not None and count[0] == rows
    return took


def export_table(url: str, table: str, folder: Path) -> int:
    """What one careful process does: stream a store table (``table``, quoted) into Parquet in
    bounded chunks, each typed as the store's columns (a chunk without a group is still text).
    Returns the rows written. ``volume_bench.py`` times it too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("message_id", pa.string()),
            ("destination", pa.string()),
            ("due_at", pa.timestamp("us", tz="UTC")),
            ("headers", pa.string()),
            ("body", pa.binary()),
            ("failure_count", pa.int32()),
            ("group", pa.string()),
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    with psycopg.connect(url) as conn, pq.ParquetWriter(folder / "part-0.parquet", schema) as writer:
        cur = conn.cursor(name="export")
        cur.itersize = 50_000
        cur.execute(
            f"SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key FROM {table}"
        )
        while chunk := cur.fetchmany(100_000):
            columns = zip(*chunk, strict=True)
            writer.write_table(
                pa.table([pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)
            )
            written += len(chunk)
    return written


def single_process_export(schema: str, folder: Path, rows: int) -> float:
    took, written = timed(lambda: export_table(BASE, f'"{schema}"."Sales.delayed"', folder))
    assert written == rows
    return took


def single_process_export_adbc(schema: str, folder: Path, rows: int) -> float:
    """The same one process reading through the Arrow project's ADBC driver (COPY's binary
    format into Arrow columns in C++), as the job itself does: the best one process can do."""
    import adbc_driver_postgresql.dbapi as adbc
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)

    def run() -> int:
        written = 0
        with adbc.connect(BASE) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key "
                f'FROM "{schema}"."Sales.delayed"'
            )
            reader = cur.fetch_record_batch()
            with pq.ParquetWriter(folder / "part-0.parquet", reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    written += batch.num_rows
        return written

    took, written = timed(run)
    assert written == rows
    return took


def export_rounds(rows: int, rounds: int) -> None:
    """Fill a store once, then ``rounds`` times: the one process (cursor, then ADBC) and the job
    in local mode (the first job pays the Spark session's warm-up)."""
    scratch = Path(tempfile.mkdtemp(prefix="cluster_bench_"))
    with psycopg.connect(BASE, autocommit=True) as conn:
        try:
            fill(conn, SOURCE, rows)
            conn.execute(f'DROP SCHEMA IF EXISTS "{JOB}" CASCADE')
            spark = spark_session("local[*]")
            spark.range(1).count()
            source = f"{BASE}?schema={SOURCE}&layout=timeoutdata&table={TABLE}"
            migrate(spark, MigrationSpec(source, f"{BASE}?schema={JOB}", "Sales"))
            for n in range(rounds):
                one = single_process_export(JOB, scratch / f"single{n}", rows)
                fast = single_process_export_adbc(JOB, scratch / f"adbc{n}", rows)
                job, _ = timed(
                    lambda: export(spark, f"{BASE}?schema={JOB}", f"parquet:{scratch / f'job{n}'}", "Sales")  # noqa: B023
                )
                print(
                    f"export {rows:,}: one process {one:5.1f} s, one process with ADBC {fast:5.1f} s, "
                    f"bulk export {job:5.1f} s = {one / job:.2f}x / {fast / job:.2f}x their rates",
                    flush=True,
                )
            spark.stop()
        finally:
            for schema in (SOURCE, JOB):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            shutil.rmtree(scratch, ignore_errors=True)


def single_process_import(folder: Path, schema: str, rows: int) -> float:
    """What one careful process does: read the Parquet a record batch at a time, check each row's
    headers parse (as duetime does), and COPY into the store table in one transaction."""
    import json

    import pyarrow.parquet as pq

    store_table(schema)

    def run() -> int:
        written = 0
        with (
            psycopg.connect(BASE) as conn,
            conn.cursor() as cur,
            cur.copy(
                f'COPY "{schema}"."Sales.delayed" (message_id, destination, due_at, headers, body, '
                "failure_count, group_key) FROM STDIN"
            ) as copy,
        ):
            for path in sorted(folder.glob("*.parquet")):
                for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
                    for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                        json.loads(row[3])
                        copy.write_row(row)
                        written += 1
        return written

    took, written = timed(run)
    assert written == rows
    return took


def export_on(
    master: str, source: str, folder: Path, rows: int, conf: dict[str, str] | None = None
) -> tuple[float, float]:
    startup, spark = timed(lambda: spark_session(master, conf))
    spark.range(1).count()
    took, done = timed(lambda: export(spark, source, f"parquet:{folder}", "Sales"))
    assert done.rows == rows, done
    spark.stop()
    return took, startup


def migrate_rounds(rows: int, batch_rows: int, rounds: int) -> None:
    """The floor and the job, one after the other on the same fresh rows, ``rounds`` times: the
    pairs' ratios say more than one run on this noisy machine."""
    spark = spark_session("local[*]")
    spark.range(1).count()
    source = f"{BASE}?schema={SOURCE}&layout=timeoutdata&table={TABLE}"
    with psycopg.connect(BASE, autocommit=True) as conn:
        try:
            for _ in range(rounds):
                fill(conn, SOURCE, rows)
                conn.execute(f'DROP SCHEMA IF EXISTS "{FLOOR}" CASCADE')
                light = floor_move(conn, rows, group=False)
                fill(conn, SOURCE, rows)
                conn.execute(f'DROP SCHEMA IF EXISTS "{FLOOR}" CASCADE')
                floor = floor_move(conn, rows)
                fill(conn, SOURCE, rows)
                conn.execute(f'DROP SCHEMA IF EXISTS "{JOB}" CASCADE')
                spec = MigrationSpec(source, f"{BASE}?schema={JOB}", "Sales", batch_rows=batch_rows)
                took, result = timed(lambda: migrate(spark, spec))  # noqa: B023
                assert result.inserted == rows and result.remaining == 0, result
                print(
                    f"floor {floor:5.1f} s (without the groups {light:5.1f} s)   migrate {took:5.1f} s   "
                    f"= {took / floor:.2f}x ({took / light:.2f}x the floor without the groups)",
                    flush=True,
                )
        finally:
            for schema in (SOURCE, FLOOR, JOB):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=100_000)
    parser.add_argument(
        "--migrate-rounds",
        type=int,
        default=0,
        help="only the same-database move: this many (floor, migrate) pairs on fresh rows, then stop",
    )
    parser.add_argument(
        "--export-rounds",
        type=int,
        default=0,
        help="only exports: this many (one process, one process with ADBC, job) rounds, then stop",
    )
    args = parser.parse_args()
    if args.export_rounds:
        export_rounds(args.rows, args.export_rounds)
        return
    if args.migrate_rounds:
        migrate_rounds(args.rows, args.batch_rows, args.migrate_rounds)
        return
    rows = args.rows
    scratch = Path(tempfile.mkdtemp(prefix="cluster_bench_"))
    with psycopg.connect(BASE, autocommit=True) as conn:
        try:
            print(f"filling {rows:,} TimeoutData rows …", flush=True)
            fill(conn, SOURCE, rows)
            conn.execute(f'DROP SCHEMA IF EXISTS "{FLOOR}" CASCADE')
            floor = floor_move(conn, rows)
            print(
                f"(a) same-database move, one SQL statement (floor) : {floor:6.1f} s  {rows / floor:10,.0f} rows/s",
                flush=True,
            )
            print(cpu_line(), flush=True)
            fill(conn, SOURCE, rows)
            conn.execute(f'DROP SCHEMA IF EXISTS "{JOB}" CASCADE')
            startup, spark = timed(lambda: spark_session("local[*]"))
            spark.range(1).count()
            source = f"{BASE}?schema={SOURCE}&layout=timeoutdata&table={TABLE}"
            took, result = timed(
                lambda: migrate(
                    spark, MigrationSpec(source, f"{BASE}?schema={JOB}", "Sales", batch_rows=args.batch_rows)
                )
            )
            assert result.inserted == rows and result.remaining == 0, result
            print(
                f"    bulk migrate, local[*]                          : {took:6.1f} s  {rows / took:10,.0f} rows/s  "
                f"= {took / floor:.2f}x the floor's time (target <= 1.5x); start-up {startup:.1f} s apart",
                flush=True,
            )
            print(cpu_line(), flush=True)
            one = single_process_export(JOB, scratch / "single", rows)
            print(
                f"(a) export to Parquet, one process                  : {one:6.1f} s  {rows / one:10,.0f} rows/s",
                flush=True,
            )
            print(cpu_line(), flush=True)
            fast = single_process_export_adbc(JOB, scratch / "adbc", rows)
            print(
                f"    export to Parquet, one process with ADBC        : {fast:6.1f} s  {rows / fast:10,.0f} rows/s",
                flush=True,
            )
            print(cpu_line(), flush=True)
            job, _ = timed(
                lambda: export(spark, f"{BASE}?schema={JOB}", f"parquet:{scratch / 'local'}", "Sales")
            )
            print(
                f"    bulk export, local[*]                           : {job:6.1f} s  {rows / job:10,.0f} rows/s  "
                f"= {one / job:.2f}x the single process's rate, {fast / job:.2f}x with ADBC",
                flush=True,
            )
            print(cpu_line(), flush=True)
            # Import the one-process export (a single file): Spark's reader makes a task of each
            # 128 MB; the job spreads the rows over one task per --batch-rows.
            conn.execute('DROP SCHEMA IF EXISTS "cluster_bench_imp1" CASCADE')
            single = single_process_import(scratch / "single", "cluster_bench_imp1", rows)
            print(
                f"(a) import from Parquet, one process               : {single:6.1f} s  {rows / single:10,.0f} rows/s",
                flush=True,
            )
            print(cpu_line(), flush=True)
            conn.execute('DROP SCHEMA IF EXISTS "cluster_bench_imp1" CASCADE')
            conn.execute('DROP SCHEMA IF EXISTS "cluster_bench_imp2" CASCADE')
            took, imported = timed(
                lambda: import_(
                    spark,
                    f"parquet:{scratch / 'single'}",
                    f"{BASE}?schema=cluster_bench_imp2",
                    "Sales",
                    batch_rows=args.batch_rows,
                )
            )
            assert imported.inserted == rows, imported
            print(
                f"    bulk import, local[*]                           : {took:6.1f} s  {rows / took:10,.0f} rows/s  "
                f"= {single / took:.2f}x the single process's rate ({imported.batches} batches)",
                flush=True,
            )
            print(cpu_line(), flush=True)
            conn.execute('DROP SCHEMA IF EXISTS "cluster_bench_imp2" CASCADE')
            spark.stop()
            cluster = StandaloneCluster(scratch)
            try:
                cluster.add_worker()
                t1, s1 = export_on(cluster.master, f"{BASE}?schema={JOB}", scratch / "one", rows)
                print(
                    f"(b) bulk export, standalone, 1 executor             : {t1:6.1f} s  {rows / t1:10,.0f} rows/s  (start-up {s1:.1f} s)",
                    flush=True,
                )
                print(cpu_line(), flush=True)
                cluster.add_worker()
                t2, s2 = export_on(cluster.master, f"{BASE}?schema={JOB}", scratch / "two", rows)
                print(
                    f"    bulk export, standalone, 2 executors            : {t2:6.1f} s  {rows / t2:10,.0f} rows/s  "
                    f"= {t1 / t2:.2f}x one executor (start-up {s2:.1f} s)",
                    flush=True,
                )
                print(cpu_line(), flush=True)
            finally:
                cluster.stop()
        finally:
            for schema in (SOURCE, FLOOR, JOB):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
