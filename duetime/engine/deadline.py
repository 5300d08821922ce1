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
    """The result of ``awaitable``, or :class:`DeadlineExceeded` after ``seconds``.

    What ``asyncio.wait`` does for one task and a timeout, without its sets and extra futures:
    it runs several times a round."""
    task = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(seconds, wake)
    task.add_done_callback(wake)
    try:
        await waiter
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_forget)
    raise DeadlineExceeded(f"{what} did not answer within {seconds:g} s")


def _forget(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome, so asyncio does not report it as never retrieved."""
    with contextlib.suppress(BaseException):
        task.exception()
