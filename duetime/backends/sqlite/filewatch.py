"""Knowing, without polling, that another process wrote the SQLite file.

In WAL mode every commit writes the ``-wal`` file; Linux's inotify tells a watcher of the folder
at once. A receiver waiting on its queue, or a store watching for messages stored elsewhere,
sleeps on that instead of reading ``PRAGMA data_version`` every few milliseconds (which cost a
few per cent of a core per idle process). What wakes it is only a hint: the caller still reads
``data_version`` to see whether another connection committed, and looks anyway now and then, so
a spurious event costs a look, never a message. An event comes when the WAL is written, a moment
before the commit is visible (SQLite syncs the file and then publishes the commit in shared
memory, which inotify does not see): after an event, callers look again after 1, 2, 4 ... ms for a
short while (:data:`SETTLE`) before they sleep on the watch again. Where inotify is not available (not
Linux, or the ``inotify_simple`` package missing) :func:`watch` answers None and callers poll.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from duetime.backends._readable import wait_readable

log = logging.getLogger("duetime.sqlite")

#: After a write event, how long callers keep looking for the commit to show (it shows once the
#: WAL is synced: a few milliseconds, more on a busy disk), and their first look's delay.
SETTLE = 0.1
SETTLE_POLL = 0.001
#: How long callers sleep on the watch at most before they look anyway.
RECHECK = 1.0


class Looks:
    """When to look for a commit after the file's write events: 1 ms after the last event, then
    each pause twice the last, until :data:`SETTLE` has passed without one; then asleep on the
    watch again (at most :data:`RECHECK`). A commit that shows x ms after its event is seen by
    about 2x; a new event starts again at 1 ms, so a commit is never found late because another
    was being waited for.

    Looking every millisecond for the whole window after each event cost about 100 looks an event,
    and with a consumer taking messages from the same file an event came every few milliseconds:
    the looking never stopped (most of a dispatcher's and a consumer's CPU at tens of messages a
    second; bench/rate_cost_bench.py)."""

    def __init__(self) -> None:
        self._pause: float | None = None
        self._waited = 0.0

    def timeout(self) -> float:
        """How long to sleep on the watch before the next look."""
        return RECHECK if self._pause is None else self._pause

    def after(self, written: bool) -> None:
        """The sleep ended: by a write event (``written``) or by its timeout."""
        if written:
            self._pause, self._waited = SETTLE_POLL, 0.0
        elif self._pause is not None:
            self._waited += self._pause
            self._pause = self._pause * 2 if self._waited < SETTLE else None


try:
    from inotify_simple import INotify, flags  # type: ignore[import-untyped]
except ImportError:  # not Linux, or not installed: callers poll
    INotify = None


class FileWatch:
    """Events for one database file and its WAL; one waiter at a time (:meth:`try_wait`)."""

    def __init__(self, path: Path) -> None:
        assert INotify is not None
        self._inotify = INotify()
        self._inotify.add_watch(str(path.parent), flags.MODIFY | flags.CREATE | flags.MOVED_TO)
        self._names = {path.name, f"{path.name}-wal"}
        self._turn = threading.Lock()

    def _changed(self, seconds: float) -> bool:
        """Whether the file was written, waiting up to ``seconds`` (to the microsecond) for an event."""
        wait_readable(self._inotify.fileno(), seconds)
        return any(event.name in self._names for event in self._inotify.read(timeout=0))

    def try_wait(self, seconds: float) -> bool | None:
        """Sleep until the file is written (True) or ``seconds`` pass (False); None at once if
        another thread is waiting here (the caller then polls)."""
        if not self._turn.acquire(blocking=False):
            return None
        try:
            return self._changed(seconds)
        finally:
            self._turn.release()

    def close(self) -> None:
        self._inotify.close()


def watch(path: Path) -> FileWatch | None:
    """A watch on ``path``'s folder, or None where inotify cannot be had (callers poll)."""
    if INotify is None:
        return None
    try:
        return FileWatch(path)
    except OSError as error:  # too many watches, a folder we may not watch, ...
        log.debug("cannot watch %s for changes (%s); polling", path, error)
        return None
