"""Steady load for a long time on PostgreSQL: does anything grow that should not?

    .venv/bin/python bench/soak_bench.py [--minutes 60] [--rate 2000] [--restart-every 5] [--out bench/soak]
                                         [--hold-snapshot MINUTE:SECONDS] [--table-settings ...]

For ``--minutes``, producers schedule ``--rate`` messages a second (due 1-5 s later) into a store
on a PostgreSQL server of its own (``initdb``, default settings: autovacuum on; run as root), two
``duetime run`` processes (exactly-once into the PostgreSQL queue) deliver them, one of them
restarted (SIGTERM, then started again) every ``--restart-every`` minutes, and a consumer drains
the queue. Every minute it records: messages scheduled and received, lateness p50/p99/max at the
consumer (arrival minus due time), the memory (RSS) of every process, the store's and the queue's
table and index sizes (and each of the store's indexes), dead rows and autovacuum count, the rows
waiting in the store at most, and the longest-open snapshot of a client and of autovacuum.
``--hold-snapshot 6:40`` holds a snapshot open for 40 s from minute 6 (what a slow report or a
stalled client does to the server); ``--table-settings`` gives both tables storage parameters
(autovacuum's, say) after set-up. It writes ``<out>.csv`` and a chart ``<out>.png`` (the default
run: ``docs/soak.png``), and prints the last minutes beside the first ones: a ratio near 1 is flat
(the first minutes are the baseline, measured in the same run).
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

import duetime
from duetime.backends.postgres import SyncPostgresQueue

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.topology.servers import postgres_server  # noqa: E402  (a server of its own: autovacuum on)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    def __init__(self, url: str, rate: int) -> None:
        self.url, self.rate = url, rate
        self.halt = threading.Event()
        self.stop_producing = threading.Event()
        self.lock = threading.Lock()
        self.scheduled = 0
        self.late: list[float] = []  # ms, this minute
        self.received = 0
        self.seen = bytearray(rate * 60 * 24 * 60 // 8 + 1)  # a bit per message id (m<n>), up to a day
        self.doubled = 0

    def produce(self) -> None:
        """``rate`` a second, in batches of a twentieth of a second, due 1-5 s later."""
        step = 0.05
        per = max(1, int(self.rate * step))
        with duetime.connect_sync(self.url, endpoint="soak") as client:
            next_at = time.monotonic()
            n = 0
            while not self.stop_producing.is_set():
                now = datetime.now(UTC)
                batch = [
                    duetime.DelayedMessage.create(
                        "orders",
                        b"x" * 200,
                        due_at=now + timedelta(seconds=1 + (n + i) % 5),
                        # ids that sort in the order they are made, as duetime's own (UUIDv7) do
                        message_id=f"m{n + i:012d}",
                    )
                    for i in range(per)
                ]
                try:
                    client.schedule_many(batch)
                    with self.lock:
                        self.scheduled += per
                except Exception as error:
                    print(f"scheduling failed: {error}", file=sys.stderr)
                n += per
                next_at += step
                time.sleep(max(0.0, next_at - time.monotonic()))

    def consume(self) -> None:
        with SyncPostgresQueue.from_url(self.url) as queue:
            while not self.halt.is_set():
                batch = queue.receive("orders", 500, wait=0.5)
                now = time.time()
                with self.lock:
                    for m in batch:
                        due = datetime.fromisoformat(m.headers["duetime-due-at"]).timestamp()
                        self.late.append((now - due) * 1000)
                        n = int(m.message_id[1:])
                        if self.seen[n >> 3] & (1 << (n & 7)):
                            self.doubled += 1
                        self.seen[n >> 3] |= 1 << (n & 7)
                    self.received += len(batch)
                queue.acknowledge(batch)

    def minute(self) -> dict[str, Any]:
        with self.lock:
            late, self.late = sorted(self.late), []
            figures: dict[str, Any] = {
                "scheduled": self.scheduled,
                "received": self.received,
                "doubled": self.doubled,
            }
        if late:
            figures |= {
                "late_p50_ms": round(late[len(late) // 2], 1),
                "late_p99_ms": round(late[int(len(late) * 0.99)], 1),
                "late_max_ms": round(late[-1], 1),
            }
        return figures


class Watch:
    """Twice a second: the longest-open snapshot on the server, of a client and of autovacuum apart
    (while a transaction holds one, no row deleted since can be cleaned away, index entries
    included: the index grows into new pages and keeps them), and the rows waiting in the store;
    each minute's highest of each."""

    def __init__(self, database: str, schema: str) -> None:
        self.database, self.schema = database, schema
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.held: dict[str, float] = {}
        self.rows = 0

    def run(self) -> None:
        with psycopg.connect(self.database, autocommit=True) as conn:
            table = conn.execute(
                "SELECT format('%%I.%%I', schemaname, relname) FROM pg_stat_user_tables "
                "WHERE schemaname = %s AND relname LIKE '%%.delayed'",
                [self.schema],
            ).fetchone()
            while not self.halt.wait(0.5):
                held = conn.execute(
                    "SELECT backend_type = 'autovacuum worker', max(extract(epoch FROM now() - xact_start)) "
                    "FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() "
                    "GROUP BY 1"
                ).fetchall()
                rows = conn.execute(f"SELECT count(*) FROM {table[0]}").fetchone()[0] if table else 0  # type: ignore[index]
                with self.lock:
                    for autovacuum, seconds in held:
                        key = "longest_autovacuum_s" if autovacuum else "longest_snapshot_s"
                        self.held[key] = max(self.held.get(key, 0.0), float(seconds))
                    self.rows = max(self.rows, int(rows))

    def minute(self) -> dict[str, Any]:
        with self.lock:
            figures: dict[str, Any] = {key: round(seconds, 1) for key, seconds in self.held.items()}
            figures["store_rows_max"] = self.rows
            self.held, self.rows = {}, 0
        return {"longest_snapshot_s": 0.0, "longest_autovacuum_s": 0.0} | figures


