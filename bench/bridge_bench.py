"""Celery ETA tasks with and without the duetime bridge, in one run, on the local RabbitMQ.

1. Worker memory: a real Celery worker (threads pool) with N tasks pending with a one-hour
   countdown. Plain Celery pulls every ETA task into the worker and keeps it there; with the bridge
   they wait in the store (SQLite) and the worker holds none. RSS of the worker before and after.
2. Lateness: M tasks due over S seconds; each task writes (time it ran - its ETA). Plain Celery's
   worker timer against the bridge (``duetime run --transport celery+amqp://…`` beside the worker).

    .venv/bin/python bench/bridge_bench.py --pending 100000 --tasks 5000 --spread 20
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RABBITMQ = os.environ.get("DUETIME_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
POOL = os.environ.get("DUETIME_BENCH_POOL", "prefork")  # Celery's default pool
#: Seconds the plain worker gets to fetch the pending tasks (it raises its prefetch one ETA task at
#: a time, slowly); what it took by then is "held by the worker".
SETTLE = float(os.environ.get("DUETIME_BENCH_SETTLE", "120"))
#: Celery's ``worker_prefetch_multiplier`` for both workers. Celery's default (4) makes a worker
#: raise its prefetch one ETA task at a time (a few a second here), so 100,000 pending tasks take
#: hours to reach it; 0 (no limit) lets it take them in seconds: where a default worker ends up.
PREFETCH = os.environ.get("DUETIME_BENCH_PREFETCH", "4")

APP = """
import os, time
from datetime import datetime
from celery import Celery

app = Celery("bench", broker=os.environ["B_BROKER"])
app.conf.update(
    task_default_queue=os.environ["B_QUEUE"], task_ignore_result=True,
    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=int(os.environ["B_PREFETCH"]),
)
if os.environ.get("B_STORE"):
    import duetime.bridges.celery
    bridge = duetime.bridges.celery.install(app, store=os.environ["B_STORE"])


@app.task(name="late", bind=True)
def late(self):
    now = time.time()
    eta = datetime.fromisoformat(self.request.eta).timestamp()
    with open(os.environ["B_LOG"], "a") as log:
        log.write(f"{now - eta}\\n")
"""


class Run:
    """One side of the comparison: the app module, its worker and (with the bridge) a dispatcher."""

    def __init__(self, folder: Path, bridge: bool) -> None:
        self.folder = folder
        self.queue = f"bench_{uuid.uuid4().hex[:8]}"
        self.module = f"benchapp_{self.queue}"
        (folder / f"{self.module}.py").write_text(APP)
        self.log = folder / f"{self.queue}.log"
        self.log.touch()
        self.store = f"sqlite:///{folder}/{self.queue}.db" if bridge else ""
        self.env = {
            **os.environ,
            "PYTHONPATH": str(folder),
            "B_BROKER": RABBITMQ,
            "B_QUEUE": self.queue,
            "B_LOG": str(self.log),
            "B_STORE": self.store,
            "B_PREFETCH": PREFETCH,
        }
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        worker = self._spawn(
            sys.executable, "-m", "celery", "-A", self.module, "worker", "-P", POOL, "-c", "2",
            "-Q", self.queue, "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING",
        )  # fmt: skip
        if self.store:
            self._spawn(
                sys.executable,
                "-m",
                "duetime",
                "run",
                "--store",
                self.store,
                "--transport",
                f"celery+{RABBITMQ}",
            )
        time.sleep(3)  # the worker connects and starts consuming
        return worker

    def _spawn(self, *command: str) -> subprocess.Popen[bytes]:
        out = open(self.folder / f"{self.queue}.out", "ab")  # noqa: SIM115  # closed with the process
        process = subprocess.Popen(
            command,
            cwd=self.folder,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def app(self):  # type: ignore[no-untyped-def]
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("B_")})
        sys.path.insert(0, str(self.folder))
        module = __import__(self.module)
        return module

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        from kombu import Connection

        with Connection(RABBITMQ) as conn:
            channel = conn.channel()
            channel.queue_delete(self.queue)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def depth(queue: str) -> int:
    from kombu import Connection

    with Connection(RABBITMQ) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).message_count)


def memory(folder: Path, bridge: bool, pending: int) -> tuple[float, float, float, int]:
    """(worker RSS idle MB, with ``pending`` waiting MB, scheduling rate /s, tasks the worker took
    from the broker and holds)."""
    run = Run(folder, bridge)
    try:
        worker = run.start()
        idle = rss_mb(worker.pid)
        tasks = run.app()
        started = time.perf_counter()
        for _ in range(pending):
            tasks.late.apply_async(countdown=3600)
        rate = pending / (time.perf_counter() - started)
        deadline = time.monotonic() + SETTLE
        while depth(run.queue) and time.monotonic() < deadline:  # plain Celery: the worker fetches them
            time.sleep(1)
        left = depth(run.queue)
        held = pending - left if not bridge else 0
        previous = -1.0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the worker's memory settles
            time.sleep(3)
            now = rss_mb(worker.pid)
            if abs(now - previous) < 1:
                break
            previous = now
        return idle, rss_mb(worker.pid), rate, held
    finally:
        run.stop()


def lateness(folder: Path, bridge: bool, tasks_count: int, spread: float) -> list[float]:
    """Seconds each task ran after its ETA."""
    from datetime import UTC, datetime, timedelta

    run = Run(folder, bridge)
    try:
        run.start()
        tasks = run.app()
        first = datetime.now(UTC) + timedelta(seconds=10)
        for i in range(tasks_count):
            tasks.late.apply_async(eta=first + timedelta(seconds=spread * i / tasks_count))
        deadline = time.monotonic() + 10 + spread + 120
        while time.monotonic() < deadline:
            lines = run.log.read_text().splitlines()
            if len(lines) >= tasks_count:
                break
            time.sleep(0.5)
        return [float(x) for x in run.log.read_text().splitlines()]
    finally:
        run.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--spread", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(
            f"worker memory, {args.pending:,} tasks pending with a one-hour countdown "
            f"({POOL} pool of 2, prefetch multiplier {PREFETCH})"
        )
        print(
            "| | worker RSS idle | with the tasks pending | held by the worker | per held task | apply_async rate |"
        )
        print("|---|---|---|---|---|---|")
        for name, bridge in (("plain Celery ETA", False), ("duetime bridge", True)):
            idle, full, rate, held = memory(folder, bridge, args.pending)
            per = f"{(full - idle) * 1024 * 1024 / held:,.0f} B" if held else "-"
            print(
                f"| {name} | {idle:.0f} MB | {full:.0f} MB | {held:,} | {per} | {rate:,.0f} /s |", flush=True
            )
        print(f"\nlateness, {args.tasks:,} tasks due over {args.spread:g} s (ran - ETA)")
        print("| | ran | p50 | p99 | max | early |")
        print("|---|---|---|---|---|---|")
        for name, bridge in (("plain Celery ETA", False), ("duetime bridge", True)):
            late = lateness(folder, bridge, args.tasks, args.spread)
            early = sum(1 for x in late if x < 0)
            if not late:
                print(f"| {name} | 0 | - | - | - | - |")
                continue
            print(
                f"| {name} | {len(late):,} | {statistics.median(late) * 1000:.1f} ms | "
                f"{pct(late, 0.99) * 1000:.1f} ms | {max(late) * 1000:.1f} ms | {early} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
