"""``duetime serve --workers N``: N server processes on one port, and one process that watches them.

One process answers requests on one core: FastAPI, pydantic and uvicorn's parsing are Python, and
the interpreter runs one thread at a time. On two cores one server left a core nearly idle while
it was full (``bench/http_api_bench.py``). So the command starts N copies of itself, each
listening on the same port (``SO_REUSEPORT``: the kernel spreads the connections among them), and
stays to watch them:

- SIGTERM or SIGINT is passed to every worker, and the command ends once they have (exit 0 when
  they stopped cleanly);
- a worker that ends on its own (a crash, a store it cannot open at start, a port in use) ends
  the others, and the command exits with that worker's status, so whatever supervises it
  (systemd, Kubernetes) restarts the whole and sees why;
- a worker ends with the command even when the command is killed with SIGKILL (Linux: the
  parent-death signal; elsewhere each worker notices its parent is gone within a second).

The watching process opens no store and no socket. The workers are the same command, told by
:data:`~duetime.settings.SERVE_WORKER_VARIABLE` that they are one (they listen with
``--share-port`` and start no workers).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from duetime.settings import SERVE_WORKER_VARIABLE, variable

log = logging.getLogger("duetime.api")

#: What a worker sends the watching process once it serves.
STARTED = signal.SIGUSR1
#: prctl's option that sends a signal to this process when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1
#: Seconds the workers have to stop after SIGTERM before they are killed.
STOP_WITHIN = 30.0


def tell_started(parent: int) -> None:
    """Tell the watching process this worker serves (its store open, its port answering)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(parent, STARTED)


def worker_of() -> int | None:
    """The watching process's id when this process is one of its workers, else None. A value
    left in the environment by something else (a shell that exported it) is not this process's
    parent, and is ignored."""
    said = variable(SERVE_WORKER_VARIABLE) or ""
    os.environ.pop(SERVE_WORKER_VARIABLE, None)  # nothing it starts is a worker
    return int(said) if said.isdigit() and int(said) == os.getppid() else None


def follow_parent(parent: int) -> None:
    """End this worker (SIGTERM, a clean stop) when ``parent`` ends, however it ends."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    if sys.platform != "linux":
        threading.Thread(target=watch, name="duetime-parent-watch", daemon=True).start()


def run_workers(count: int, argv: Sequence[str], port: int) -> int:
    """Start ``count`` workers running ``duetime`` with ``argv``, serving on ``port``, and watch
    them until they end; the exit status the command should have.

    The first worker starts alone and the others once it says it serves (:func:`tell_started`):
    what stops one from starting (a store it cannot open, a port in use, a missing key) is said
    once, by it, not by each."""
    env = {**os.environ, SERVE_WORKER_VARIABLE: str(os.getpid())}
    command = [sys.executable, "-m", "duetime", *argv]
    workers: list[subprocess.Popen[bytes]] = []
    stopping = threading.Event()
    started = threading.Event()

    def stop(signum: int, _: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[STARTED] = signal.signal(STARTED, lambda *_: started.set())
    try:
        workers.append(subprocess.Popen(command, env=env))
        while not stopping.is_set() and workers[0].poll() is None and not started.is_set():
            stopping.wait(0.05)
        if not stopping.is_set() and workers[0].poll() is None:
            workers += [subprocess.Popen(command, env=env) for _ in range(count - 1)]
            log.info("%d workers serve on port %d (process ids %s)", count, port, _ids(workers))
        ended = _first_to_end(workers, stopping)
        if ended is not None and workers[1:]:
            log.error("worker %d ended (%s); stopping the others", ended.pid, _status(ended.returncode))
        _stop(workers)
        if ended is not None:
            return _exit_status(ended.returncode) or 1
        return max((_exit_status(w.returncode) for w in workers), default=0)
    finally:
        _stop(workers)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _first_to_end(
    workers: Sequence[subprocess.Popen[bytes]], stopping: threading.Event
) -> subprocess.Popen[bytes] | None:
    """The first worker to end on its own, or None when the command was told to stop first."""
    while not stopping.is_set():
        ended = next((w for w in workers if w.poll() is not None), None)
        if ended is not None:
            return ended
        stopping.wait(0.2)
    return None


def _ids(workers: Sequence[subprocess.Popen[bytes]]) -> str:
    return ", ".join(str(w.pid) for w in workers)


def _exit_status(returncode: int | None) -> int:
    """A worker's status as a shell gives it: 128 + the signal that ended it."""
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode


def _status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


def _stop(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each worker still running; SIGKILL to any still running after
    :data:`STOP_WITHIN` seconds."""
    for w in workers:
        if w.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.terminate()
    deadline = time.monotonic() + STOP_WITHIN
    for w in workers:
        try:
            w.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
