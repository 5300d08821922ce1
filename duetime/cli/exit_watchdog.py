"""The last resort of a stopping ``duetime run``: leave, even while a thread waits on a server.

A network partition does not reset connections; it stops answering. A database driver blocked
in a read on such a connection returns only when the kernel gives up on it (many minutes), and
Python waits for that thread at exit (asyncio for its executor's threads, the interpreter for the
rest). So a dispatcher whose breaker tripped logged its critical error and then hung instead of
exiting with code 3 for its supervisor to restart it (seen with MariaDB and PostgreSQL behind a
partition). Once a stop has begun, a timer that is not stopped by the process's own exit ends it
``stop_timeout`` later. Nothing is lost by leaving: a claimed batch goes back when its claim times
out, and a transaction left open is rolled back by its server.

The same wait hangs any command that is leaving while a thread waits on a dead connection
(Ctrl-C on ``queues receive``, say): :func:`at_exit` gives every exit a bound too.

Only the ``duetime`` command arms it (:func:`enable`): a library caller's process is its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("duetime")

_enabled = False
_exit_code = 1
_armed: threading.Timer | None = None
_lock = threading.Lock()


def enable() -> None:
    """Let :func:`arm` end the process (the command line's entry point calls this)."""
    global _enabled
    _enabled = True


#: The one private CPython API duetime uses: ``atexit`` runs only after the interpreter has joined
#: every thread (which is where a command hangs), and no public hook runs before that join.
#: ``tests/unit/test_layout.py`` fails if a Python release takes it away.
_BEFORE_THREADS_JOIN: Callable[[Callable[[], None]], None] | None = getattr(
    threading, "_register_atexit", None
)


def at_exit(seconds: float) -> None:
    """Once the interpreter starts to exit, give it ``seconds``: it then waits for every thread
    still running (a command stopped with Ctrl-C while a thread waits on a dead connection hung
    there), before anything registered with ``atexit`` runs."""
    if _BEFORE_THREADS_JOIN is not None:
        _BEFORE_THREADS_JOIN(lambda: _arm_leaving(seconds))


def _arm_leaving(seconds: float) -> None:
    with contextlib.suppress(RuntimeError):  # a Python that refuses new threads this late
        arm(seconds, lambda: _exit_code, lambda: None)


def exiting(code: object) -> None:
    """The code the process is leaving with (``SystemExit.code``), for :func:`at_exit`."""
    global _exit_code
    _exit_code = code if isinstance(code, int) else 0 if code is None else 1


def arm(seconds: float, exit_code: Callable[[], int], last_words: Callable[[], None]) -> None:
    """From now, leave the process ``seconds`` later with ``exit_code()`` unless it has left by
    itself; ``last_words`` prints what the process would have said on its way out. Arming twice
    keeps the first timer."""
    global _armed
    with _lock:
        if not _enabled or _armed is not None:
            return
        _armed = threading.Timer(seconds, _leave, (seconds, exit_code, last_words))
        _armed.daemon = True  # never what keeps the process alive
        _armed.start()


def _leave(seconds: float, exit_code: Callable[[], int], last_words: Callable[[], None]) -> None:
    waiting = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    log.error(
        "stopping did not finish within %g s: a server that does not answer holds a connection "
        "(threads still waiting: %s); leaving without waiting for it. Nothing is lost: claimed "
        "messages go back when their claim times out, open transactions roll back.",
        seconds,
        ", ".join(waiting) or "none",
    )
    code = exit_code()
    try:
        last_words()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe must not keep the process here either
                stream.flush()
        os._exit(code)
