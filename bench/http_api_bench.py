"""Scheduling over HTTP (`duetime serve`) beside the Python client, on one store, in one run.

    .venv/bin/python bench/http_api_bench.py                       # PostgreSQL, a baseline of 4,000 calls
    .venv/bin/python bench/http_api_bench.py --store sqlite --count 2000
    .venv/bin/python bench/http_api_bench.py --soak 1000000 --workers 1  # the server's RSS over a million

Figures, each a rate of messages stored a second (100-byte bodies, ``delay: "1h"``):

- **Python client, one call at a time** (``connect_sync(...).schedule``): the baseline of every
  ratio, the rate a Python program gets without a server in between.
- **HTTP, one message a request**, over kept-alive connections: 1 client, and 16 clients, with
  each request's latency (p50, p99). The clients are wrk (Debian's package): HTTP/1.1 connections
  kept alive by a load generator in C, so that the server is what is measured, not a Python
  client beside it.
- **HTTP, batches of 500** (``POST /v1/batches``), 1 client and 4 clients.

Each HTTP figure is taken with ``duetime serve --workers N`` for each N of ``--workers`` (1 and 2
by default: one server process, and one a core on these two cores), on a free port, with a key
of a rate no client reaches.

``--soak N`` then sends N one-message requests from 16 clients and reads the servers' resident
memory (``/proc/PID/status``, the workers' sum) every tenth of the way: flat means no request
leaves anything behind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
BODY = "x" * 100
#: Messages a batch request carries.
BATCH = 500
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def store_url(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/bench.db"
        return
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{POSTGRES}?schema={schema}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "duetime", *args], capture_output=True, text=True, check=True
    )
    return done.stdout


@contextmanager
def serving(url: str, workers: int = 1) -> Iterator[tuple[int, str, list[int]]]:
    """`duetime serve --workers N` on a free port: (port, key, the pids that answer: the workers,
    or the command itself when it is the one server)."""
    key = cli("api-keys", "create", f"bench-{uuid.uuid4().hex[:6]}", "--scope", "schedule,read",
              "--rate", "1000000", "--store", url).strip().splitlines()[-1]  # fmt: skip
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log", delete=False)  # noqa: SIM115
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duetime",
            "serve",
            "--store",
            url,
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60
        while Path(log.name).read_text().count("HTTP API of") < workers:
            assert server.poll() is None and time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(0.05)
        time.sleep(2.1)  # the key is read with the others, at most every 2 s
        yield port, key, (children(server.pid) if workers > 1 else [server.pid])
    finally:
        server.terminate()
        server.wait(60)
        os.unlink(log.name)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


#: wrk's script: POST the body file with the key.
_WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = io.open(os.getenv("BENCH_BODY")):read("*a")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")
"""
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def load(
    port: int, key: str, path: str, payload: object, seconds: float, clients: int
) -> tuple[float, str, str, int]:
    """wrk (Debian's package): ``clients`` HTTP/1.1 connections kept alive for ``seconds``;
    requests a second, p50 and p99 in ms, and requests in all. A load generator in C, so that what
    is measured is the server, not a Python client. (ApacheBench speaks HTTP/1.0, which uvicorn
    never keeps alive: each of its requests was a new connection.)"""
    with tempfile.TemporaryDirectory() as folder:
        body, script = Path(folder) / "body.json", Path(folder) / "post.lua"
        body.write_text(json.dumps(payload))
        script.write_text(_WRK_SCRIPT)
        env = {**os.environ, "BENCH_BODY": str(body), "BENCH_KEY": key}
        done = subprocess.run(
            ["wrk", "-t", "1", "-c", str(clients), "-d", f"{max(1, round(seconds))}s", "--latency",
             "-s", str(script), f"http://127.0.0.1:{port}{path}"],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
    said = done.stdout
    assert "Non-2xx" not in said and "Socket errors" not in said, said
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", said).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"(\d+) requests in", said).group(1))  # type: ignore[union-attr]
    return rate, _percentile(said, "50%"), _percentile(said, "99%"), count


def _percentile(said: str, which: str) -> str:
    value, unit = re.search(rf"^\s+{which}\s+([\d.]+)(us|ms|s)$", said, re.M).groups()  # type: ignore[union-attr]
    return f"{float(value) * _UNITS[unit]:.1f}"


def python_client(url: str, count: int) -> float:
    with duetime.connect_sync(url) as client:
        began = time.perf_counter()
        for _ in range(count):
            client.schedule("orders", BODY.encode(), delay="1h")
        return count / (time.perf_counter() - began)


def rss_kib(pids: list[int]) -> int:
    """The resident memory of the server processes, summed."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--count",
        type=int,
        default=4000,
        help="the baseline's calls; each HTTP figure runs as long as they took",
    )
    parser.add_argument("--soak", type=int, default=0, help="requests of the memory soak (0: none)")
    parser.add_argument(
        "--workers",
        default="1,2",
        help="`duetime serve --workers N` for each N of this list, each in turn (default 1,2)",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("error: the clients are wrk, which is not installed here; install it: apt-get install wrk")
    with store_url(args.store) as url:
        cli("setup", "--store", url)
        baseline = python_client(url, args.count)
        print(f"  Python client, one call at a time     {baseline:9,.0f} msg/s   (the baseline)")
        seconds = max(1, round(args.count / baseline))  # each figure about as long as the baseline took
        print(f"store {args.store}, {seconds} s a figure")
        for workers in [int(w) for w in args.workers.split(",")]:
            measure(url, workers, seconds, baseline, args.soak)


def measure(url: str, workers: int, seconds: int, baseline: float, soak: int) -> None:
    """The HTTP figures of one `duetime serve --workers N`, and the soak when asked."""
    with serving(url, workers) as (port, key, pids):
        one = {"destination": "orders", "delay": "1h", "body": BODY}
        load(port, key, "/v1/messages", one, 2, 4)  # warm: imports, connections
        rate_16 = baseline
        for clients in (1, 16):
            rate, p50, p99, _ = load(port, key, "/v1/messages", one, seconds, clients)
            rate_16 = rate
            print(
                f"  {workers} worker(s), one a request, {clients:2d} client(s)  {rate:9,.0f} msg/s   "
                f"{rate / baseline:5.2f}x   p50 {p50} ms  p99 {p99} ms"
            )
        for clients in (1, 4):
            rate, p50, p99, _ = load(port, key, "/v1/batches", {"messages": [one] * BATCH}, seconds, clients)
            print(
                f"  {workers} worker(s), batches of {BATCH}, {clients} client(s)  {rate * BATCH:9,.0f} msg/s   "
                f"{rate * BATCH / baseline:5.2f}x   p50 {p50} ms  p99 {p99} ms"
            )
        if soak:
            start = rss_kib(pids)
            samples = []
            sent = 0
            began = time.perf_counter()
            for tenth in range(10):  # what is left in equal parts, by the latest rate
                seconds_left = (soak - sent) / (10 - tenth) / rate_16
                rate_16, _, _, count = load(port, key, "/v1/messages", one, seconds_left, 16)
                sent += count
                samples.append(rss_kib(pids))
            rate = sent / (time.perf_counter() - began)
            print(
                f"  soak: {sent:,} requests at {rate:,.0f}/s; server RSS {start / 1024:.0f} MiB "
                "before, then " + ", ".join(f"{s / 1024:.0f}" for s in samples) + " MiB"
                f" (last/first tenth {samples[-1] / samples[0]:.2f}x)"
            )


if __name__ == "__main__":
    main()
