"""Lateness with the consumer in the loop: producer, dispatcher and consumer as separate processes.

    .venv/bin/python bench/lateness.py                  # 5,000 over 20 s, then 5,000 due at once
    .venv/bin/python bench/lateness.py --count 1000 --spread 5

Per path (SQLite exactly-once into its own queue; PostgreSQL into its queue tables, exactly-once;
PostgreSQL into RabbitMQ), in one run:

- **duetime**: the producer stores ``--count`` messages due over ``--spread`` seconds; `duetime
  run` delivers them; a consumer process records when each arrives. Lateness = arrival at the
  consumer - due time (the ``duetime-due-at`` header). Then ``--count`` more, all due at once:
  **drain** = the time from their due time to the last arrival.
- **raw timer** (the baseline): one process holds the same messages in memory, sleeps until each
  is due and sends it straight into the queue (no store, no claim): what a perfect in-memory timer
  achieves on the same queue and consumer. Its drain is the same send for everything at once.
- **raw move** (the SQL queues' drain baseline): the burst in a plain table
  of the same database, moved into the same queue table by a hand-written claim-move-delete loop
  (500 a transaction), read by the same consumer. Drain only: it has no timer.

Targets: p99 <= 5 ms for SQLite exactly-once and PostgreSQL -> RabbitMQ, <= 20 ms for
PostgreSQL -> PostgreSQL queue; never early; drain >= 0.8x the raw path's rate.

With the default 5,000 the SQL queues drain the burst in about 0.2 s, and the machine's noise is as
large as most changes: compare drains with ``--count 20000`` (the spread stays 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

import duetime
from duetime import DelayedMessage
from duetime.clock import to_micros
from duetime.message import DUE_AT_HEADER

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ = os.environ.get("DUETIME_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")

#: The consumer: receives from the queue and writes "id due_at_us arrival_us" per message.
CONSUMER = r"""
import asyncio, sys, time
from datetime import datetime
from duetime import open_transport
url, queue, out = sys.argv[1:4]
async def main():
    t = open_transport(url)
    await t.start()
    await t.declare(queue)
    with open(out, "a", buffering=1) as f:
        print("ready", file=sys.stderr, flush=True)
        items = []
        while True:
            items = await t.receive(queue, 500, 0.5, done=items)  # the last ones acknowledged first
            now = time.time()
            for i in items:
                due = datetime.fromisoformat(i.headers["duetime-due-at"]).timestamp()
                f.write(f"{i.message_id} {due:.6f} {now:.6f}\n")
asyncio.run(main())
"""

#: The raw timer: sleeps until each message is due and sends it straight to the queue.
RAW = r"""
import asyncio, json, sys, time
from datetime import datetime
from duetime import DelayedMessage, open_transport
url, plan = sys.argv[1:3]
async def main():
    t = open_transport(url)
    await t.start()
    items = [DelayedMessage(m, q, datetime.fromisoformat(d)) for m, q, d in json.load(open(plan))]
    items.sort(key=lambda m: m.due_at)
    i = 0
    while i < len(items):
        wait = items[i].due_at.timestamp() - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        now, j = time.time(), i
        while j < len(items) and items[j].due_at.timestamp() <= now:
            j += 1
        for start in range(i, j, 500):
            await t.send_batch(items[start:min(start + 500, j)])
        i = j
    await t.close()
asyncio.run(main())
"""


#: The raw claim-move-delete loop (the drain baseline for the SQL queues): the same messages
#: in a plain table of the same database, moved into the same queue table by hand-written SQL,
#: one transaction per batch, from their due time until none is left; read by the same consumer.
RAW_MOVE_SQLITE = r"""
import json, sqlite3, sys, time
path, plan, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = json.load(open(plan))
conn = sqlite3.connect(path, isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA synchronous=FULL")
conn.execute("CREATE TABLE raw_delayed (message_id TEXT PRIMARY KEY, destination TEXT, due_at INTEGER, headers TEXT, body BLOB)")
conn.execute("CREATE INDEX raw_delayed_due ON raw_delayed (due_at, message_id)")
conn.execute("BEGIN IMMEDIATE")
conn.executemany("INSERT INTO raw_delayed VALUES (?, ?, ?, ?, x'')", rows)
conn.execute("COMMIT")
due = min(r[2] for r in rows) / 1e6
time.sleep(max(0.0, due - time.time()))
while True:
    now = int(time.time() * 1e6)
    conn.execute("BEGIN IMMEDIATE")
    got = conn.execute(
        "SELECT message_id, destination, headers, body FROM raw_delayed WHERE due_at <= ? "
        "ORDER BY due_at, message_id LIMIT ?", (now, batch)).fetchall()
    conn.executemany(
        "INSERT INTO duetime_queue_messages (queue, message_id, headers, body, enqueued_at, visible_at) "
        "VALUES (?, ?, ?, ?, ?, ?)", [(r[1], r[0], r[2], r[3], now, now) for r in got])
    conn.executemany("DELETE FROM raw_delayed WHERE message_id = ?", [(r[0],) for r in got])
    conn.execute("COMMIT")
    if not got:
        break
conn.execute("DROP TABLE raw_delayed")
"""

RAW_MOVE_POSTGRES = r"""
import json, sys, time
import psycopg
from duetime.backends.postgres.connection import QUEUE_TABLES, channel_of
url, schema, plan, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = json.load(open(plan))
table = f'"{schema}".raw_delayed'
conn = psycopg.connect(url)
conn.execute(f"CREATE TABLE {table} (message_id varchar(250) PRIMARY KEY, destination varchar(200), "
             "due_at timestamptz, headers json, body bytea)")
conn.execute(f"CREATE INDEX ON {table} (due_at, message_id)")
with conn.cursor() as cur:
    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, to_timestamp(%s / 1e6), %s, '')", rows)