DEFAULT_OUT = str(ROOT / "bench" / "soak")


def chart_path(out: str) -> Path:
    """Where the chart goes: the documentation's picture for the default run, beside the CSV else."""
    return ROOT / "docs" / "soak.png" if out == DEFAULT_OUT else Path(f"{out}.png")


def hold_snapshot(database: str, seconds: float) -> None:
    """A transaction that takes a snapshot and keeps it ``seconds``: until it ends, no row deleted
    since can be cleaned away on the whole server."""
    with psycopg.connect(database) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM pg_class").fetchone()
        time.sleep(seconds)
        conn.rollback()


def table_figures(database: str, schema: str) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with psycopg.connect(database, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, pg_table_size(relid), pg_indexes_size(relid), n_dead_tup, autovacuum_count "
            "FROM pg_stat_user_tables WHERE schemaname = %s",
            [schema],
        ).fetchall()
        indexes_of_store = conn.execute(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
            "WHERE schemaname = %s AND relname LIKE '%%.delayed' ORDER BY 1",
            [schema],
        ).fetchall()
    for index, size in indexes_of_store:  # which of the store's indexes grows, if one does
        figures[f"index_{index.rsplit('.', 1)[-1]}_mb"] = round(size / 2**20, 2)
    for name, table, indexes, dead, vacuums in rows:
        key = "store" if name.endswith(".delayed") else "queue" if name == "duetime_queue_messages" else None
        if key:
            figures |= {
                f"{key}_table_mb": round(table / 2**20, 2),
                f"{key}_indexes_mb": round(indexes / 2**20, 2),
                f"{key}_dead_rows": dead,
                f"{key}_autovacuums": vacuums,
            }
    return figures


def spawn(url: str, n: int, folder: Path) -> subprocess.Popen[bytes]:
    log = (folder / f"run{n}.log").open("ab")
    command = [
        sys.executable,
        "-m",
        "duetime",
        "run",
        "--store",
        url,
        "--endpoint",
        "soak",
        "--no-front-door",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    for key in ("late_p50_ms", "late_p99_ms"):
        axes[0].plot(minutes, [r.get(key, 0) for r in rows], label=key.replace("late_", "lateness "))
    axes[0].set_ylabel("ms")
    for key in ("rss_dispatcher0_mb", "rss_dispatcher1_mb", "rss_bench_mb"):
        axes[1].plot(minutes, [r.get(key, 0) for r in rows], label=key.replace("rss_", "").replace("_mb", ""))
    axes[1].set_ylabel("memory, MB")
    for key in ("store_table_mb", "store_indexes_mb", "queue_table_mb", "queue_indexes_mb"):
        axes[2].plot(minutes, [r.get(key, 0) for r in rows], label=key.replace("_mb", ""))
    axes[2].set_ylabel("size, MB")
    for key in ("store_dead_rows", "queue_dead_rows"):
        axes[3].plot(minutes, [r.get(key, 0) for r in rows], label=key)
    axes[3].set_ylabel("dead rows")
    axes[3].set_xlabel("minute")
    for axis in axes:
        axis.legend(loc="upper left", fontsize=8)
        axis.grid(alpha=0.3)
    fig.suptitle("duetime soak: PostgreSQL, exactly-once, dispatchers restarted")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)  # pyplot keeps every figure it made until closed: 9 MB a minute here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--restart-every", type=int, default=5)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument(
        "--hold-snapshot",
        default="",
        metavar="MINUTE:SECONDS",
        help="at the start of MINUTE, hold a snapshot open for SECONDS (a transaction elsewhere on "
        "the server that reads and waits, as a slow report or a stalled client would)",
    )
    parser.add_argument(
        "--table-settings",
        default="",
        help="storage parameters for the store's and the queue's tables after setup, e.g. "
        "autovacuum_vacuum_scale_factor=0,autovacuum_vacuum_threshold=10000",
    )
    args = parser.parse_args()
    # stopped early (SIGTERM, Ctrl-C): the dispatchers and the server it started go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with postgres_server() as port:
        soak_on(f"postgresql://postgres@127.0.0.1:{port}/postgres", args)


