"""A full store against an empty one, in one run: does holding millions of messages cost the due
ones anything, and does every screen still answer in a second?

    .venv/bin/python bench/volume_bench.py                           # PostgreSQL, 10,000,000 waiting
    .venv/bin/python bench/volume_bench.py --kind sqlite --rows 1000000
    .venv/bin/python bench/volume_bench.py --kind mariadb --rows 1000000   # delivering to RabbitMQ
    .venv/bin/python bench/volume_bench.py --kind redis --rows 1000000     # delivering to a Redis stream

Two stores of the same kind: one empty, one filled with ``--rows`` messages due over the next 30
days (200 destinations, bodies of 200 bytes to 4 KB of JSON-like text of random words, three
headers, one group of 100,000), written by ``store_many`` in batches of 20,000 (COPY on PostgreSQL). On
each:

1. the due stream: ``--stream`` messages due evenly over 20 s (1,000 a second), delivered by one
   ``duetime run`` (exactly-once into the store's own queue on PostgreSQL and SQLite), lateness at
   the consumer p50/p99 and the drain rate; the scheduling rate, one call a message and batched.
   Measured after the fill, once the server is quiet again (PostgreSQL: the table vacuumed and a
   checkpoint taken; MariaDB: InnoDB's purge caught up; everything written synced to disk), on
   the two stores in turn, ``--rounds`` times each; each figure is the median of its rounds. In
   turn, because this machine's disk stalls now and then (one fsync in several thousand waits
   a tenth of a second or more): one stall in a 20 s stream makes its p99, and measuring one
   store before the other handed such stalls to one side only;
2. the screens (the empty store's before the fill), each a fresh command as an operator types
   it (Python's start-up included; its floor is ``duetime --version``): ``stats``,
   ``stats --json``, ``list`` (first page, and a page 25 days in), ``list --all --json`` (time to
   its first line, and its memory after 20 s), ``show``, ``cancel --group`` of 100,000,
   ``setup`` (nothing to do), a ``/metrics`` scrape, and the dashboard's pages;
3. the bytes on disk per message against its body and headers (on Redis: bytes of memory).

``--storage`` measures only the last, on a full store: fill, settle, and the bytes a message;
then (SQL stores) ``duetime setup`` building the group's index again while a writer
stores a message every 10 ms, the set-up's time and the writes' waits.

Prints one table: each figure on the empty store, on the full one, and the ratio.

``--bulk`` (PostgreSQL) measures instead the bulk jobs on the full store: ``bulk export`` to
Parquet beside one process streaming the table into Parquet (a server-side cursor and pyarrow),
and ``bulk report`` beside one process asking the server for the same backlog figures (by
destination, by day, failing, the largest).

    .venv/bin/python bench/volume_bench.py --bulk                    # 10,000,000 (about 25 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from bench.recurring_bench import pct, rss_kb
from duetime import DelayedMessage, TransactionMode
from duetime.interfaces import ListQuery

POSTGRES = os.environ.get("DUETIME_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
MARIADB = os.environ.get("DUETIME_BENCH_MARIADB", "mysql://root@127.0.0.1:3306")
REDIS = os.environ.get("DUETIME_BENCH_REDIS", "redis://127.0.0.1:6379/0")
AMQP = os.environ.get("DUETIME_BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
ENDPOINT = "vol"
QUEUE = "vol.stream"
GROUP = "vol-group"
GROUP_SIZE = 100_000
DESTINATIONS = 200
PASSWORD = "bench"
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Place:
    """One store of the kind measured, and where its due messages go."""

    store: str
    transport: str | None
    drop: Callable[[], None]


@contextlib.contextmanager
def place(kind: str, work: Path, label: str) -> Iterator[Place]:
    tag = f"{label}_{uuid.uuid4().hex[:6]}"
    if kind == "postgresql":
        import psycopg

        def drop_pg() -> None:
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "vol_{tag}" CASCADE')

        p = Place(f"{POSTGRES}?schema=vol_{tag}", None, drop_pg)
    elif kind == "sqlite":
        p = Place(f"sqlite:///{work / f'{tag}.db'}", None, lambda: None)
    elif kind == "mariadb":
        import pymysql

        def mariadb(sql: str) -> None:
            conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
            try:
                conn.cursor().execute(sql)
            finally:
                conn.close()

        mariadb(f"CREATE DATABASE vol_{tag}")
        p = Place(f"{MARIADB}/vol_{tag}", AMQP, lambda: mariadb(f"DROP DATABASE IF EXISTS vol_{tag}"))
    elif kind == "redis":
        import redis

        prefix = f"duetime-vol-{tag}:"

        def drop_redis() -> None:
            r = redis.Redis.from_url(REDIS)
            for key in r.scan_iter(f"{prefix}*", count=10_000):
                r.unlink(key)

        p = Place(f"{REDIS}?prefix={prefix}", f"{REDIS}?prefix={prefix}q:", drop_redis)
    else:
        raise SystemExit(f"--kind {kind!r}: postgresql, sqlite, mariadb or redis")
    try:
        yield p
    finally:
        p.drop()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duetime", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )


def timed(action: Callable[[], Any], times: int = 3) -> float:
    """Median seconds of ``times`` runs."""
    took = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def checked(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        raise SystemExit(f"{done.args}: exit {done.returncode}: {done.stderr[-2000:]}")
    return done


_WORDS = [
    "order",
    "line",
    "item",
    "price",
    "quantity",
    "customer",
    "address",
    "street",
    "city",
    "note",
    "total",
    "tax",
    "paid",
    "due",
    "ship",
]


def _body(i: int) -> bytes:
    """JSON-like text of random words, 200 bytes to 4 KB (it compresses as real payloads do)."""
    pick = random.Random(i)
    words = " ".join(pick.choice(_WORDS) + str(pick.randrange(1000)) for _ in range(pick.randint(20, 430)))
    return json.dumps({"order": i, "customer": f"{pick.getrandbits(64):016x}", "note": words}).encode()[:4096]


_BODIES = [_body(i) for i in range(997)]


def fill(p: Place, rows: int, now: datetime) -> float:
    """``rows`` messages due over the next 30 days; seconds it took."""
    started = time.perf_counter()
    with duetime.open_sync_store(p.store) as store:
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        step = 20_000
        for start in range(0, rows, step):
            batch = []
            for i in range(start, min(start + step, rows)):
                due = now + timedelta(hours=1) + timedelta(days=29) * ((i * 7_919) % rows) / rows
                batch.append(
                    DelayedMessage(
                        f"v{i:09d}",
                        f"dest-{i % DESTINATIONS:03d}",
                        due,
                        _BODIES[i % len(_BODIES)],
                        {"content-type": "application/json", "trace": f"{i:016x}", "tenant": f"t{i % 50}"},
                        group=GROUP if i < GROUP_SIZE else None,
                    )
                )
            store.store_many(batch)
            if start // step % 50 == 0:
                print(f"  filled {start + len(batch):,} of {rows:,}", flush=True)
    return time.perf_counter() - started


class Consumer(threading.Thread):
    def __init__(self, p: Place) -> None:
        super().__init__(daemon=True)
        self.place, self.halt = p, threading.Event()
        self.lates: list[float] = []
        self.arrivals: list[float] = []

    def run(self) -> None:
        url = self.place.transport or self.place.store
        loop = asyncio.new_event_loop()
        t: Any = duetime.open_transport(url)
        loop.run_until_complete(t.start())
        try:
            while not self.halt.is_set():
                got = loop.run_until_complete(t.receive(QUEUE, 1000, 0.2))
                now = datetime.now(UTC)
                for m in got:
                    due = datetime.fromisoformat(m.headers["duetime-due-at"])
                    self.lates.append((now - due).total_seconds() * 1000)
                    self.arrivals.append(time.monotonic())
                if got:
                    loop.run_until_complete(t.acknowledge(list(got)))
        finally:
            loop.run_until_complete(t.close())


def due_stream(p: Place, count: int, metrics_port: int, work: Path) -> dict[str, float]:
    """``count`` messages due over 20 s through one `duetime run`; lateness, drain rate, scrape."""
    extra = ["--transport", p.transport] if p.transport else []
    checked(cli("setup", "--store", p.store, "--endpoint", ENDPOINT, "--queue", QUEUE, *extra))
    log = open(work / f"run-{metrics_port}.log", "wb")  # noqa: SIM115 - the child keeps it
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "run",
            "--store",
            p.store,
            "--endpoint",
            ENDPOINT,
            *extra,
            "--metrics-port",
            str(metrics_port),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    consumer = Consumer(p)
    try:
        for _ in range(150):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
                break
            time.sleep(0.2)
        consumer.start()
        first = datetime.now(UTC) + timedelta(seconds=5)
        one_by_one = 2_000
        with duetime.connect_sync(p.store, endpoint=ENDPOINT) as client:
            started = time.perf_counter()
            for i in range(one_by_one):
                client.schedule(
                    QUEUE, b"s", due_at=first + timedelta(seconds=20) * i / count, message_id=f"s{i}"
                )
            single = one_by_one / (time.perf_counter() - started)
            rest = [
                DelayedMessage(f"s{i}", QUEUE, first + timedelta(seconds=20) * i / count, b"s")
                for i in range(one_by_one, count)
            ]
            started = time.perf_counter()
            for k in range(0, len(rest), 5_000):
                client.schedule_many(rest[k : k + 5_000])
            batched = len(rest) / (time.perf_counter() - started)
        scrape = timed(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read()
        )
        deadline = time.monotonic() + 120
        while len(consumer.lates) < count and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        consumer.halt.set()
        consumer.join(10)
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    if len(consumer.lates) < count:
        raise SystemExit(f"only {len(consumer.lates)} of {count} arrived; see {log.name}")
    span = max(consumer.arrivals) - min(consumer.arrivals)
    return {
        "scheduling, one call a message (messages/s)": single,
        "scheduling, batched (messages/s)": batched,
        "due stream: lateness p50 (ms)": pct(consumer.lates, 50),
        "due stream: lateness p99 (ms)": pct(consumer.lates, 99),
        "due stream: drain rate (messages/s)": count / span if span else float("nan"),
        "/metrics scrape (s)": scrape,
    }


P99 = "due stream: lateness p99 (ms)"


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def settle(kind: str, p: Place) -> float:
    """Wait until what the fill set going is done, so that it weighs on neither store; seconds.

    Everything written goes to disk (a flush of gigabytes could otherwise land in a commit's
    fsync); on PostgreSQL the table is vacuumed (autovacuum would do it, for minutes, during the
    measurements) and a checkpoint writes the server's dirty pages; on MariaDB InnoDB's purge
    catches up. A store filled over weeks is in this state."""
    started = time.perf_counter()
    if kind == "postgresql":
        import psycopg

        schema = p.store.split("schema=", 1)[1]
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'VACUUM (ANALYZE) "{schema}"."{ENDPOINT}.delayed"')
            conn.execute("CHECKPOINT")
    elif kind == "mariadb":
        import pymysql

        server = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                cursor = server.cursor()
                cursor.execute("SHOW ENGINE INNODB STATUS")
                status = str((cursor.fetchone() or ("", "", ""))[2])
                length = int(status.split("History list length", 1)[1].split()[0])
                if length < 1_000:
                    break
                time.sleep(2)
        finally:
            server.close()
    os.sync()
    return time.perf_counter() - started


def first_line_and_memory(p: Place) -> tuple[float, float]:
    """`list --all --json`: seconds to its first line, and its memory (MB) after 20 s (or at the end)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "list",
            "--all",
            "--json",
            "--store",
            p.store,
            "--endpoint",
            ENDPOINT,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    first = time.perf_counter() - started
    sink = open(os.devnull, "wb")  # noqa: SIM115 - the draining thread writes to it until the end
    drain = threading.Thread(target=shutil.copyfileobj, args=(proc.stdout, sink), daemon=True)
    drain.start()
    memory = 0.0
    until = time.monotonic() + 20
    while time.monotonic() < until and proc.poll() is None:
        with contextlib.suppress(OSError):
            memory = max(memory, rss_kb(proc.pid) / 1024)
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    drain.join(10)
    sink.close()
    return first, memory