conn.commit()
move = (
    f"WITH moved AS (DELETE FROM {table} WHERE message_id IN ("
    f"  SELECT message_id FROM {table} WHERE due_at <= clock_timestamp()"
    "   ORDER BY due_at, message_id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)"
    "  RETURNING message_id, destination, headers, body"
    f"), sent AS (INSERT INTO \"{schema}\".duetime_queue_messages (queue, message_id, headers, body)"
    "  SELECT destination, message_id, headers, body FROM moved RETURNING queue) "
    "SELECT count(*), (SELECT count(pg_notify(%(channel)s, q)) FROM (SELECT DISTINCT queue AS q FROM sent) AS d) FROM sent"
)
channel = channel_of(schema, QUEUE_TABLES)
due = min(r[2] for r in rows) / 1e6
time.sleep(max(0.0, due - time.time()))
while True:
    moved = conn.execute(move, {"batch": batch, "channel": channel}).fetchone()[0]
    conn.commit()
    if not moved:
        break
conn.execute(f"DROP TABLE {table}")
conn.commit()
"""
#: Messages per transaction in the raw claim-move-delete loop: what the raw timer sends per batch
#: and the consumer takes per receive (`duetime run` claims 100 by default).
RAW_MOVE_BATCH = 500


@dataclass
class Figures:
    p50: float
    p99: float
    worst: float
    early: int
    drain: float


def python(code: str, *args: str, **kw: object) -> subprocess.Popen[bytes]:
    """``code`` in a new interpreter, importing the duetime this process imports: ``-P``, or
    ``-c`` would put the current folder first on its path, and run from the repository's root a
    consumer took the working tree's duetime whatever PYTHONPATH gave (an A/B run measured the
    same consumer twice)."""
    return subprocess.Popen([sys.executable, "-P", "-c", code, *args], **kw)  # type: ignore[call-overload,no-any-return]


def arrivals(out: Path, ids: set[str], seconds: float) -> dict[str, tuple[float, float]]:
    deadline = time.time() + seconds
    seen: dict[str, tuple[float, float]] = {}
    while time.time() < deadline:
        seen = {}
        text = out.read_text()
        for line in text[: text.rfind("\n") + 1].splitlines():  # a line being written waits
            mid, due, got = line.split()
            if mid in ids:
                seen[mid] = (float(due), float(got))
        if len(seen) == len(ids):
            return seen
        time.sleep(0.25)
    raise SystemExit(f"only {len(seen)} of {len(ids)} arrived in {seconds:.0f} s")


def plan(count: int, spread: float, queue: str, start: float) -> list[DelayedMessage]:
    base = datetime.now(UTC) + timedelta(seconds=start)
    return [
        DelayedMessage(uuid.uuid4().hex, queue, base + timedelta(seconds=spread * i / max(count - 1, 1)))
        for i in range(count)
    ]


def figures(
    spread_seen: dict[str, tuple[float, float]], burst_seen: dict[str, tuple[float, float]]
) -> Figures:
    late = sorted((got - due) * 1000 for due, got in spread_seen.values())
    due_at = min(due for due, _ in burst_seen.values())
    return Figures(
        p50=statistics.median(late),
        p99=late[int(len(late) * 0.99) - 1],
        worst=late[-1],
        early=sum(1 for x in late if x < 0),
        drain=max(got for _, got in burst_seen.values()) - due_at,
    )


def run_path(
    name: str, store: str, transport: str | None, queue: str, count: int, spread: float, folder: Path
) -> None:
    out = folder / f"{name.replace(' ', '_')}.arrivals"
    out.write_text("")
    queue_url = transport or store
    consumer = python(CONSUMER, queue_url, queue, str(out), stderr=subprocess.PIPE)
    assert consumer.stderr is not None
    consumer.stderr.readline()  # ready
    results: dict[str, Figures] = {}
    try:
        # raw timer first: the same messages, sent straight to the queue when due
        spread_plan, burst_plan = plan(count, spread, queue, 3.0), plan(count, 0.0, queue, 3.0 + spread + 3.0)
        path = folder / "plan.json"
        path.write_text(
            json.dumps([(m.message_id, queue, m.due_at.isoformat()) for m in spread_plan + burst_plan])
        )
        raw = python(RAW, queue_url, str(path))
        results["raw timer"] = figures(
            arrivals(out, {m.message_id for m in spread_plan}, spread + 60),
            arrivals(out, {m.message_id for m in burst_plan}, spread + 120),
        )
        raw.wait(timeout=60)
        # duetime: stored, then delivered by `duetime run`
        args = ["--store", store, "--endpoint", "lateness"] + (
            ["--transport", transport] if transport else []
        )
        subprocess.run([sys.executable, "-m", "duetime", "setup", *args[:4]], check=True, capture_output=True)
        dispatcher = subprocess.Popen(
            [sys.executable, "-m", "duetime", "run", *args], stderr=subprocess.DEVNULL
        )
        try:
            spread_plan, burst_plan = (
                plan(count, spread, queue, 3.0),
                plan(count, 0.0, queue, 3.0 + spread + 3.0),
            )
            with duetime.connect_sync(store, endpoint="lateness") as client:
                client.schedule_many(spread_plan + burst_plan)
            results["duetime"] = figures(
                arrivals(out, {m.message_id for m in spread_plan}, spread + 60),
                arrivals(out, {m.message_id for m in burst_plan}, spread + 120),
            )
        finally:
            dispatcher.send_signal(signal.SIGTERM)
            dispatcher.wait(timeout=30)
        if transport is None:  # a SQL queue: the raw claim-move-delete loop, drain only
            burst_plan = plan(count, 0.0, queue, 3.0)
            header = '{{"{}":"{}"}}'
            path.write_text(
                json.dumps(
                    [
                        (
                            m.message_id,
                            queue,
                            to_micros(m.due_at),
                            header.format(DUE_AT_HEADER, m.due_at.isoformat()),
                        )
                        for m in burst_plan
                    ]
                )
            )
            if store.startswith("sqlite:///"):
                mover = python(
                    RAW_MOVE_SQLITE, store.removeprefix("sqlite:///"), str(path), str(RAW_MOVE_BATCH)
                )
            else:
                bare, schema = store.split("?schema=")
                mover = python(RAW_MOVE_POSTGRES, bare, schema, str(path), str(RAW_MOVE_BATCH))
            seen = arrivals(out, {m.message_id for m in burst_plan}, 120)
            first_due = min(due for due, _ in seen.values())
            results["raw move"] = Figures(0, 0, 0, 0, max(got for _, got in seen.values()) - first_due)
            if mover.wait(timeout=60):
                raise SystemExit("the raw claim-move-delete loop failed")
    finally:
        consumer.kill()
        consumer.wait()
    raw_f, ours = results["raw timer"], results["duetime"]
    for label, f in results.items():
        rate = count / f.drain if f.drain > 0 else float("inf")
        lateness = (
            "| | | |" if label == "raw move" else f"| {f.p50:.1f} | {f.p99:.1f} | {f.worst:.1f} | {f.early}"
        )
        print(f"| {name} | {label} {lateness} | {f.drain:.2f} s ({rate:,.0f}/s) |")
    against_move = (
        f", {results['raw move'].drain / ours.drain:.2f}x the raw move's" if "raw move" in results else ""
    )
    print(
        f"| {name} | duetime / raw | | {ours.p99 / max(raw_f.p99, 0.001):.1f}x | | | "
        f"drain rate {raw_f.drain / ours.drain:.2f}x the raw timer's{against_move} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--spread", type=float, default=20.0)
    parser.add_argument(
        "--only", default="sqlite,pg-queue,rabbitmq", help="comma-separated paths: sqlite, pg-queue, rabbitmq"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if unknown := only - {"sqlite", "pg-queue", "rabbitmq"}:
        parser.error(f"--only takes sqlite, pg-queue and rabbitmq, not {', '.join(sorted(unknown))}")
    print(
        f"{args.count:,} messages spread over {args.spread:g} s, then {args.count:,} due at once; lateness in ms"
    )
    print("| path | sender | p50 | p99 | max | early | drain (all due at once) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        db = f"sqlite:///{base / 'lateness.db'}"
        if "sqlite" in only:
            run_path("SQLite exactly-once", db, None, "orders", args.count, args.spread, base)
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        pg = f"{POSTGRES}?schema={schema}"
        queue = f"bench_lateness_{uuid.uuid4().hex[:6]}"
        try:
            if "pg-queue" in only:
                run_path("PostgreSQL -> PG queue", pg, None, "orders", args.count, args.spread, base)
            if "rabbitmq" in only:
                run_path("PostgreSQL -> RabbitMQ", pg, RABBITMQ, queue, args.count, args.spread, base)
        finally:
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            subprocess.run(
                [sys.executable, "-c", DELETE_QUEUE, RABBITMQ, queue], check=False, capture_output=True
            )


DELETE_QUEUE = r"""
import asyncio, sys
import aio_pika
async def main():
    conn = await aio_pika.connect(sys.argv[1])
    channel = await conn.channel()
    await channel.queue_delete(sys.argv[2])
    await conn.close()
asyncio.run(main())
"""


if __name__ == "__main__":
    main()
