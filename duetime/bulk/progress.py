"""How far a bulk job has come, in rows: counted where the rows are written, told on the driver.

A job calls its ``Progress`` on the driver with what it is doing, the rows done and the rows it
expects (None when it cannot know without reading them all). Rows written inside Spark tasks are
counted by an accumulator (:class:`RowCounter`), which Spark brings back to the driver only as each
task ends: a job of a few large tasks sat at "0 of 200,000" most of its time. So running tasks
also tell the driver their rows as they go, in a UDP datagram per batch to a listener on the
driver's address (best effort: one lost, or a network that drops them, only makes the figure move
later); :func:`watched` runs a Spark action on a thread and reports every half second meanwhile.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: (what the job is doing, rows done, rows in all or None)
Progress = Callable[[str, int, int | None], None]


class _Listener:
    """The driver's end of the running tasks' reports: rows per counter, summed as they arrive."""

    def __init__(self, host: str) -> None:
        self.rows: dict[int, int] = {}
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((host, 0))
        self.address: tuple[str, int] = self._socket.getsockname()[:2]
        threading.Thread(target=self._listen, name="duetime-bulk-rows", daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                said = self._socket.recv(64).split()
                key, rows = int(said[0]), int(said[1])
            except (OSError, ValueError, IndexError):
                continue
            self.rows[key] = self.rows.get(key, 0) + rows


#: One listener for the driver process, started by the first counter (per driver address).
_LISTENERS: dict[str, _Listener] = {}
_KEYS = itertools.count(1)
#: A task's socket for its reports, made on its first report.
_SENDER: list[socket.socket] = []


class RowCounter:
    """Rows done, added to in Spark tasks (``counter.add(n)``; it travels to them with Spark's
    accumulator inside) and read on the driver (``counter.done``): as the tasks end from the
    accumulator, and while they run from their reports to the driver's listener."""

    def __init__(self, spark: Any) -> None:
        self._accumulator = spark.sparkContext.accumulator(0)
        #: The rows expected in all, where the job knows before it reads them (a store's planned
        #: batches are counted); None otherwise.
        self.total: int | None = None
        host = spark.sparkContext.getConf().get("spark.driver.host") or "127.0.0.1"
        self._key = next(_KEYS)
        self._address: tuple[str, int] | None = None
        with contextlib.suppress(OSError):  # no listener: the figure moves as tasks end
            listener = _LISTENERS.get(host) or _LISTENERS.setdefault(host, _Listener(host))
            self._address = listener.address
        self._host = host

    def add(self, rows: int) -> None:
        self._accumulator.add(rows)
        if self._address is None:
            return
        with contextlib.suppress(OSError):
            if not _SENDER:
                family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
                _SENDER.append(socket.socket(family, socket.SOCK_DGRAM))
            _SENDER[0].sendto(f"{self._key} {rows}".encode(), self._address)

    @property
    def done(self) -> int:
        """Rows done: what the ended tasks counted, or more where running tasks said so (never
        more than the rows in all, where known)."""
        ended = int(self._accumulator.value)
        listener = _LISTENERS.get(self._host)
        running = listener.rows.get(self._key, 0) if listener is not None else 0
        done = max(ended, running)
        return min(done, self.total) if self.total is not None else done

    def counted(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Arrow record batches passed on as they are, their rows added (in a Spark task)."""
        for batch in batches:
            self.add(batch.num_rows)
            yield batch

    def reporter(self, what: str, progress: Progress | None) -> Callable[[], None] | None:
        """For :func:`watched`: tells ``progress`` the rows counted so far of :attr:`total`."""
        if progress is None:
            return None
        return lambda: progress(what, self.done, self.total)


def watched(action: Callable[[], T], report: Callable[[], None] | None) -> T:
    """``action()`` (a Spark job) on a thread of its own, ``report()`` every half second until it
    ends and once after; what the action raises is raised here."""
    if report is None:
        return action()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as error:  # re-raised on the driver's thread below
            failure.append(error)

    worker = threading.Thread(target=run, name="duetime-bulk", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
        report()
    if failure:
        raise failure[0]
    return outcome[0]
