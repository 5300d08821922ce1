"""How long this machine's disk takes to make a small write durable, and how often it stalls.

    .venv/bin/python bench/fsync_probe.py                  # 20 s, in the system's temporary folder
    .venv/bin/python bench/fsync_probe.py --seconds 60 --folder /var/lib/duetime

A SQLite store with ``synchronous=full`` (the default) waits for one fsync per commit, and a
dispatcher's commit is its delivery: a disk that now and then takes a tenth of a second makes
every message due meanwhile that late. This writes 8 KiB and fsyncs it every 2 ms (about what a
dispatcher delivering 500 messages a second does) and prints the distribution, each figure
beside the median (the ratio), and every stall of 50 ms or more. Run it where the store's file
will live, before reading a lateness p99 measured there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

STALL_MS = 50.0


def probe(folder: Path, seconds: float) -> list[float]:
    """Milliseconds each fsync took."""
    took: list[float] = []
    with tempfile.NamedTemporaryFile(dir=folder, prefix="fsync-probe-") as file:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            os.write(file.fileno(), b"x" * 8192)
            started = time.perf_counter()
            os.fsync(file.fileno())
            took.append((time.perf_counter() - started) * 1000)
            time.sleep(0.002)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    took = probe(args.folder, args.seconds)
    ordered = sorted(took)
    median = statistics.median(ordered)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * share))]

    print(f"{len(took):,} fsyncs of 8 KiB in {args.seconds:g} s, in {args.folder}\n")
    print("| | ms | x median |\n|---|---|---|")
    for label, value in (("p50", median), ("p99", at(0.99)), ("p99.9", at(0.999)), ("max", ordered[-1])):
        print(f"| {label} | {value:.2f} | {value / median:.1f}x |")
    stalls = [t for t in took if t >= STALL_MS]
    print(f"\nstalls of {STALL_MS:g} ms or more: {len(stalls)} ({', '.join(f'{t:.0f}' for t in stalls)} ms)")


if __name__ == "__main__":
    main()
