"""Webhooks at steady rates and in a burst, beside the same load through RabbitMQ, in one run.

    .venv/bin/python bench/webhooks_bench.py                    # 250/s, 1,000/s, a burst of 20,000
    .venv/bin/python bench/webhooks_bench.py --rates 250 --burst 0

Both paths keep the messages in a SQLite store and deliver them with one `duetime run`:

- **webhooks**: the destination is a webhook (`duetime webhooks add`) on a receiver process of
  its own on this machine (uvicorn with httptools, answering 204 and writing each message's
  arrival; it does not check signatures, so that its CPU is the HTTP server's); the run routes it
  to `webhooks://`. Each request is signed, on a kept-alive connection of the endpoint's pool.
- **rabbitmq**: the same messages to a RabbitMQ queue, read by a consumer process
  (``bench.lateness.CONSUMER``), the rest of the run the same.

Lateness is the arrival at the receiver minus the due time; **CPU per message** is the run's
(dispatcher) and, "with receiver", plus the receiver's, from the first send to the last arrival.
The ratio column is webhooks' CPU per message over RabbitMQ's at the same rate. A burst of
``--burst`` messages due at one instant gives **drain**: their count over the time from their due
time to the last arrival.

Goals: p99 <= 10 ms at 1,000 a second; the burst of 20,000 drained at >= 5,000 a second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from bench.lateness import CONSUMER, python
from bench.rate_cost_bench import (
    RABBITMQ,
    Result,
    cpu_of_session,
    delete_rabbitmq_queue,
    due_times,
    end,
    spawn,
    wait_lines,
    window,
)
from duetime import DelayedMessage

#: The receiver: 204 for every POST, "id due arrival" per request to the file it is given.
RECEIVER = r"""
import sys, time
from datetime import datetime
import uvicorn
port, out = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    now = time.time()
    headers = dict(scope["headers"])
    due = datetime.fromisoformat(headers[b"duetime-due-at"].decode()).timestamp()
    out.write(f"{headers[b'webhook-id'].decode()} {due:.6f} {now:.6f}\n")
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
print("ready", file=sys.stderr, flush=True)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="httptools", lifespan="off",
            access_log=False)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_path(path: str, rate: int, folder: Path, burst: int = 0) -> Result:
    tag = uuid.uuid4().hex[:8]
    store = f"sqlite:///{folder / f'{tag}.db'}"
    out = folder / f"{path}-{rate}-{burst}.arrivals"
    out.write_text("")
    queue = f"bench_hooks_{tag}"
    duetime_cli = [sys.executable, "-m", "duetime"]
    common = ["--store", store, "--endpoint", "hooksbench"]
    if path == "webhooks":
        port = free_port()
        receiver = python(RECEIVER, str(port), str(out), stderr=subprocess.PIPE, start_new_session=True)
        subprocess.run([*duetime_cli, "setup", *common], check=True, capture_output=True)
        hook = [*duetime_cli, "webhooks", "add", queue, f"http://127.0.0.1:{port}/in", "--allow", "127.0.0.1"]
        subprocess.run([*hook, "--max-connections", "50", *common], check=True, capture_output=True)
        run = [*duetime_cli, "run", *common, "--route", f"{queue}=webhooks://"]
    else:
        receiver = python(CONSUMER, RABBITMQ, queue, str(out), stderr=subprocess.PIPE, start_new_session=True)
        subprocess.run(
            [*duetime_cli, "setup", *common, "--transport", RABBITMQ], check=True, capture_output=True
        )
        run = [*duetime_cli, "run", *common, "--transport", RABBITMQ]
    assert receiver.stderr is not None
    receiver.stderr.readline()  # ready
    dispatcher = spawn(run, folder)
    try:
        time.sleep(3.0)  # started and idle
        dues = due_times(rate, burst)
        before = cpu_of_session(dispatcher.pid), cpu_of_session(receiver.pid)
        messages = [
            DelayedMessage(f"m{i}", queue, datetime.fromtimestamp(due, UTC), body=b"x" * 100)
            for i, due in enumerate(dues)
        ]
        with duetime.connect_sync(store, endpoint="hooksbench") as client:
            client.schedule_many(messages)
        if time.time() > dues[0]:
            raise SystemExit(f"{path} at {rate}/s: storing outlasted the lead")
        pairs = wait_lines(out, len(dues), window(rate) + 120)
        after = cpu_of_session(dispatcher.pid), cpu_of_session(receiver.pid)
    finally:
        end(dispatcher)
        end(receiver)
        if path == "rabbitmq":
            delete_rabbitmq_queue(queue)
    late = [(b - a) * 1000 for a, b in pairs]
    return Result(path, rate, len(dues), after[0] - before[0], after[1] - before[1], late)


def drain(result: Result) -> float:
    """Messages a second from their (common) due time to the last arrival."""
    return result.count / max(max(result.late_ms) / 1000, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="250,1000", help="messages a second, comma-separated")
    parser.add_argument("--burst", type=int, default=20_000, help="messages due at once (0: none)")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",") if r]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"{'path':<10} {'rate':>6} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'CPU/msg ms':>11} {'with receiver':>14} {'ratio':>6}")  # fmt: skip
        for rate in rates:
            pair = {p: run_path(p, rate, folder) for p in ("rabbitmq", "webhooks")}
            for p, r in pair.items():
                ratio = r.per_message_ms / pair["rabbitmq"].per_message_ms
                own = r.cpu * 1000 / r.count
                print(f"{p:<10} {rate:>6} {r.count:>6} {r.p(0.5):>8.1f} {r.p(0.99):>8.1f} {max(r.late_ms):>8.1f} "
                      f"{own:>11.3f} {r.per_message_ms:>14.3f} {ratio:>6.2f}x")  # fmt: skip
        if args.burst:
            pair = {p: run_path(p, 1, folder, burst=args.burst) for p in ("rabbitmq", "webhooks")}
            for p, r in pair.items():
                print(f"burst of {r.count:,} via {p}: drained at {drain(r):,.0f} a second "
                      f"({drain(r) / drain(pair['rabbitmq']):.2f}x RabbitMQ's), "
                      f"CPU {r.per_message_ms:.3f} ms a message with receiver")  # fmt: skip
        print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
