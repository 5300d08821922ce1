"""What encryption at rest costs: the same load in plaintext and sealed, side by side in one run,
and a key rotation of a large PostgreSQL store while a dispatcher delivers.

    .venv/bin/python bench/encryption_bench.py                    # 250 a second, each case twice
    .venv/bin/python bench/encryption_bench.py --rate 1000 --rounds 1
    .venv/bin/python bench/encryption_bench.py --rotate 1000000   # and a rotation of a million

Each case keeps the messages in a PostgreSQL store and delivers them to a RabbitMQ queue read
by a consumer process (``bench.lateness.CONSUMER``), with one `duetime run` (at-least-once);
the messages carry a 100-byte body and three headers:

- **plaintext**: no keyring;
- **sealed**: ``DUETIME_ENCRYPTION_KEYS`` set for the producer and the dispatcher (the producer
  seals, the dispatcher opens each message it claims).

Lateness is the arrival at the consumer minus the due time; CPU per message is the dispatcher's
from the first send to the last arrival (what the producer spends sealing is printed apart);
the ratio is over **plaintext**'s in the same round. Goal: sealed <= 1.15x plaintext's CPU per
message, its p99 lateness no worse.

``--rotate N``: N sealed messages waiting an hour in a store of their own, then a new primary key
and `duetime keys rotate` while the same dispatcher delivers the 250-a-second stream; printed:
the rotation's rate and the stream's lateness during it beside before it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench`
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from bench.lateness import CONSUMER, python
from bench.rate_cost_bench import (
    POSTGRES,
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
from duetime.encryption import Keyring

CASES = ("plaintext", "sealed")
HEADERS = {
    "customer": "c-0001234",
    "order": "o-98765",
    "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
}


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def keyring_set(keys: Path | None) -> Iterator[None]:
    """This process's producer seals with ``keys`` (or not at all) inside the block."""
    saved = os.environ.pop("DUETIME_ENCRYPTION_KEYS", None)
    if keys is not None:
        os.environ["DUETIME_ENCRYPTION_KEYS"] = str(keys)
    try:
        yield
    finally:
        os.environ.pop("DUETIME_ENCRYPTION_KEYS", None)
        if saved is not None:
            os.environ["DUETIME_ENCRYPTION_KEYS"] = saved


def stream(queue: str, rate: int, tag: str) -> tuple[list[DelayedMessage], list[float]]:
    dues = due_times(rate, 0)
    messages = [
        DelayedMessage(f"{tag}-{i}", queue, datetime.fromtimestamp(due, UTC), b"x" * 100, HEADERS)
        for i, due in enumerate(dues)
    ]
    return messages, dues


def run_case(case: str, rate: int, folder: Path, keys: Path, rotate: int = 0) -> tuple[Result, float, str]:
    tag = uuid.uuid4().hex[:8]
    schema = f"bench_enc_{tag}"
    store = f"{POSTGRES}?schema={schema}"
    out = folder / f"{case}-{rate}-{tag}.arrivals"
    out.write_text("")
    queue = f"bench_enc_{tag}"
    sealing = None if case == "plaintext" else keys
    env = {k: v for k, v in os.environ.items() if k != "DUETIME_ENCRYPTION_KEYS"}
    env |= {"DUETIME_ENCRYPTION_KEYS": str(keys)} if sealing else {}
    cli = [sys.executable, "-m", "duetime"]
    common = ["--store", store, "--endpoint", "encbench"]
    subprocess.run(
        [*cli, "setup", *common, "--transport", RABBITMQ], check=True, capture_output=True, env=env
    )
    note = ""
    try:
        if rotate:
            note = fill(store, rotate, keys)
        consumer = python(CONSUMER, RABBITMQ, queue, str(out), stderr=subprocess.PIPE, start_new_session=True)
        assert consumer.stderr is not None
        consumer.stderr.readline()  # ready
        dispatcher = spawn(
            [*cli, "run", *common, "--transport", RABBITMQ, "--mode", "at-least-once"], folder, env
        )
        rotating: subprocess.Popen[bytes] | None = None
        try:
            time.sleep(3.0)  # started and idle
            messages, dues = stream(queue, rate, tag)
            before = cpu_of_session(dispatcher.pid)
            started = time.process_time()
            with keyring_set(sealing), duetime.connect_sync(store, endpoint="encbench") as client:
                client.schedule_many(messages)
            producer = time.process_time() - started
            if time.time() > dues[0]:
                raise SystemExit(f"{case} at {rate}/s: storing outlasted the lead")
            if rotate:
                Keyring.read(keys).with_new_key().write(keys)
                time.sleep(max(0.0, dues[0] - time.time()))
                rotate_started = time.monotonic()
                rotating = subprocess.Popen([*cli, "keys", "rotate", *common, "--batch", "1000"], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
            pairs = wait_lines(out, len(dues), window(rate) + 120)
            after = cpu_of_session(dispatcher.pid)
            if rotating is not None:
                said = rotating.communicate(timeout=7200)[0].decode().strip().splitlines()[-1]
                took = time.monotonic() - rotate_started
                note += f"; rotation of {rotate:,}: {took:,.0f} s ({rotate / took:,.0f}/s): {said}"
        finally:
            end(dispatcher)
            end(consumer)
            delete_rabbitmq_queue(queue)
    finally:
        drop_schema(schema)
    late = [(b - a) * 1000 for a, b in pairs]
    return Result(case, rate, len(dues), after - before, None, late), producer / len(dues), note


def fill(store: str, count: int, keys: Path) -> str:
    """``count`` sealed messages waiting an hour, stored in batches (what they took is said)."""
    started = time.monotonic()
    due = datetime.now(UTC) + timedelta(hours=1)
    with keyring_set(keys), duetime.connect_sync(store, endpoint="encbench") as client:
        for start in range(0, count, 5000):
            ids = range(start, min(count, start + 5000))
            client.schedule_many([DelayedMessage(f"w-{i}", "waiting", due, b"y" * 100, HEADERS) for i in ids])
    took = time.monotonic() - started
    return f"filled {count:,} sealed in {took:,.0f} s ({count / took:,.0f}/s)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=250, help="messages a second")
    parser.add_argument("--rounds", type=int, default=2, help="each case this many times, in turn")
    parser.add_argument(
        "--rotate", type=int, default=0, help="then rotate a store of this many waiting messages"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        keys = folder / "keys.json"
        Keyring.new().write(keys)
        print(f"{'round':>5} {'case':<10} {'rate':>6} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'CPU/msg ms':>11} {'ratio':>6} {'producer ms/msg':>16}")  # fmt: skip
        for n in range(1, args.rounds + 1):
            found = {case: run_case(case, args.rate, folder, keys) for case in CASES}
            base = found["plaintext"][0].cpu / found["plaintext"][0].count
            for case, (r, producer, _) in found.items():
                own = r.cpu / r.count
                print(f"{n:>5} {case:<10} {args.rate:>6} {r.count:>6} {r.p(0.5):>8.1f} {r.p(0.99):>8.1f} "
                      f"{own * 1000:>11.3f} {own / base:>6.2f}x {producer * 1000:>16.3f}")  # fmt: skip
        if args.rotate:
            r, _, note = run_case("sealed", args.rate, folder, keys, rotate=args.rotate)
            print(f"stream during the rotation: p50 {r.p(0.5):.1f} ms, p99 {r.p(0.99):.1f} ms, "
                  f"CPU/msg {r.cpu / r.count * 1000:.3f} ms; {note}")  # fmt: skip
        print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