def screens(p: Place, work: Path, port: int) -> dict[str, float]:
    store = p.store
    with duetime.open_sync_store(store) as s:
        s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        deep = s.list(ListQuery(limit=1, due_after=datetime.now(UTC) + timedelta(days=25))).messages
        one = s.list(ListQuery(limit=1)).messages
    cursor = f"{deep[0].due_at.isoformat()}~{deep[0].message_id}" if deep else None
    target = one[0].message_id if one else "none"
    ep = ["--store", store, "--endpoint", ENDPOINT]
    found: dict[str, float] = {
        "duetime --version (the floor: Python's start-up)": timed(lambda: checked(cli("--version"))),
        "stats": timed(lambda: checked(cli("stats", *ep))),
        "stats --json": timed(lambda: checked(cli("stats", "--json", *ep))),
        "list (first page)": timed(lambda: checked(cli("list", *ep))),
        "show": timed(lambda: cli("show", target, *ep)),
        "setup (nothing to do)": timed(lambda: checked(cli("setup", *ep))),
    }
    if cursor:
        found["list, a page 25 days in"] = timed(lambda: checked(cli("list", "--after", cursor, *ep)))
    first, memory = first_line_and_memory(p)
    found["list --all --json: first line (s)"] = first
    found["list --all --json: memory after 20 s (MB)"] = memory
    found.update(dashboard(p, port, target))
    started = time.perf_counter()
    done = cli("cancel", "--group", GROUP, "--yes", *ep)  # the empty store has no such group: its floor
    found["cancel --group of 100,000 (s)"] = time.perf_counter() - started
    if done.returncode != 0 and "no stored message in group" not in done.stderr:
        raise SystemExit(f"cancel --group: {done.stderr}")
    return found


