"""Where new rows go in a large PostgreSQL store, and what that costs the WAL.

    .venv/bin/python bench/free_space_bench.py                     # 3,000,000 waiting (about 8 minutes)
    .venv/bin/python bench/free_space_bench.py --rows 10000000
    DUETIME_BENCH_POSTGRES=postgresql://postgres@127.0.0.1:55432/test .venv/bin/python bench/free_space_bench.py
                                                    # a server of your own, its settings yours to change

``volume_bench.py`` finds scheduling into ten million stored messages slower than into an empty
store. This shows why: two stores, one empty and one filled as ``volume_bench.py`` fills it
(then vacuumed and checkpointed). On each in turn, ``--rounds`` times: a checkpoint, then 5,000
small messages scheduled in batches of 1,000; how fast, how many heap pages they landed in,
and how many whole pages (full-page images) and bytes of WAL the server wrote meanwhile
(``pg_stat_wal``, the server's own counters: anything else the server did meanwhile counts too,
so run it on a quiet server). The full store's figures beside the empty one's, as ratios, under
the server's settings that bear on them (printed with the table).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from bench.volume_bench import ENDPOINT, POSTGRES, checked, cli, fill, place, settle
from duetime import DelayedMessage, TransactionMode

BATCH = 1_000
NEW = 5_000
#: PostgreSQL sends a backend's statistics at most once a second.
STATS_FLUSH = 1.5


def wal(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """Full-page images and bytes the server's WAL holds so far."""
    row = conn.execute("SELECT wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


#: The server's settings that could change what a scattered insert costs.
SETTINGS = ("shared_buffers", "wal_compression", "full_page_writes", "max_wal_size", "checkpoint_timeout")


def settings(conn: psycopg.Connection[Any]) -> str:
    """The server's :data:`SETTINGS`, as ``name = value`` pairs."""
    return ", ".join(
        f"{name} = {conn.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
        for name in SETTINGS
    )


def one_round(store: Any, table: str, conn: psycopg.Connection[Any], tag: str) -> dict[str, float]:
    conn.execute("CHECKPOINT")
    time.sleep(STATS_FLUSH)
    now = datetime.now(UTC)
    messages = [
        DelayedMessage(f"{tag}-{i}", "new.stream", now + timedelta(hours=1, seconds=i / 1000), b"s")
        for i in range(NEW)
    ]
    before = wal(conn)
    started = time.perf_counter()
    for k in range(0, NEW, BATCH):
        store.store_many(messages[k : k + BATCH])
    took = time.perf_counter() - started
    time.sleep(STATS_FLUSH)
    after = wal(conn)
    pages = conn.execute(
        f"SELECT count(DISTINCT (ctid::text::point)[0]) FROM {table} WHERE message_id LIKE %s",
        [f"{tag}-%"],
    ).fetchone()
    assert pages is not None
    store.remove_many([m.message_id for m in messages])
    return {
        "scheduled a second": NEW / took,
        "heap pages they went into": float(pages[0]),
        "whole pages written to the WAL": float(after[0] - before[0]),
        "WAL written (MB)": (after[1] - before[1]) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        with place("postgresql", work, "empty") as empty, place("postgresql", work, "full") as full:
            for p in (empty, full):
                checked(cli("setup", "--store", p.store, "--endpoint", ENDPOINT))
            took = fill(full, args.rows, datetime.now(UTC))
            print(f"filled {args.rows:,} in {took:.0f} s; settled in {settle('postgresql', full):.0f} s")
            figures: dict[str, list[dict[str, float]]] = {"empty": [], "full": []}
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                server = settings(conn)
                for round_ in range(args.rounds):
                    for name, p in (("empty", empty), ("full", full)):
                        schema = p.store.split("schema=", 1)[1]
                        with duetime.open_sync_store(p.store) as store:
                            store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
                            table = f'"{schema}"."{ENDPOINT}.delayed"'
                            figures[name].append(one_round(store, table, conn, f"r{round_}"))
                    print(f"  round {round_ + 1} of {args.rounds}", flush=True)
    print(f"\n{NEW:,} small messages scheduled into an empty store and one holding {args.rows:,}, ")
    print(
        f"just after a checkpoint, medians of {args.rounds} rounds, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n"
    )
    print(f"the server: {server}\n")
    print(f"| | empty | {args.rows:,} waiting | ratio |\n|---|---|---|---|")
    for key in figures["empty"][0]:
        a = statistics.median(r[key] for r in figures["empty"])
        b = statistics.median(r[key] for r in figures["full"])
        print(
            f"| {key} | {a:,.1f} | {b:,.1f} | {b / a:.2f}x |" if a else f"| {key} | {a:,.1f} | {b:,.1f} | |"
        )


if __name__ == "__main__":
    main()
