"""Recurring schedules beside Celery beat and APScheduler 3, in one run: what each does with its
ticks when its one process is killed, and when two processes run (one of them killed).

    .venv/bin/python bench/recurring_peers_bench.py                  # 1,000 schedules every 5 s, 60 s
    .venv/bin/python bench/recurring_peers_bench.py --schedules 200 --seconds 30

Each system keeps the same schedules (``--schedules``, each ticking every ``--every`` seconds) the
way its documentation says: Celery beat with its shelve file, publishing to RabbitMQ; APScheduler 3
with a ``SQLAlchemyJobStore`` on PostgreSQL, defaults unchanged; duetime with schedules in its
PostgreSQL store, ticks delivered exactly once into the PostgreSQL queue. Two scenarios each:

- **one process**, ``kill -9``-ed a quarter into the window and started again 20 s later;
- **two processes** from the start (as one would for high availability), the first ``kill -9``-ed
  and started again the same way.

Ticks are counted over the window (``--seconds``, after 10 s to settle). Neither peer says which
planned time a tick was for, so for them a tick is found missing from the gaps between one
schedule's arrivals (a gap of k intervals means k-1 missed) and doubled from two arrivals closer
than half an interval. duetime's ticks carry their planned time, so they are counted exactly by
id: a planned time in the window that never arrived is missed; an id that arrived twice is doubled.
CPU is the scheduler processes' (not the broker's or the database's).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import kombu
import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import itertools

import duetime
from bench.recurring_bench import cpu_seconds, pct
from duetime.backends.postgres import SyncPostgresQueue, SyncPostgresStore
from duetime.recurring import PLANNED_HEADER, SCHEDULE_HEADER, every

BASE = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
AMQP = os.environ.get("DUETIME_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
SCHEMA = "duetime_peers_bench"
URL = f"{BASE}?schema={SCHEMA}"
ENDPOINT = "bench"
QUEUE = "bench.peers"
BEAT_QUEUE = "duetime-bench-beat"
APS_TABLE = "duetime_bench_apscheduler_jobs"
ROOT = Path(__file__).resolve().parent.parent
SETTLE = 10.0
DOWN = 20.0

#: (schedule id, arrival as unix time, planned unix time or None, message id or None)
Tick = tuple[str, float, float | None, str | None]


class System:
    name = ""

    def __init__(self, schedules: int, every_s: int, work: Path) -> None:
        self.schedules, self.every, self.work = schedules, every_s, work
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PEER_SCHEDULES": str(schedules),
            "PEER_EVERY": str(every_s),
            "PEER_AMQP": AMQP,
            "PEER_QUEUE": BEAT_QUEUE,
            "PEER_TABLE": APS_TABLE,
            "PEER_SQLALCHEMY": BASE.replace("postgresql://", "postgresql+psycopg://", 1),
            "PEER_TICKS": str(work / "ticks"),
        }

    def prepare(self) -> None: ...

    def start(self, n: int) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def ticks(self) -> list[Tick]:
        raise NotImplementedError

    def finish(self) -> None: ...

    def spawn(self, argv: list[str], n: int) -> subprocess.Popen[bytes]:
        log = open(self.work / f"process{n}.log", "ab")  # noqa: SIM115 - the child keeps it
        return subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=log, stderr=log)


class Consuming(System):
    """A system whose ticks arrive as messages a thread of the bench consumes."""

    def listen(self) -> None:
        self.seen: list[Tick] = []
        self.halt = threading.Event()
        self.consumer = threading.Thread(target=self._consume, daemon=True)
        self.consumer.start()

    def _consume(self) -> None:
        raise NotImplementedError

    def ticks(self) -> list[Tick]:
        time.sleep(2)  # what was sent last is received
        self.halt.set()
        self.consumer.join(10)
        return self.seen


class CeleryBeat(Consuming):
    name = "Celery beat"

    def prepare(self) -> None:
        with kombu.Connection(AMQP) as conn:
            conn.SimpleQueue(BEAT_QUEUE).clear()
        self.listen()

    def _consume(self) -> None:
        with kombu.Connection(AMQP) as conn:
            queue = conn.SimpleQueue(BEAT_QUEUE)
            while not self.halt.is_set():
                try:
                    message = queue.get(timeout=0.5)
                except queue.Empty:
                    continue
                args = message.decode()[0]
                self.seen.append((f"s{args[0]}", time.time(), None, None))
                message.ack()

    def start(self, n: int) -> subprocess.Popen[bytes]:
        # its own schedule file per process, as on two hosts; a restart finds its own again
        schedule = str(self.work / f"celerybeat-{n}")
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.peer_schedulers",
            "beat",
            "-s",
            schedule,
            "-l",
            "WARNING",
        ]
        return self.spawn(argv, n)

    def finish(self) -> None:
        with kombu.Connection(AMQP) as conn:
            conn.SimpleQueue(BEAT_QUEUE).queue.delete()


class APScheduler(System):
    name = "APScheduler 3"

    def prepare(self) -> None:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {APS_TABLE}")
        subprocess.run(
            [sys.executable, "-m", "bench.peer_schedulers", "add-jobs"], env=self.env, cwd=ROOT, check=True
        )

    def start(self, n: int) -> subprocess.Popen[bytes]:
        return self.spawn([sys.executable, "-m", "bench.peer_schedulers", "apscheduler"], n)

    def ticks(self) -> list[Tick]:
        path = Path(self.env["PEER_TICKS"])
        lines = path.read_text().split("\n") if path.exists() else []
        return [(s, float(t), None, None) for s, t in (line.split() for line in lines if line)]

    def finish(self) -> None:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {APS_TABLE}")


class Duetime(Consuming):
    name = "duetime"

    def prepare(self) -> None:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
        store = SyncPostgresStore.from_url(URL)
        store.setup_infrastructure(ENDPOINT)
        store.close()
        with SyncPostgresQueue.from_url(URL) as q:
            q.declare(QUEUE)
        with duetime.connect_sync(URL, endpoint=ENDPOINT) as client:
            for i in range(self.schedules):
                client.add_recurring(f"s{i}", QUEUE, b"tick", when=every(f"{self.every}s"))
        self.listen()

    def _consume(self) -> None:
        with SyncPostgresQueue.from_url(URL) as q:
            while not self.halt.is_set():
                got = q.receive(QUEUE, 1000, wait=0.2)
                now = time.time()
                for m in got:
                    planned = datetime.fromisoformat(m.headers[PLANNED_HEADER]).timestamp()
                    self.seen.append((m.headers[SCHEDULE_HEADER], now, planned, m.message_id))
                if got:
                    q.acknowledge(got)

    def start(self, n: int) -> subprocess.Popen[bytes]:
        return self.spawn([sys.executable, "-m", "duetime", "run", "--store", URL, "--endpoint", ENDPOINT], n)

    def finish(self) -> None:
        with psycopg.connect(BASE, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


@dataclass
class Outcome:
    delivered: int
    expected: int
    missed: int
    doubled: int
    cpu: float
    late_p99: float | None = None
    late_max: float | None = None


def from_gaps(
    ticks: list[Tick], window: tuple[float, float], every_s: int, schedules: int
) -> tuple[int, int]:
    """Missed and doubled ticks read from the gaps between each schedule's arrivals."""
    times: dict[str, list[float]] = defaultdict(list)
    for sid, arrived, _, _ in ticks:
        if window[0] <= arrived < window[1]:
            times[sid].append(arrived)
    missed = doubled = 0
    for i in range(schedules):
        arrivals = sorted(times.get(f"s{i}", []))
        points = [window[0], *arrivals, window[1]]
        for a, b in itertools.pairwise(points):
            if b - a > 1.5 * every_s:
                missed += round((b - a) / every_s) - 1
        doubled += sum(1 for a, b in itertools.pairwise(arrivals) if b - a < 0.5 * every_s)
    return missed, doubled


