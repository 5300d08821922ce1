"""What the command line prints, and how its failures end: one line each, never a traceback.

The consoles read no markup: ids, destinations and error texts come from users and may hold
``[brackets]`` that rich would otherwise take for styles (and crash on, after the work was done).
Our own emphasis is passed as styles, never inside the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from typing import Any, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from duetime.errors import CriticalError, DuetimeError, one_line
from duetime.observability.logs import logging_json

T = TypeVar("T")

#: Exit code of a critical error (a circuit breaker tripped): a supervisor should restart.
EXIT_CRITICAL = 3

console = Console(markup=False, highlight=False, soft_wrap=True)
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def table(*columns: str, free: Collection[str] = (), **options: Any) -> Table:
    """A table whose cells never wrap (ids and times stay whole, to copy), except the ``free``
    columns (prose such as an error text), which fold at 60 characters."""
    t = Table(*columns, **options)
    for column in t.columns:
        if column.header in free:
            column.max_width, column.overflow = 60, "fold"
        else:
            column.no_wrap = True
    return t


def show(renderable: Table, *, to: Console | None = None) -> None:
    """Print at the table's natural width, even past the terminal's edge (or 80 columns when
    piped): a cropped id cannot be copied."""
    to = to or console
    width = Measurement.get(to, to.options.update(width=10_000), renderable).maximum
    if width <= to.width:
        to.print(renderable)
        return
    wide = Console(
        file=to.file,
        width=width,
        markup=False,
        highlight=False,
        force_terminal=to.is_terminal,
        color_system=to.color_system,  # type: ignore[arg-type]
    )
    wide.print(renderable)


def columns_text(headers: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """Rows as plain columns two spaces apart (and ``headers`` above them, if given): for listings
    of thousands of rows, which a drawn table takes seconds a page to lay out (it measures every
    cell; 100,000 schedules took 442 s). Widths are the page's own, in terminal cells."""
    every = [[_printable(t) for t in row] for row in ([headers, *rows] if headers is not None else rows)]
    if not every:
        return ""
    widths = [max(cell_len(row[i]) for row in every) for i in range(len(every[0]))]
    lines = [
        "  ".join(text + " " * (widths[i] - cell_len(text)) for i, text in enumerate(row)).rstrip()
        for row in every
    ]
    return "\n".join(lines) + "\n"


def _printable(text: str) -> str:
    """``text``, its control characters written as escapes (a terminal would obey them)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


@contextlib.contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar on stderr for long work (hidden when stderr is not a terminal); yields ``advance(n)``."""
    with Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def say(label: str, style: str, text: str, *, to: Console = console) -> None:
    """``label`` in ``style``, then ``text`` exactly as given."""
    to.print(Text.assemble((label, style), " ", text))


def fail(text: str, *, code: int = 1, label: str = "error:") -> typer.Exit:
    """Print one red line and return the exit to raise (``raise fail(...)``); a JSON record with
    the exit code instead when the command logs JSON (``--log-format json``)."""
    if logging_json():
        level = logging.CRITICAL if code == EXIT_CRITICAL else logging.ERROR
        logging.getLogger("duetime").log(level, "%s", text, extra={"fields": {"exit_code": code}})
    else:
        say(label, "bold red" if code == EXIT_CRITICAL else "red", text, to=err)
    return typer.Exit(code)


def run_async(work: Callable[[], Awaitable[T]]) -> T:
    """Run async command work; duetime's own errors become one red line (exit 1, or 3 if critical)."""

    async def main() -> T:
        asyncio.get_running_loop().set_exception_handler(_unawaited)
        return await work()

    try:
        return guarded(lambda: asyncio.run(main()))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _unawaited(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """An error nobody awaited, as one warning line instead of asyncio's traceback.

    A broker cut while aiormq opens a connection leaves a future holding "Server connection
    unexpectedly closed" that its own code never reads; asyncio then logs it, traceback and all,
    after duetime has already said what happened (seen once in a full suite run: the long broker
    outage test found "Traceback" in ``duetime run``'s stderr). With debug logging (``-v``) asyncio's own report is kept, traceback included."""
    if logging.getLogger("duetime").isEnabledFor(logging.DEBUG):
        loop.default_exception_handler(context)
        return
    error = context.get("exception")
    what = str(context.get("message") or "unhandled error in the event loop")
    logging.getLogger("duetime.loop").warning(
        "%s%s", what, f": {one_line(error)}" if isinstance(error, BaseException) else ""
    )


def guarded(action: Callable[[], T]) -> T:
    """Run ``action``; a :class:`DuetimeError` becomes one line and an exit code."""
    try:
        return action()
    except CriticalError as error:
        raise fail(str(error), code=EXIT_CRITICAL, label="critical:") from None
    except DuetimeError as error:
        raise fail(str(error)) from None
