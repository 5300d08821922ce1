"""Sleeping on a descriptor to the microsecond (``duetime.backends._readable``): never short,
woken by what arrives, and the same past select's descriptor limit."""

from __future__ import annotations

import os
import select
import threading
import time

import pytest

from duetime.backends._readable import wait_readable


def _waits(fileno: int, seconds: float) -> float:
    started = time.monotonic()
    wait_readable(fileno, seconds)
    return time.monotonic() - started


@pytest.mark.parametrize("past_the_limit", [False, True], ids=["select", "poll"])
def test_a_wait_is_never_short_and_ends_when_something_arrives(
    past_the_limit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if past_the_limit:  # a process with over 1,024 files open: select refuses the descriptor

        def refused(*args: object) -> object:
            raise ValueError("filedescriptor out of range in select()")

        monkeypatch.setattr(select, "select", refused)
    read, write = os.pipe()
    try:
        for seconds in (0.0, 0.0004, 0.0021):
            assert _waits(read, seconds) >= seconds
        threading.Timer(0.05, os.write, (write, b"x")).start()
        assert _waits(read, 30.0) < 10  # woken by the byte, not the timeout
        assert _waits(read, 30.0) < 1  # still readable: at once
    finally:
        os.close(read)
        os.close(write)
