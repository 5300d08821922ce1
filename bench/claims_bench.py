"""PostgreSQL at-least-once: lock claims against lease claims, beside the raw loop, in one run.

    .venv/bin/python bench/claims_bench.py [--messages 20000] [--batch 100] [--rounds 2]

Three loops over the same due rows, each into the PostgreSQL queue:
- raw: ``DELETE … FOR UPDATE SKIP LOCKED RETURNING`` and the enqueue in one transaction (the limit);
- SQL only, as each claim kind writes: a lease (UPDATE the lease, enqueue, DELETE) against a lock
  (SELECT … FOR UPDATE SKIP LOCKED in an open transaction, enqueue, DELETE, COMMIT);
- the duetime dispatcher with ``?claims=lease`` and with the default ``claims=lock``.
Prints msg/s and each ratio to the raw loop of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import postgres_bench as pb

from duetime import DelayedDeliverySettings, Dispatcher, TransactionMode
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore

ENQUEUE = f'INSERT INTO "{pb.SCHEMA}".duetime_queue_messages (queue, message_id, headers, body) VALUES (%s, %s, %s, %s)'
PICK = (
    f"SELECT message_id FROM {pb.TABLE} WHERE due_at <= now() AND (claim_token IS NULL OR claimed_until <= now()) "
    "ORDER BY due_at, message_id LIMIT %s FOR UPDATE SKIP LOCKED"
)


def enqueue(conn: psycopg.Connection, rows: list[tuple[object, ...]]) -> None:
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(ENQUEUE, [(pb.QUEUE, r[0], r[1], r[2]) for r in rows])


def sql_lease(batch: int) -> None:
    with psycopg.connect(pb.BASE, autocommit=True) as c, psycopg.connect(pb.BASE, autocommit=True) as q:
        while True:
            token = uuid.uuid4()
            rows = c.execute(
                f"UPDATE {pb.TABLE} AS t SET claim_token=%s, claimed_until=now() + interval '30 s' "
                f"FROM ({PICK}) c WHERE t.message_id = c.message_id RETURNING t.message_id, t.headers::text, t.body",
                (token, batch),
            ).fetchall()
            if not rows:
                return
            enqueue(q, rows)
            c.execute(f"DELETE FROM {pb.TABLE} WHERE message_id = ANY(%s)", ([r[0] for r in rows],))


def sql_lock(batch: int) -> None:
    with psycopg.connect(pb.BASE) as c, psycopg.connect(pb.BASE, autocommit=True) as q:
        while True:
            rows = c.execute(
                f"SELECT message_id, headers::text, body FROM {pb.TABLE} WHERE message_id IN ({PICK}) FOR UPDATE",
                (batch,),
            ).fetchall()
            if not rows:
                c.commit()
                return
            enqueue(q, rows)
            c.execute(f"DELETE FROM {pb.TABLE} WHERE message_id = ANY(%s)", ([r[0] for r in rows],))
            c.commit()


async def dispatcher(extra: str, batch: int) -> None:
    store = PostgresStore.from_url(pb.URL + extra)
    transport = PostgresQueueTransport.from_url(pb.URL)
    settings = DelayedDeliverySettings(transaction_mode=TransactionMode.AT_LEAST_ONCE, batch_size=batch)
    await Dispatcher(store, transport, settings, endpoint=pb.ENDPOINT).run_burst()
    await store.close()
    await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n, batch = args.messages, args.batch
    due = pb.messages(n, datetime.now(UTC) - timedelta(hours=1), prefix="c")
    loops: dict[str, Callable[[], object]] = {
        "raw take-enqueue-delete": lambda: pb.raw_claim_move(batch),
        "SQL only, lease": lambda: sql_lease(batch),
        "SQL only, lock": lambda: sql_lock(batch),
        "dispatcher, claims=lease": lambda: asyncio.run(dispatcher("&claims=lease", batch)),
        "dispatcher, claims=lock": lambda: asyncio.run(dispatcher("", batch)),
    }
    ratios: dict[str, list[float]] = {name: [] for name in loops}
    print(f"PostgreSQL at-least-once, {n:,} due, batches of {batch}, {args.rounds} rounds")
    for round_ in range(args.rounds):
        raw = 0.0
        for name, run in loops.items():
            pb.reset()
            pb.raw_copy(due, 50_000)
            started = time.perf_counter()
            run()
            rate = n / (time.perf_counter() - started)
            raw = raw or rate
            ratios[name].append(rate / raw)
            print(f"  round {round_ + 1}  {name:<26} {rate:10,.0f} msg/s   ratio {rate / raw:.2f}")
    print("median ratio to the raw loop:")
    for name, values in ratios.items():
        print(f"  {name:<26} {statistics.median(values):.2f}")


if __name__ == "__main__":
    main()