def dashboard(p: Place, port: int, message_id: str) -> dict[str, float]:
    extra = ["--transport", p.transport] if p.transport else []
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "dashboard",
            "--store",
            p.store,
            "--endpoint",
            ENDPOINT,
            "--port",
            str(port),
            *extra,
        ],
        env={**os.environ, "DUETIME_DASHBOARD_PASSWORD": PASSWORD},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    auth = "Basic " + base64.b64encode(f"duetime:{PASSWORD}".encode()).decode()

    def fetch(path: str) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": auth})
        with urllib.request.urlopen(req, timeout=120) as answer:
            answer.read()

    try:
        for _ in range(150):
            with contextlib.suppress(OSError):
                fetch("/healthz")
                break
            time.sleep(0.2)
        e = f"endpoint={ENDPOINT}"

        def day(ahead: int) -> str:
            return (datetime.now(UTC) + timedelta(days=ahead)).strftime("%Y-%m-%dT%H:%M:%S")

        def page(path: str) -> float:
            """Seconds for the page; NaN for an answer that is not 200 (503: the dashboard is busy)."""
            try:
                return timed(lambda: fetch(path))
            except urllib.error.HTTPError:
                return float("nan")

        return {
            "dashboard: overview": page(f"/?{e}"),
            "dashboard: messages": page(f"/messages?{e}"),
            "dashboard: messages of one destination": page(f"/messages?{e}&destination=dest-007"),
            "dashboard: messages of a group": page(f"/messages?{e}&group={GROUP}"),
            "dashboard: messages due in a day 25 days ahead": page(
                f"/messages?{e}&due_after={quote(day(25))}&due_before={quote(day(26))}"
            ),
            "dashboard: one message": page(f"/message?{e}&id={quote(message_id)}"),
            "dashboard: error queue": page(f"/errors?{e}"),
        }
    finally:
        board.terminate()
        board.wait(30)


