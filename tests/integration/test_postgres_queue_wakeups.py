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


def test_a_receiver_that_took_all_there_was_asks_again_only_when_woken(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look that took less than it could found everything: the next receive sleeps on the
    channel without asking "anything new?" (answered "no" once per message at a steady rate)."""
    import psycopg

    asked: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "UPDATE" in str(query):  # a receive's question (an acknowledgement is a DELETE)
            asked.append(str(query))
        return execute(self, query, *args, **kwargs)

    receiver = SyncPostgresQueue.from_url(url)
    sender = SyncPostgresQueue.from_url(url)
    try:
        receiver.recheck = 10.0  # (the look for ended visibility timeouts stays out of the way)
        sender.send([message(1), message(2)])
        assert [m.message_id for m in receiver.receive("orders", 10, wait=0.1)] == ["m1", "m2"]
        assert receiver.receive("orders", 10, wait=0.1) == []  # listening from here on
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        assert receiver.receive("orders", 10, wait=0.3) == []
        assert asked == []  # nothing was put in the queue: nothing asked
        later = send_later(url, 0.2, message(3))
        got = receiver.receive("orders", 10, wait=5)
        later.join()
        assert [m.message_id for m in got] == ["m3"]
        assert len(asked) == 1, asked  # woken once, asked once
    finally:
        monkeypatch.undo()
        receiver.close()
        sender.close()


def test_receivers_of_two_queues_sharing_one_queue_object_each_wake_for_their_own(url: str) -> None:
    """Only one receiver sleeps on the channel at a time and reads every queue's wake-ups; the
    others poll and see theirs counted, so none waits for the once-a-second recheck."""
    shared = SyncPostgresQueue.from_url(url)
    got: dict[str, float] = {}

    def receive(queue: str) -> None:
        for m in shared.receive(queue, 10, wait=5):
            got[m.message_id] = time.monotonic()

    try:
        shared.receive("orders", 10, wait=0.1)  # listening
        threads = [threading.Thread(target=receive, args=(q,)) for q in ("orders", "other")]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # one asleep on the channel, the other polling
        sent_at = time.monotonic()
        sender = send_later(url, 0.0, message(1, "orders"), message(2, "other"))
        for thread in threads:
            thread.join()
        sender.join()
        assert set(got) == {"m1", "m2"}
        assert max(got.values()) - sent_at < 0.5, {k: v - sent_at for k, v in got.items()}
    finally:
        shared.close()


def test_a_message_whose_receipt_ran_out_is_found_by_a_waiting_receiver(url: str) -> None:
    """No wake-up comes when a visibility timeout ends: a receiver that found its queue empty
    looks again after ``recheck`` seconds, even though nothing woke it."""
    from duetime.backends.postgres.connection import PgOptions

    with SyncPostgresQueue(PgOptions.from_url(url), visibility_timeout=timedelta(seconds=0.5)) as queue:
        queue.recheck = 0.5
        queue.send([message(1)])
        first = queue.receive("orders", 10, wait=0.1)  # taken, never acknowledged
        assert [m.message_id for m in first] == ["m1"]
        assert queue.receive("orders", 10, wait=0.1) == []  # listening, and found nothing
        started = time.monotonic()
        again = queue.receive("orders", 10, wait=5)
        assert [(m.message_id, m.delivery_count) for m in again] == [("m1", 2)]
        assert time.monotonic() - started < 1.5


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
