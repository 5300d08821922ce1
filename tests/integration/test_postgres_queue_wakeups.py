"""A PostgreSQL queue receiver sleeps on the queue channel's NOTIFY instead of polling: it wakes
when a message is put in its queue (by a sender, or by a dispatcher's exactly-once move), not for
other queues, and costs next to nothing while it waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode
from duetime.backends.postgres import PostgresQueueTransport, PostgresStore, SyncPostgresQueue
from tests.services import postgres_schema

pytestmark = pytest.mark.slow


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema() as pg:
        queue = SyncPostgresQueue.from_url(pg)
        for name in ("orders", "other"):
            queue.declare(name)
        queue.close()
        yield pg


def message(i: int, destination: str = "orders") -> DelayedMessage:
    return DelayedMessage(f"m{i}", destination, datetime.now(UTC))


def send_later(url: str, seconds: float, *messages: DelayedMessage) -> threading.Thread:
    def go() -> None:
        time.sleep(seconds)
        sender = SyncPostgresQueue.from_url(url)
        assert sender.send(list(messages)) == [None] * len(messages)
        sender.close()

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_a_waiting_receiver_wakes_when_its_queue_gets_a_message(url: str) -> None:
    receiver = SyncPostgresQueue.from_url(url)
    sender = send_later(url, 0.5, message(1, "other"), message(2, "other"))  # not its queue
    later = send_later(url, 1.0, message(3))
    started = time.monotonic()
    got = receiver.receive("orders", 10, wait=10)
    waited = time.monotonic() - started
    assert [m.message_id for m in got] == ["m3"]
    assert 0.9 < waited < 1.5, waited
    sender.join()
    later.join()
    receiver.close()


def test_an_idle_receiver_costs_next_to_nothing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling every 20 ms made 150 round trips in 3 s; asleep on the channel it looks a few times.

    Counted in statements sent, not CPU seconds: the 20 ms of CPU the few looks cost here on a
    quiet machine became 22-44 ms on a loaded one, and the promise is about the round trips."""
    import psycopg

    sent: list[object] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(args[0] if args else None)
        return execute(self, *args, **kwargs)

    receiver = SyncPostgresQueue.from_url(url)
    try:
        receiver.receive("orders", 10, wait=0.1)  # connections opened, LISTEN issued
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        assert receiver.receive("orders", 10, wait=3) == []
        assert 1 <= len(sent) <= 10, sent  # 5 here: a look at the start and per capped wait, not 150
    finally:  # a failure here must not leave its connections to fail the next test
        monkeypatch.undo()
        receiver.close()


async def test_an_exactly_once_move_wakes_the_receiver(url: str) -> None:
    store, transport = PostgresStore.from_url(url), PostgresQueueTransport.from_url(url)
    dispatcher = Dispatcher(
        store,
        transport,
        DelayedDeliverySettings(transaction_mode=TransactionMode.EXACTLY_ONCE),
        endpoint="wake",
    )
    await store.setup_infrastructure("wake")
    await store.initialize("wake", TransactionMode.EXACTLY_ONCE)
    await store.store(DelayedMessage("due", "orders", datetime.now(UTC) - timedelta(seconds=1)))
    receiver = SyncPostgresQueue.from_url(url)
    got: list[str] = []
    waiting = threading.Thread(
        target=lambda: got.extend(m.message_id for m in receiver.receive("orders", 10, 10))
    )
    waiting.start()
    time.sleep(0.5)  # asleep on the channel by now
    started = time.monotonic()
    await dispatcher.run_burst()
    waiting.join()
    assert got == ["due"]
    assert time.monotonic() - started < 0.5
    receiver.close()
    await store.close()
    await transport.close()
