"""Deadlines for calls that cross the network.

A partition does not reset a connection; it just stops answering, and a call without a deadline
then waits forever while no circuit breaker ever sees a failure. :func:`within` gives a call a
deadline and, when it passes, walks away from it: the call is cancelled but not waited for (a
driver cancelling a query on a dead link may itself wait for the link), and whatever it still
does is at-least-once safe (a claim that lands late expires; a send that lands late is sent again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from duetime.errors import DeadlineExceeded

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """The result of ``awaitable``, or :class:`DeadlineExceeded` after ``seconds``."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_forget)
    raise DeadlineExceeded(f"{what} did not answer within {seconds:g} s")


def _forget(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome, so asyncio does not report it as never retrieved."""
    with contextlib.suppress(BaseException):
        task.exception()
