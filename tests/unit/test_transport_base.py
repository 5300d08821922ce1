"""The async client transport base: what every transport on it does the same (the webhook and
MQTT transports run the transport contract against real servers; this holds the base's own
rules with a client of the test's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime

import pytest

from duetime.backends.transport_base import AsyncClientTransport
from duetime.errors import MessageRefused, TransportUnavailable
from duetime.message import DelayedMessage


class Client(AsyncClientTransport):
    """Answers each message when the test says; refuses a destination named "refused" at hand-over."""

    def __init__(self) -> None:
        self.opened = self.let_go = 0
        self.answers: dict[str, asyncio.Future[Exception | None]] = {}
        self.ready_error: Exception | None = None

    async def _open(self) -> None:
        self.opened += 1

    async def _let_go(self) -> None:
        self.let_go += 1

    async def _ready(self) -> None:
        if self.ready_error is not None:
            raise self.ready_error

    def _hand_over(self, message: DelayedMessage) -> Awaitable[Exception | None]:
        if message.destination == "refused":
            raise MessageRefused("not this one")
        answer: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.answers[message.message_id] = answer
        return answer

    async def declare(self, queue: str) -> None:
        pass


def message(i: int, destination: str = "q") -> DelayedMessage:
    return DelayedMessage(f"m{i}", destination, datetime(2026, 1, 1, tzinfo=UTC), b"x")


async def test_a_batch_is_handed_over_whole_before_any_answer_is_awaited() -> None:
    client = Client()
    await client.start()
    sending = asyncio.ensure_future(client.send_batch([message(1), message(2, "refused"), message(3)]))
    await asyncio.sleep(0)
    assert set(client.answers) == {"m1", "m3"}  # both handed over, neither answered yet
    client.answers["m3"].set_result(None)
    client.answers["m1"].set_result(TransportUnavailable("lost"))
    first, second, third = await sending
    assert isinstance(first, TransportUnavailable)
    assert isinstance(second, MessageRefused) and str(second) == "not this one"
    assert third is None


async def test_a_batch_that_cannot_go_fails_whole_and_hands_nothing_over() -> None:
    client = Client()
    client.ready_error = TransportUnavailable("not connected")
    with pytest.raises(TransportUnavailable, match="not connected"):
        await client.send_batch([message(1)])
    assert client.answers == {}


async def test_an_unforeseen_failure_leaves_nothing_running() -> None:
    client = Client()
    sending = asyncio.ensure_future(client.send_batch([message(1), message(2)]))
    await asyncio.sleep(0)
    client.answers["m1"].set_exception(RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await sending
    assert client.answers["m2"].cancelled()


async def test_a_closed_transport_says_so_and_a_second_close_does_nothing() -> None:
    client = Client()
    await client.start()
    await client.close()
    await client.close()
    assert (client.opened, client.let_go) == (1, 1)
    for call in (client.start(), client.send_batch([message(1)])):
        with pytest.raises(TransportUnavailable, match="The transport is closed"):
            await call
