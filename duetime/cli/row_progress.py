"""A bulk job's progress in rows: a bar on a terminal, a line every few seconds off one.

Its own module, imported when a job runs: Rich's progress bar costs a tenth of the start of every
``duetime`` command that never shows one.
"""

from __future__ import annotations

import time

from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from duetime.cli.terminal import err
from duetime.inputs.durations import readable_duration


def _per_second(rate: float) -> str:
    """``52,310 rows/s``; below ten a second with a decimal (a small job read "0 rows/s")."""
    return f"{rate:,.0f} rows/s" if rate >= 10 else f"{rate:.1f} rows/s"


class _Rate(ProgressColumn):
    """Rows a second over the job's wall time, as the line off a terminal says it. (Rich's own
    speed is over the last updates: rows counted in a jump as a task ends read as "936,982
    rows/s" for a job that did 4,500 a second.)"""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        return Text(_per_second(task.completed / elapsed) if elapsed > 0 and task.completed else "")


class _Left(ProgressColumn):
    """The time left at the job's rate so far (see :class:`_Rate`)."""

    def render(self, task: Task) -> Text:
        elapsed, done = task.elapsed or 0.0, task.completed
        if not task.total or not done or elapsed <= 0 or done >= task.total:
            return Text("")
        return Text(f"about {readable_duration((task.total - done) / (done / elapsed))} left")


class RowReport:
    """A job's progress in rows: rows done of rows in all, the rate and the time left, as a bar on a
    terminal and as a line every :data:`LOG_EVERY` seconds (and a last one) off one."""

    #: Off a terminal, a line this often.
    LOG_EVERY = 10.0

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Progress | None = None
        self.started = self.logged = time.monotonic()
        self.last: tuple[str, int, int | None] | None = None

    def __enter__(self) -> RowReport:
        if err.is_terminal:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[rows]}"),
                _Rate(),
                _Left(),
                console=err,
            )
            self.task = self.bar.add_task(self.label, total=None, rows="")
            self.bar.start()
        return self

    def __call__(self, what: str, done: int, total: int | None) -> None:
        self.last = (what, done, total)
        if self.bar is not None:
            rows = f"{done:,} of {total:,} rows" if total is not None else f"{done:,} rows"
            self.bar.update(self.task, description=what, completed=done, total=total, rows=rows)
        elif time.monotonic() - self.logged >= self.LOG_EVERY:
            self.logged = time.monotonic()
            self._line()

    def _line(self) -> None:
        assert self.last is not None
        what, done, total = self.last
        seconds = max(time.monotonic() - self.started, 1e-9)
        rate = done / seconds
        line = (
            f"{what}: {done:,} of {total:,} rows ({done / total:.0%})" if total else f"{what}: {done:,} rows"
        )
        line += f", {_per_second(rate)}"
        if total and rate > 0 and done < total:
            line += f", about {readable_duration((total - done) / rate)} left"
        err.print(line, markup=False, highlight=False)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif self.last is not None and kind is None:  # a failed job's one line says what happened
            self._line()
