"""What a flow-control limit costs: the same load with no limit, with a limit on another
destination, and with a limit this destination stays under, side by side in one run.

    .venv/bin/python bench/limits_bench.py                 # 1,000 a second, each case twice
    .venv/bin/python bench/limits_bench.py --rate 250 --rounds 1

Each case keeps the messages in a SQLite store and delivers them to a RabbitMQ queue read by a
consumer process (``bench.lateness.CONSUMER``), with one `duetime run` (at-least-once):

- **none**: the store holds no limit (the dispatcher reads the limits every 2 s and finds none);
- **other**: a limit on another destination (each batch is looked at: every message's
  destination matched against the limits, none held);
- **limited**: a rate of 5,000 a second on this destination, which 1,000 a second stays under
  (every batch takes its turns from the store: one compare-and-set of the shared state).

Lateness is the arrival at the consumer minus the due time; CPU per message is the dispatcher's
from the first send to the last arrival; the ratio is over **none**'s in the same round.
Goal: limited <= 1.1x none's CPU per message, p99 lateness of **other** no worse than none's.
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

CASES = ("none", "other", "limited")


def run_case(case: str, rate: int, folder: Path) -> Result:
    tag = uuid.uuid4().hex[:8]
    store = f"sqlite:///{folder / f'{tag}.db'}"
    out = folder / f"{case}-{rate}-{tag}.arrivals"
    out.write_text("")
    queue = f"bench_limits_{tag}"
    cli = [sys.executable, "-m", "duetime"]
    common = ["--store", store, "--endpoint", "limitsbench"]
    subprocess.run([*cli, "setup", *common, "--transport", RABBITMQ], check=True, capture_output=True)
    if case != "none":
        limited = queue if case == "limited" else "someone-else"
        subprocess.run(
            [*cli, "limits", "set", limited, "--rate", "5000/s", *common], check=True, capture_output=True
        )
    consumer = python(CONSUMER, RABBITMQ, queue, str(out), stderr=subprocess.PIPE, start_new_session=True)
    assert consumer.stderr is not None
    consumer.stderr.readline()  # ready
    dispatcher = spawn([*cli, "run", *common, "--transport", RABBITMQ, "--mode", "at-least-once"], folder)
    try:
        time.sleep(3.0)  # started and idle
        dues = due_times(rate, 0)
        before = cpu_of_session(dispatcher.pid)
        messages = [
            DelayedMessage(f"m{i}", queue, datetime.fromtimestamp(due, UTC), body=b"x" * 100)
            for i, due in enumerate(dues)
        ]
        with duetime.connect_sync(store, endpoint="limitsbench") as client:
            client.schedule_many(messages)
        if time.time() > dues[0]:
            raise SystemExit(f"{case} at {rate}/s: storing outlasted the lead")
        pairs = wait_lines(out, len(dues), window(rate) + 120)
        after = cpu_of_session(dispatcher.pid)
    finally:
        end(dispatcher)
        end(consumer)
        delete_rabbitmq_queue(queue)
    late = [(b - a) * 1000 for a, b in pairs]
    return Result(case, rate, len(dues), after - before, None, late)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=1000, help="messages a second")
    parser.add_argument("--rounds", type=int, default=2, help="each case this many times, in turn")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"{'round':>5} {'case':<8} {'rate':>6} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'CPU/msg ms':>11} {'ratio':>6}")  # fmt: skip
        for n in range(1, args.rounds + 1):
            found = {case: run_case(case, args.rate, folder) for case in CASES}
            base = found["none"].cpu / found["none"].count
            for case, r in found.items():
                own = r.cpu / r.count
                print(f"{n:>5} {case:<8} {args.rate:>6} {r.count:>6} {r.p(0.5):>8.1f} {r.p(0.99):>8.1f} "
                      f"{own * 1000:>11.3f} {own / base:>6.2f}x")  # fmt: skip
        print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