def soak_on(database: str, args: argparse.Namespace) -> None:
    url = f"{database}?schema=soak"
    folder = Path(args.out).parent
    soak = Soak(url, args.rate)
    watch = Watch(database, "soak")
    runs: list[subprocess.Popen[bytes]] = []
    workers: list[threading.Thread] = []
    rows: list[dict[str, Any]] = []
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "duetime",
                "setup",
                "--store",
                url,
                "--endpoint",
                "soak",
                "--queue",
                "orders",
            ],
            check=True,
        )
        if args.table_settings:
            with psycopg.connect(database, autocommit=True) as conn:
                for (table,) in conn.execute(
                    "SELECT format('%%I.%%I', schemaname, relname) FROM pg_stat_user_tables WHERE schemaname = 'soak'"
                ).fetchall():
                    conn.execute(f"ALTER TABLE {table} SET ({args.table_settings})")
        runs = [spawn(url, 0, folder), spawn(url, 1, folder)]
        workers = [
            threading.Thread(target=soak.produce),
            threading.Thread(target=soak.consume),
            threading.Thread(target=watch.run),
        ]
        for worker in workers:
            worker.start()
        started = time.monotonic()
        restarts = 0
        for minute in range(1, int(args.minutes) + 1):
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            if args.hold_snapshot and minute == int(args.hold_snapshot.split(":")[0]):
                seconds = float(args.hold_snapshot.split(":")[1])
                threading.Thread(target=hold_snapshot, args=(database, seconds), daemon=True).start()
            if minute % max(1, args.restart_every) == 0:
                which = restarts % 2  # each in turn
                restarts += 1
                runs[which].send_signal(signal.SIGTERM)
                runs[which].wait(60)
                runs[which] = spawn(url, which, folder)
            row: dict[str, Any] = (
                {"minute": minute} | soak.minute() | watch.minute() | table_figures(database, "soak")
            )
            for n, process in enumerate(runs):
                row[f"rss_dispatcher{n}_mb"] = round(rss_mb(process.pid), 1)
            row["rss_bench_mb"] = round(rss_mb(os.getpid()), 1)
            rows.append(row)
            print(row, flush=True)
            fields = list(dict.fromkeys(k for r in rows for k in r))
            with open(f"{args.out}.csv", "w", newline="") as out:
                writer = csv.DictWriter(out, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
            plot(rows, chart_path(args.out))
        soak.stop_producing.set()
        workers[0].join(30)
        end = time.monotonic() + 30  # what is still due arrives within 5 s
        while soak.received < soak.scheduled and time.monotonic() < end:
            time.sleep(0.5)
    finally:
        soak.stop_producing.set()
        soak.halt.set()
        watch.halt.set()
        for worker in workers:  # before the server goes
            worker.join(30)
        for process in runs:
            process.send_signal(signal.SIGTERM)
        for process in runs:
            process.wait(60)
    edge = max(1, min(5, len(rows) // 4))
    print(
        f"lost: {soak.scheduled - soak.received} (scheduled {soak.scheduled:,}, received {soak.received:,}); doubled {soak.doubled}"
    )
    for key in ("late_p99_ms", "rss_dispatcher0_mb", "rss_dispatcher1_mb", "rss_bench_mb", "store_table_mb",
                "store_indexes_mb", "queue_table_mb", "queue_indexes_mb", "store_dead_rows", "queue_dead_rows",
                "store_rows_max", "longest_snapshot_s", "longest_autovacuum_s"):  # fmt: skip
        first = statistics.median(r.get(key, 0) for r in rows[:edge])
        last = statistics.median(r.get(key, 0) for r in rows[-edge:])
        ratio = f"{last / first:.2f}x" if first else "-"
        print(f"{key}: first {edge} minutes {first}, last {edge} minutes {last}, ratio {ratio}")


if __name__ == "__main__":
    main()
