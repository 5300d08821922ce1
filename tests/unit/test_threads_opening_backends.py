"""Two threads opening backends for the first time at once (a web app's workers, a program's
consumer thread beside its main one) import the same package from both: importlib's locks made
that a deadlock error every time for a SQLite store and its queue, until the registry took the
packages in order (``duetime.registry._load``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: A fresh interpreter: the store on one thread, its queue on another, released together.
PROGRAM = """
import sys, threading
import duetime

url = sys.argv[1]
start = threading.Barrier(2)
failed = []

def opening(open_it):
    start.wait()
    try:
        open_it(url)
    except BaseException as error:
        failed.append(repr(error))

threads = [threading.Thread(target=opening, args=(f,)) for f in (duetime.open_transport, duetime.open_sync_store)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(failed or "ok")
"""


def test_a_store_and_its_queue_opened_at_once_from_two_threads_both_open(tmp_path: Path) -> None:
    for attempt in range(5):  # before the fix: 30 deadlocks in 30 runs
        url = f"sqlite:///{tmp_path / f'first-{attempt}.db'}"
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, url], capture_output=True, text=True, timeout=60, check=False
        )
        assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stdout + done.stderr
