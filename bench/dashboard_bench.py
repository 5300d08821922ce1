"""The dashboard's pages on a big store, beside the store calls they are made of, in one run.

    .venv/bin/python bench/dashboard_bench.py                   # 1,000,000 messages in PostgreSQL
    .venv/bin/python bench/dashboard_bench.py --count 100000

Stores ``--count`` messages (10 destinations, due over the next 30 days) in a fresh PostgreSQL
schema, starts `duetime dashboard` on it, and times each page as a browser would fetch it
(median of 5; the table vacuumed and analyzed first, as autovacuum would soon after a load)
beside the raw store call behind it: ``counts`` for the overview (the sampler makes it every
``--sample-every``; the page shows that look and counts only what falls due soon, by index),
``list`` for a page of messages (first,
deep behind a cursor, one destination), ``get`` for one message. A page much slower than its
calls would be the dashboard's own cost; the calls themselves are the store's.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psycopg

from duetime import DelayedMessage, TransactionMode
from duetime.backends.postgres import SyncPostgresStore
from duetime.interfaces import ListQuery

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
ENDPOINT = "bench"
PASSWORD = "bench"


def median_ms(action: Callable[[], Any], times: int = 5) -> float:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def fetch(port: int, path: str) -> None:
    auth = "Basic " + base64.b64encode(f"duetime:{PASSWORD}".encode()).decode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": auth})
    with urllib.request.urlopen(req, timeout=120) as answer:
        answer.read()
        assert answer.status == 200


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1_000_000)
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    url = f"{POSTGRES}?schema={schema}"
    store = SyncPostgresStore.from_url(url)
    store.setup_infrastructure(ENDPOINT)
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    now = datetime.now(UTC)
    started = time.perf_counter()
    step = 20_000
    for start in range(0, args.count, step):
        store.store_many(
            [
                DelayedMessage.create(
                    f"queue-{i % 10}", b"x" * 100, due_at=now + timedelta(days=1 + 29 * i / args.count)
                )
                for i in range(start, min(start + step, args.count))
            ]
        )
    print(f"stored {args.count:,} in {time.perf_counter() - started:.0f} s")
    with psycopg.connect(POSTGRES, autocommit=True) as conn:  # what autovacuum does soon after a load
        conn.execute(f'VACUUM ANALYZE "{schema}"."{ENDPOINT}.delayed"')
    port = 18000 + os.getpid() % 1000
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "dashboard",
            "--store",
            url,
            "--endpoint",
            ENDPOINT,
            "--port",
            str(port),
        ],
        env={**os.environ, "DUETIME_DASHBOARD_PASSWORD": PASSWORD},
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                fetch(port, "/healthz")
                break
            except OSError:
                time.sleep(0.2)
        deep = store.list(ListQuery(limit=1, due_after=now + timedelta(days=25))).messages[0]
        cursor = quote(f"{deep.due_at.isoformat()}|{deep.message_id}")
        one = store.list(ListQuery(limit=1)).messages[0]
        rows = [
            (
                "overview /",
                lambda: fetch(port, "/"),
                "counts (the sampler's)",
                lambda: store.counts(now),
            ),
            (
                "messages, first page",
                lambda: fetch(port, "/messages"),
                "list 50",
                lambda: store.list(ListQuery(limit=50)),
            ),
            (
                "messages, page at day 25",
                lambda: fetch(port, f"/messages?after={cursor}"),
                "list 50 after cursor",
                lambda: store.list(ListQuery(limit=50, after=(deep.due_at, deep.message_id))),
            ),
            (
                "messages of one destination",
                lambda: fetch(port, "/messages?destination=queue-3"),
                "list 50 destination",
                lambda: store.list(ListQuery(limit=50, destination="queue-3")),
            ),
            (
                "one message",
                lambda: fetch(port, f"/message?id={one.message_id}"),
                "get",
                lambda: store.get(one.message_id),
            ),
        ]
        print(f"{'page':30} {'page ms':>9} {'store call':24} {'call ms':>9} {'ratio':>6}")
        for page, load, call, direct in rows:
            page_ms, call_ms = median_ms(load), median_ms(direct)
            print(f"{page:30} {page_ms:9.1f} {call:24} {call_ms:9.1f} {page_ms / call_ms:6.2f}")
    finally:
        board.terminate()
        board.wait(timeout=30)
        store.close()
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
