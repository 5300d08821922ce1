"""Recurring schedules on PostgreSQL: the ticks of many schedules beside plain delayed messages
due at the same kind of moment, through one real `duetime run`, in the same run.

    .venv/bin/python bench/recurring_bench.py                          # 20,000 schedules, 6 minutes
    .venv/bin/python bench/recurring_bench.py --schedules 100000 --minutes 10
    .venv/bin/python bench/recurring_bench.py --schedules 100000 --minutes 5 --cron '* * * * *'

The schedules tick every two minutes, at even minutes ("*/2 * * * *"); as many plain messages
are stored for each odd minute (the baseline: what the store does for one-off messages). One
dispatcher (exactly-once into the PostgreSQL queue) delivers both; a consumer receives them and
measures each one's lateness (arrival minus planned or due time). Prints, per kind: lateness
p50/p99/max and how long each minute's burst took to drain, and the ratio of ticks to plain; the
store's bytes per schedule; the dispatcher's memory at the start and the end, and its CPU; how
far planning fell behind (the dispatcher's ``duetime_recurring_planning_behind_seconds``, read
every 2 s), the ticks it counted missed, and its warnings.
Schedules are written into their table with COPY (``add_schedule`` one at a time is for people).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from duetime import DelayedMessage, TransactionMode
from duetime.backends.postgres import SyncPostgresQueue, SyncPostgresStore
from duetime.recurring import cron
from duetime.recurring.schedule import PLANNED_HEADER, new_schedule

BASE = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "duetime_recurring_bench"
URL = f"{BASE}?schema={SCHEMA}"
ENDPOINT = "bench"
QUEUE = "bench.ticks"
ROOT = Path(__file__).resolve().parent.parent


def reset() -> None:
    with psycopg.connect(BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    store = SyncPostgresStore.from_url(URL)
    store.setup_infrastructure(ENDPOINT)
    store.close()
    with SyncPostgresQueue.from_url(URL) as q:
        q.declare(QUEUE)


def fill(schedules: int, minutes: int, start: datetime, expression: str) -> None:
    """The schedules by COPY (planned from ``start``), and the plain messages by COPY."""
    when = cron(expression)
    rows = [new_schedule(f"s{i:06d}", QUEUE, when, start, body=b"tick").row() for i in range(schedules)]
    columns = "endpoint, schedule_id, definition, planned_until, version"
    copy_in = f'COPY "{SCHEMA}".duetime_schedules ({columns}) FROM STDIN'
    with psycopg.connect(BASE) as conn, conn.cursor() as cur, cur.copy(copy_in) as copy:
        for r in rows:
            copy.write_row((ENDPOINT, r.schedule_id, r.text, r.planned_until, 0))
    store = SyncPostgresStore.from_url(URL)
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    minute = start.replace(second=0, microsecond=0)
    odd = [
        minute + timedelta(minutes=k)
        for k in range(1, minutes + 2)
        if (minute + timedelta(minutes=k)).minute % 2
    ]
    for at in odd:
        batch = [DelayedMessage(f"p{at:%H%M}-{i:06d}", QUEUE, at, b"plain") for i in range(schedules)]
        for i in range(0, len(batch), 10_000):
            store.store_many(batch[i : i + 10_000])
    store.close()


class Consumer(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()
        #: (kind, planned or due minute, lateness in seconds, arrival)
        self.seen: list[tuple[str, datetime, float, float]] = []
        self.ids: list[str] = []

    def run(self) -> None:
        with SyncPostgresQueue.from_url(URL) as q:
            while not self.halt.is_set():
                got = q.receive(QUEUE, 1000, wait=0.2)
                now = datetime.now(UTC)
                for m in got:
                    planned = m.headers.get(PLANNED_HEADER) or m.headers["duetime-due-at"]
                    at = datetime.fromisoformat(planned)
                    kind = "tick" if PLANNED_HEADER in m.headers else "plain"
                    self.seen.append((kind, at, (now - at).total_seconds(), time.monotonic()))
                    self.ids.append(m.message_id)
                if got:
                    q.acknowledge(got)


def metric(port: int, name: str) -> float:
    """One series of the dispatcher's metrics (0 if it cannot be read)."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--minutes", type=int, default=6)
    parser.add_argument("--cron", default="*/2 * * * *", help="When the schedules tick.")
    args = parser.parse_args()
    reset()
    start = datetime.now(UTC)
    t0 = time.perf_counter()
    fill(args.schedules, args.minutes, start, args.cron)
    print(
        f"filled {args.schedules:,} schedules and {args.schedules:,} plain messages a minute in {time.perf_counter() - t0:.1f} s"
    )
    consumer = Consumer()
    consumer.start()
    log = Path(f"/tmp/duetime-recurring-bench-{os.getpid()}.log")
    port = 19_000 + os.getpid() % 1000
    with log.open("w") as said:  # (a pipe nobody reads would stop the dispatcher once full)
        run = subprocess.Popen(
            [
                sys.executable,
                *("-m", "duetime", "run", "--store", URL, "--endpoint", ENDPOINT),
                "--metrics-port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=said,
            text=True,
            cwd=ROOT,
        )
    time.sleep(5)
    memory = [rss_kb(run.pid)]
    behind: list[float] = []
    cpu_start = cpu_seconds(run.pid)
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        for _ in range(5):
            time.sleep(2)
            behind.append(metric(port, "duetime_recurring_planning_behind_seconds"))
        memory.append(rss_kb(run.pid))
    missed = metric(port, "duetime_recurring_ticks_missed_total")
    cpu = cpu_seconds(run.pid) - cpu_start
    time.sleep(5)
    run.terminate()
    run.wait(60)
    consumer.halt.set()
    consumer.join(10)
    with psycopg.connect(BASE) as conn:
        schedule_bytes = conn.execute(
            f"SELECT pg_total_relation_size('\"{SCHEMA}\".duetime_schedules')"
        ).fetchone()[0]
    by: dict[tuple[str, datetime], list[tuple[float, float]]] = defaultdict(list)
    for kind, at, late, arrived in consumer.seen:
        by[(kind, at.replace(second=0, microsecond=0))].append((late, arrived))
    print(f"\n{'kind':6} {'minute':6} {'count':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'drain s':>8}")
    summary: dict[str, list[float]] = defaultdict(list)
    drains: dict[str, list[float]] = defaultdict(list)
    for (kind, minute), items in sorted(by.items(), key=lambda kv: kv[0][1]):
        lates = [late * 1000 for late, _ in items]
        arrivals = [a for _, a in items]
        drain = max(arrivals) - min(arrivals)
        print(
            f"{kind:6} {minute:%H:%M}  {len(items):>8,} {pct(lates, 50):>8.0f} {pct(lates, 99):>8.0f} "
            f"{max(lates):>8.0f} {drain:>8.2f}"
        )
        if len(items) >= args.schedules * 0.99:  # whole bursts only
            summary[kind] += lates
            drains[kind].append(drain)
    print()
    for kind in ("tick", "plain"):
        if summary[kind]:
            lates = summary[kind]
            print(
                f"{kind:6} all whole minutes: p50 {pct(lates, 50):.0f} ms, p99 {pct(lates, 99):.0f} ms, "
                f"drain {statistics.mean(drains[kind]):.2f} s"
            )
    if summary["tick"] and summary["plain"]:
        print(
            f"ratio tick/plain: p99 {pct(summary['tick'], 99) / pct(summary['plain'], 99):.2f}x, "
            f"drain {statistics.mean(drains['tick']) / statistics.mean(drains['plain']):.2f}x"
        )
    ticks = sum(1 for kind, *_ in consumer.seen if kind == "tick")
    doubled = len(consumer.ids) - len(set(consumer.ids))
    print(
        f"ticks delivered {ticks:,}, messages delivered twice {doubled}; store: {schedule_bytes / args.schedules:.0f} bytes a schedule (its row and index)"
    )
    print(
        f"dispatcher memory: {memory[0] / 1024:.0f} MB at the start, {memory[-1] / 1024:.0f} MB at the end, {max(memory) / 1024:.0f} MB at most"
    )
    print(
        f"dispatcher CPU: {cpu:.1f} s over {args.minutes} min ({cpu / (args.minutes * 60) * 100:.0f}% of a core)"
    )
    warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
    print(
        f"planning behind: {max(behind, default=0):.1f} s at most, {statistics.median(behind) if behind else 0:.1f} s "
        f"median (read every 2 s); ticks counted missed {missed:,.0f}; warnings {len(warnings):,} "
        f"({sum('missed while no dispatcher ran' in w for w in warnings):,} of them about missed ticks)"
    )


if __name__ == "__main__":
    main()