def storage(kind: str, p: Place) -> dict[str, float]:
    """Bytes on disk per message (table and indexes) and the payload (body and headers as JSON)."""
    if kind == "postgresql":
        import psycopg

        schema = p.store.split("schema=", 1)[1]
        table = f'"{schema}"."{ENDPOINT}.delayed"'
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {table}")
            size, rows, payload = conn.execute(
                f"SELECT pg_total_relation_size('{table}'), count(*), "
                f"avg(octet_length(body) + octet_length(headers::text)) FROM {table}"
            ).fetchone()  # type: ignore[misc]
    elif kind == "sqlite":
        import sqlite3

        path = p.store.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            rows, payload = conn.execute(
                f'SELECT count(*), avg(length(body) + length(headers)) FROM "{ENDPOINT}.delayed"'
            ).fetchone()
        size = os.path.getsize(path)
    elif kind == "mariadb":
        size, rows, payload = _mariadb_storage(p)
    elif kind == "redis":
        size, rows, payload = _redis_storage(p)
    else:
        return {}
    return {
        "bytes on disk per message": size / max(rows, 1),
        "payload per message (bytes)": float(payload or 0),
    }


def _mariadb_storage(p: Place) -> tuple[int, int, float]:
    """InnoDB's own figures after ``ANALYZE TABLE``: the pages of the table (its clustered index)
    and of its secondary indexes, as allocated; bodies too long for a page are in those pages."""
    import pymysql

    database = p.store.rsplit("/", 1)[1]
    table = f"`{database}`.`{ENDPOINT}.delayed`"
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute(f"ANALYZE TABLE {table}")
        cursor.fetchall()
        cursor.execute(
            "SELECT data_length + index_length FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = %s",
            (database, f"{ENDPOINT}.delayed"),
        )
        size = int(cursor.fetchone()[0])  # type: ignore[index]
        cursor.execute(f"SELECT count(*), avg(length(body) + length(headers)) FROM {table}")
        rows, payload = cursor.fetchone()  # type: ignore[misc]
    finally:
        conn.close()
    return size, int(rows), float(payload or 0)


