"""An error no code awaited is one warning line, never asyncio's traceback (``duetime run``'s
stderr during a broker cut: a driver's future holding "Server connection unexpectedly closed")."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator

import pytest

from duetime.cli.terminal import run_async


def _abandon_a_failed_future() -> None:
    future = asyncio.get_running_loop().create_future()
    try:
        raise ConnectionError("Server connection unexpectedly closed.\nRead 0 bytes but 1 bytes expected")
    except ConnectionError as error:
        future.set_exception(error)
    del future


async def _work() -> str:
    _abandon_a_failed_future()
    gc.collect()  # the future is reported as it is collected
    await asyncio.sleep(0)
    return "done"


@pytest.fixture
def duetime_level() -> Iterator[logging.Logger]:
    logger = logging.getLogger("duetime")
    before = logger.level
    yield logger
    logger.setLevel(before)


def test_an_error_nobody_awaited_is_one_warning_line(
    caplog: pytest.LogCaptureFixture, duetime_level: logging.Logger
) -> None:
    duetime_level.setLevel(logging.INFO)
    gc.collect()  # what earlier tests in this process left to the collector is reported now, not below
    with caplog.at_level(logging.WARNING):
        assert run_async(_work) == "done"
    # (only this test's future: one another test in this process left may be collected here too)
    [record] = [r for r in caplog.records if r.name == "duetime.loop" and "unexpectedly" in r.getMessage()]
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "Future exception was never retrieved: ConnectionError: Server connection unexpectedly closed."
    )
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.WARNING]


def test_with_debug_logging_asyncio_reports_it_whole(
    caplog: pytest.LogCaptureFixture, duetime_level: logging.Logger
) -> None:
    duetime_level.setLevel(logging.DEBUG)
    with caplog.at_level(logging.DEBUG):
        run_async(_work)
    [record] = [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert record.exc_info is not None
