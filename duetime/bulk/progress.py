"""How far a bulk job has come, in rows: counted where the rows are written, told on the driver.

A job calls its ``Progress`` on the driver with what it is doing, the rows done and the rows it
expects (None when it cannot know without reading them all). Rows written inside Spark tasks are
counted by an accumulator (:class:`RowCounter`), which Spark brings back to the driver as each task
ends; :func:`watched` runs a Spark action on a thread and reports every half second meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: (what the job is doing, rows done, rows in all or None)
Progress = Callable[[str, int, int | None], None]


class RowCounter:
    """Rows done, added to in Spark tasks (``counter.add(n)``; it travels to them with Spark's
    accumulator inside) and read on the driver (``counter.done``) as the tasks end."""

    def __init__(self, spark: Any) -> None:
        self._accumulator = spark.sparkContext.accumulator(0)
        #: The rows expected in all, where the job knows before it reads them (a store's planned
        #: batches are counted); None otherwise.
        self.total: int | None = None

    def add(self, rows: int) -> None:
        self._accumulator.add(rows)

    @property
    def done(self) -> int:
        return int(self._accumulator.value)

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