def _redis_storage(p: Place) -> tuple[int, int, float]:
    """Memory, not disk: Redis holds everything in memory (what it writes to disk, RDB or AOF,
    depends on the server's settings). ``MEMORY USAGE … SAMPLES 0`` of every key of the store
    counts each element; the payload is measured on 10,000 messages picked at random."""
    import redis

    from duetime.backends.redis.store import _message

    prefix = p.store.split("prefix=", 1)[1]
    r = redis.Redis.from_url(REDIS)
    size = sum(int(r.memory_usage(key, samples=0) or 0) for key in r.scan_iter(f"{prefix}*", count=10_000))
    payloads = f"{prefix}{ENDPOINT}:payload"
    rows = int(r.hlen(payloads))
    picked: Any = r.hrandfield(payloads, 10_000, withvalues=True)
    sizes = [
        len(m.body) + len(json.dumps(dict(m.headers), separators=(",", ":")))
        for m in (_message(picked[i].decode(), picked[i + 1], 0, 0) for i in range(0, len(picked), 2))
    ]
    return size, rows, statistics.fmean(sizes) if sizes else 0.0


def bulk_jobs(p: Place, work: Path, rows: int) -> dict[str, float]:
    """``bulk export`` and ``bulk report`` of the store, each beside one process doing the same."""
    import psycopg

    from bench.cluster_bench import export_table

    schema = p.store.rsplit("schema=", 1)[1]
    table = f'"{schema}"."{ENDPOINT}.delayed"'

    def export_one_process() -> None:
        written = export_table(POSTGRES, table, work / "one-process-export")
        assert written == rows, written

    def report_one_process() -> None:
        with psycopg.connect(POSTGRES) as conn:
            conn.execute(
                f"SELECT destination, count(*), min(due_at) FROM {table} GROUP BY destination"
            ).fetchall()
            conn.execute(f"SELECT date_trunc('day', due_at), count(*) FROM {table} GROUP BY 1").fetchall()
            conn.execute(f"SELECT count(*) FROM {table} WHERE failure_count > 0").fetchall()
            conn.execute(
                f"SELECT message_id, octet_length(body) FROM {table} ORDER BY 2 DESC LIMIT 20"
            ).fetchall()

    found: dict[str, float] = {}

    def note(what: str, seconds: float) -> None:
        found[what] = seconds
        print(f"  {what}: {seconds:.1f}", flush=True)

    started = time.perf_counter()
    checked(cli("bulk", "export", "--from", p.store, "--to", f"parquet:{work / 'bulk-export'}"))
    note("bulk export (s)", time.perf_counter() - started)
    note("export, one process (s)", timed(export_one_process, times=1))
    started = time.perf_counter()
    checked(cli("bulk", "report", "--store", p.store, "--html", str(work / "report.html")))
    note("bulk report (s)", time.perf_counter() - started)
    note("report, one process (s)", timed(report_one_process, times=1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="postgresql", choices=["postgresql", "sqlite", "mariadb", "redis"])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--stream", type=int, default=20_000, help="messages due over 20 s")
    parser.add_argument(
        "--rounds", type=int, default=3, help="due streams on each store, in turn (figures: their medians)"
    )
    parser.add_argument(
        "--bulk",
        action="store_true",
        help="instead: bulk export and bulk report of the full store (PostgreSQL)",
    )
    parser.add_argument(
        "--storage",
        action="store_true",
        help="instead: only the bytes a message takes in a full store",
    )
    args = parser.parse_args()
    if args.storage:
        storage_only(args.kind, args.rows, datetime.now(UTC))
        return
    if args.bulk:
        if args.kind != "postgresql":
            raise SystemExit("--bulk measures a PostgreSQL store")
        bulk_only(args.rows, datetime.now(UTC))
        return
    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUETIME_BENCH_DIR")) as folder:
        work = Path(folder)
        with place(args.kind, work, "empty") as empty, place(args.kind, work, "full") as full:
            for p in (empty, full):
                checked(cli("setup", "--store", p.store, "--endpoint", ENDPOINT))
            results = [screens(empty, work, 19_200)]
            print("  measured the empty store's screens", flush=True)
            took = fill(full, args.rows, now)
            print(
                f"filled {args.rows:,} messages in {took:.0f} s ({args.rows / took:,.0f} a second)",
                flush=True,
            )
            settled = settle(args.kind, full)
            print(f"  the server and the disk took {settled:.0f} s to settle", flush=True)
            got = storage(args.kind, full)
            streams: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
            for round_ in range(args.rounds):  # in turn: a disk stall lands on either side
                for side, p in enumerate((empty, full)):
                    streams[side].append(due_stream(p, args.stream, 19_100 + side, work))
                print(f"  due streams, round {round_ + 1} of {args.rounds}", flush=True)
            results[0] |= medians(streams[0])
            got |= medians(streams[1])
            got |= screens(full, work, 19_201)
            results.append(got)
            print("  measured the full store", flush=True)
    print(f"\n{args.kind}, {args.rows:,} messages waiting, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    for side, label in enumerate(("empty", "full")):
        each = ", ".join(f"{r[P99]:.1f}" for r in streams[side])
        print(f"due stream lateness p99, each round, {label}: {each} ms")
    print()
    print(f"| | empty | {args.rows:,} waiting | ratio |\n|---|---|---|---|")
    for key in results[1]:
        a, b = results[0].get(key), results[1][key]
        ratio = f"{b / a:.2f}x" if a else ""
        shown_a = "" if a is None else f"{a:,.3f}" if a < 100 else f"{a:,.0f}"
        print(
            f"| {key} | {shown_a} | {b:,.3f} | {ratio} |"
            if b < 100
            else f"| {key} | {shown_a} | {b:,.0f} | {ratio} |"
        )


def setup_in_use(kind: str, p: Place) -> dict[str, float]:
    """``duetime setup`` that builds the group's index again on the full store, while a writer
    stores a message every 10 ms: how long the set-up took, and the longest a write waited."""
    with duetime.open_sync_store(p.store) as store:
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        if kind == "postgresql":
            import psycopg

            schema = p.store.split("schema=", 1)[1]
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP INDEX "{schema}"."{ENDPOINT}.delayed_group"')
        elif kind == "mariadb":
            store._execute(f"ALTER TABLE `{ENDPOINT}.delayed` DROP KEY duetime_group", ())  # type: ignore[attr-defined]
        else:
            import sqlite3

            with contextlib.closing(sqlite3.connect(p.store.removeprefix("sqlite:///"))) as conn:
                conn.execute(f'DROP INDEX "{ENDPOINT}.delayed_group"')
        waits: list[float] = []
        done = threading.Event()

        def write() -> None:
            i = 0
            while not done.is_set():
                started = time.perf_counter()
                store.store(
                    DelayedMessage(f"w{i}", "vol.writer", datetime.now(UTC) + timedelta(days=1), b"w")
                )
                waits.append(time.perf_counter() - started)
                i += 1
                time.sleep(0.01)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            started = time.perf_counter()
            checked(cli("setup", "--store", p.store, "--endpoint", ENDPOINT))
            took = time.perf_counter() - started
        finally:
            done.set()
            writer.join()
    return {
        "setup that builds an index again (s)": took,
        "a write meanwhile: p50 (ms)": pct(waits, 50) * 1000,
        "a write meanwhile: the longest (ms)": max(waits) * 1000,
    }


def storage_only(kind: str, rows: int, now: datetime) -> None:
    with (
        tempfile.TemporaryDirectory(dir=os.environ.get("DUETIME_BENCH_DIR")) as folder,
        place(kind, Path(folder), "full") as full,
    ):
        checked(cli("setup", "--store", full.store, "--endpoint", ENDPOINT))
        took = fill(full, rows, now)
        print(f"filled {rows:,} messages in {took:.0f} s ({rows / took:,.0f} a second)", flush=True)
        settle(kind, full)
        got = storage(kind, full)
        if kind != "redis":
            got |= setup_in_use(kind, full)
    print(f"\n{kind}, {rows:,} messages waiting, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    for key, value in got.items():
        print(f"{key}: {value:,.2f}" if value < 100 else f"{key}: {value:,.0f}")
    print(
        f"on disk against the payload: {got['bytes on disk per message'] / got['payload per message (bytes)']:.2f}x"
    )


def bulk_only(rows: int, now: datetime) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("DUETIME_BENCH_DIR")) as folder:
        work = Path(folder)
        with place("postgresql", work, "full") as full:
            checked(cli("setup", "--store", full.store, "--endpoint", ENDPOINT))
            took = fill(full, rows, now)
            print(f"filled {rows:,} messages in {took:.0f} s ({rows / took:,.0f} a second)", flush=True)
            got = bulk_jobs(full, work, rows)
    print(f"\npostgresql, bulk jobs on {rows:,} messages, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print("| | seconds | rows a second |\n|---|---|---|")
    for key, seconds in got.items():
        print(f"| {key} | {seconds:,.1f} | {rows / seconds:,.0f} |")
    print(
        f"\nbulk export / one process: {got['bulk export (s)'] / got['export, one process (s)']:.2f}x the time"
    )
    print(
        f"bulk report / one process: {got['bulk report (s)'] / got['report, one process (s)']:.2f}x the time"
    )


if __name__ == "__main__":
    main()