def exactly(ticks: list[Tick], window: tuple[float, float], every_s: int, schedules: int) -> tuple[int, int]:
    """Missed and doubled ticks by planned time and id (duetime's ticks say both)."""
    first = int(window[0] // every_s + 1) * every_s
    planned = range(first, int(window[1]) - every_s, every_s)  # the last interval may still be in flight
    got: dict[str, set[float]] = defaultdict(set)
    ids: list[str] = []
    for sid, _, at, mid in ticks:
        assert at is not None and mid is not None
        got[sid].add(at)
        ids.append(mid)
    missed = sum(1 for i in range(schedules) for t in planned if float(t) not in got[f"s{i}"])
    return missed, len(ids) - len(set(ids))


def scenario(system: System, processes: int, seconds: float) -> Outcome:
    system.prepare()
    procs = [system.start(n) for n in range(processes)]
    window = (time.time() + SETTLE, time.time() + SETTLE + seconds)
    cpu = 0.0
    try:
        time.sleep(window[0] + seconds / 4 - time.time())
        cpu += cpu_seconds(procs[0].pid)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        time.sleep(DOWN)
        procs[0] = system.start(0)
        time.sleep(max(0.0, window[1] + 1 - time.time()))
        cpu += sum(cpu_seconds(p.pid) for p in procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    ticks = system.ticks()
    system.finish()
    counted = [t for t in ticks if window[0] <= t[1] < window[1]]
    if isinstance(system, Duetime):
        missed, doubled = exactly(
            [t for t in ticks if t[2] is not None and window[0] <= t[2] < window[1]],
            window,
            system.every,
            system.schedules,
        )
        lates = [arrived - planned for _, arrived, planned, _ in counted if planned is not None]
        return Outcome(
            len(counted),
            int(system.schedules * seconds / system.every),
            missed,
            doubled,
            cpu,
            pct(lates, 99) * 1000 if lates else None,
            max(lates) * 1000 if lates else None,
        )
    missed, doubled = from_gaps(ticks, window, system.every, system.schedules)
    return Outcome(len(counted), int(system.schedules * seconds / system.every), missed, doubled, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--every", type=int, default=5, help="seconds between ticks (whole seconds)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the window ticks are counted in")
    args = parser.parse_args()
    kinds: list[Callable[[int, int, Path], System]] = [CeleryBeat, APScheduler, Duetime]
    print(
        f"{args.schedules:,} schedules every {args.every} s, counted over {args.seconds:.0f} s; "
        f"the first process kill -9-ed {args.seconds / 4:.0f} s in and started {DOWN:.0f} s later\n"
    )
    print(
        f"{'system':14} {'processes':10} {'delivered':>9} {'expected':>9} {'missed':>7} {'doubled':>8} {'CPU s':>6}  lateness"
    )
    for kind in kinds:
        for processes in (1, 2):
            with tempfile.TemporaryDirectory() as work:
                system = kind(args.schedules, args.every, Path(work))
                out = scenario(system, processes, args.seconds)
            late = (
                f"p99 {out.late_p99:.0f} ms, max {out.late_max:.0f} ms"
                if out.late_p99 is not None
                else "(not known)"
            )
            print(
                f"{system.name:14} {processes:<10} {out.delivered:>9,} {out.expected:>9,} {out.missed:>7,} "
                f"{out.doubled:>8,} {out.cpu:>6.1f}  {late}",
                flush=True,
            )
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


if __name__ == "__main__":
    main()
