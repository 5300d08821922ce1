"""SystemClock.wait: the last stretch of a wait is slept on a thread (asyncio's timers fire up to a
millisecond late); a wait still never ends early, an event still ends it at once, and a cancelled
wait leaves no task behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from duetime import clock
from duetime.clock import SystemClock


async def test_a_wait_never_ends_before_its_timeout() -> None:
    event = asyncio.Event()
    for timeout in (0.0005, 0.0015, clock.FINE_WAIT, 0.0025, 0.01, 0.05):
        started = time.monotonic()
        assert await SystemClock().wait(event, timeout) is False
        assert time.monotonic() - started >= timeout


async def test_an_event_during_the_last_stretch_ends_the_wait_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(clock, "FINE_WAIT", 1.0)  # the whole wait is the thread's stretch
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, event.set)
    started = time.monotonic()
    assert await SystemClock().wait(event, 2.0) is True
    assert time.monotonic() - started < 0.5


async def test_an_event_set_already_or_no_time_left_answers_at_once() -> None:
    event = asyncio.Event()
    assert await SystemClock().wait(event, 0) is False
    event.set()
    assert await SystemClock().wait(event, 10) is True


async def test_a_cancelled_wait_leaves_no_task_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "FINE_WAIT", 0.3)
    waiting = asyncio.create_task(SystemClock().wait(asyncio.Event(), 0.35))
    await asyncio.sleep(0.15)  # inside the thread's stretch
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in others if not t.done()], others


async def test_a_wait_with_a_millisecond_of_slack_ends_in_it_on_asyncios_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dispatcher's lateness budget: ending anywhere in the last millisecond is on time, so no
    thread is asked to sleep the end precisely; never before the slack begins."""

    def no_thread(pid: int) -> None:
        raise AssertionError("a wait with slack used the timer thread")

    monkeypatch.setattr(clock, "_timer_threads", no_thread)
    event = asyncio.Event()
    for timeout in (0.0005, 0.003, 0.02):
        started = time.monotonic()
        assert await SystemClock().wait(event, timeout, slack=clock.TIMER_LATENESS) is False
        waited = time.monotonic() - started
        assert waited >= timeout - clock.TIMER_LATENESS, (timeout, waited)
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await SystemClock().wait(event, 5.0, slack=clock.TIMER_LATENESS) is True
