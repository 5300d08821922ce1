"""What an idle deployment costs: `duetime run` (dispatcher, schedule planner, front door, heartbeat) and a consumer
waiting on its queue, with nothing to deliver, as a share of one core.

    .venv/bin/python bench/idle_bench.py             # 30 s per store
    .venv/bin/python bench/idle_bench.py --seconds 10

Per store (PostgreSQL store into its queue tables; SQLite file into its own), it starts both
processes, lets them settle for 5 s, then reads their CPU time from /proc over ``--seconds``; for
PostgreSQL also the server processes' CPU over the same window (the database's share of the
waiting). The baseline, measured in the same run, is a process that only sleeps. Target: < 1 %
of a core per process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TICKS = os.sysconf("SC_CLK_TCK")
CONSUMER = """
import sys
from duetime.backends.{module} import {cls}
queue = {cls}.from_url(sys.argv[1])
queue.declare("orders")
while True:
    queue.acknowledge(queue.receive("orders", 100, wait=5.0))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def total(pids: list[int]) -> float:
    seconds = 0.0
    for pid in pids:
        try:
            seconds += cpu_seconds(pid)
        except OSError:
            continue
    return seconds


def measure(url: str, module: str, cls: str, seconds: float, server: bool) -> dict[str, float]:
    subprocess.run(
        [sys.executable, "-m", "duetime", "setup", "--store", url, "--endpoint", "idle"], check=True
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "duetime", "run", "--front-door", "--store", url, "--endpoint", "idle"],
        stderr=subprocess.DEVNULL,
    )
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER.format(module=module, cls=cls), url])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        time.sleep(5)
        procs = {"duetime run": run.pid, "consumer": consumer.pid, "sleeping process (baseline)": sleeper.pid}
        before = {name: cpu_seconds(pid) for name, pid in procs.items()}
        pg_before = total(postgres_pids()) if server else 0.0
        time.sleep(seconds)
        shares = {name: (cpu_seconds(pid) - before[name]) / seconds * 100 for name, pid in procs.items()}
        if server:
            shares["PostgreSQL server (all its processes)"] = (
                (total(postgres_pids()) - pg_before) / seconds * 100
            )
        return shares
    finally:
        for process in (run, consumer, sleeper):
            process.terminate()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    print(f"CPU as % of one core over {args.seconds:g} s, nothing to deliver")
    print("| store | process | CPU |")
    print("|---|---|---|")
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        found = measure(f"{POSTGRES}?schema={schema}", "postgres", "SyncPostgresQueue", args.seconds, True)
        for name, share in found.items():
            print(f"| PostgreSQL | {name} | {share:.2f} % |")
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    with tempfile.TemporaryDirectory() as folder:
        found = measure(f"sqlite:///{folder}/idle.db", "sqlite", "SyncSqliteQueue", args.seconds, False)
        for name, share in found.items():
            print(f"| SQLite | {name} | {share:.2f} % |")


if __name__ == "__main__":
    main()
