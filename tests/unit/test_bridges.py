"""The bridges' own rules, without a broker: what a Celery publish becomes in the store and back,
and which Dramatiq enqueues the bridge keeps (Dramatiq's StubBroker, the memory store)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from datetime import UTC, datetime, timedelta

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from kombu import Exchange, Queue

from duetime.backends.celery.envelope import PUBLISH_HEADER, CeleryPublish, unprefixed, without_delay
from duetime.backends.celery.transport import CeleryTransport, queue_from_spec
from duetime.backends.dramatiq.transport import DramatiqTransport
from duetime.bridges.celery import eta_of, stored_publish
from duetime.bridges.dramatiq import install
from duetime.errors import ConfigurationError, InvalidMessage
from duetime.message import DelayedMessage


def test_a_publish_is_kept_as_celery_serialized_it_and_leaves_with_the_stored_due_time() -> None:
    queue = Queue("orders", Exchange("orders", type="direct"), routing_key="orders", max_priority=5)
    headers = {"id": "t1", "task": "shop.ship", "eta": "2026-01-01T00:00:00+00:00", "retries": 0}
    body, publish, destination = stored_publish(
        ((1, 2), {"x": "y"}, {"callbacks": None}),
        {
            "exchange": "",
            "routing_key": "orders",
            "serializer": "json",
            "compression": "zlib",
            "headers": headers,
            "declare": [queue],
            "delivery_mode": 2,
            "correlation_id": "t1",
            "reply_to": "",
            "retry": True,
            "retry_policy": {"max_retries": 3},
        },
    )
    assert destination == "orders"
    assert publish.headers["compression"] == "application/x-gzip"
    import zlib

    assert json.loads(zlib.decompress(body)) == [[1, 2], {"x": "y"}, {"callbacks": None}]
    assert "retry" not in publish.properties and publish.properties["correlation_id"] == "t1"
    back = CeleryPublish.from_header(publish.to_header())
    assert back == publish
    due = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert back.due(due).headers["eta"] == due.isoformat()
    rebuilt = queue_from_spec(back.declare or {})
    assert (rebuilt.name, rebuilt.exchange.name, rebuilt.max_priority) == ("orders", "orders", 5)


def test_a_native_delayed_routing_key_leaves_with_no_delay() -> None:
    key = "0." * 20 + "1.0.1.0.0.0.0.1." + "celery"
    assert unprefixed(key) == "celery"
    assert without_delay(key) == "0." * 28 + "celery"
    assert without_delay("celery") == "celery"


def test_naive_etas_are_in_the_apps_timezone() -> None:
    assert eta_of("2026-01-01T10:00:00", UTC) == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert eta_of(None, UTC) is None


def test_a_message_not_stored_by_the_bridge_is_refused_with_a_reason() -> None:
    with pytest.raises(InvalidMessage, match="not stored by the duetime Celery bridge"):
        CeleryPublish.from_header(None)


def test_broker_urls() -> None:
    celery = CeleryTransport.from_url("celery+amqp://guest:guest@localhost:5672//?heartbeat=0")
    assert celery.broker_url == "amqp://guest:guest@localhost:5672//"
    assert celery.transport_options == {"heartbeat": 0, "confirm_publish": True}
    assert CeleryTransport.from_url("celery+redis://localhost/1").transport_options == {}
    dq = DramatiqTransport.from_url("dramatiq+redis://localhost:6379/0?namespace=shop")
    assert (dq.broker_url, dq.namespace) == ("redis://localhost:6379/0", "shop")
    with pytest.raises(ConfigurationError, match="max_priority"):
        DramatiqTransport.from_url("dramatiq+amqp://localhost?max_priority=x")
    with pytest.raises(
        ConfigurationError,
        match=r"Unknown Dramatiq URL option\(s\) \[.prefetch.\] in dramatiq\+amqp://localhost\?prefetch=1; known: max_priority, namespace",
    ):
        DramatiqTransport.from_url("dramatiq+amqp://localhost?prefetch=1")


@pytest.fixture
def stub() -> StubBroker:
    broker = StubBroker()
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    return broker


def test_dramatiq_delays_are_stored_and_the_rest_goes_to_the_broker(stub: StubBroker) -> None:
    bridge = install(stub, "memory://", min_delay=1)

    @dramatiq.actor(queue_name="mail", broker=stub)
    def send_mail(to: str) -> None: ...

    kept = send_mail.send_with_options(args=("a@example.com",), delay=60_000)
    assert kept.options["eta"] >= int(time.time() * 1000) + 59_000
    send_mail.send_with_options(args=("b@example.com",), delay=500)  # under min_delay: Dramatiq's own
    send_mail.send("c@example.com")
    eta = datetime.now(UTC) + timedelta(minutes=5)
    by_eta = send_mail.send_with_options(args=("d@example.com",), eta=eta)
    assert stub.queues["mail"].qsize() == 1 and stub.queues["mail.DQ"].qsize() == 1
    page = bridge.client.get().list(limit=10)
    assert {m.message_id for m in page.messages} == {kept.message_id, by_eta.message_id}
    [stored] = [m for m in page.messages if m.message_id == kept.message_id]
    body = dramatiq.Message.decode(stored.body)
    assert body.queue_name == "mail" and "eta" not in body.options and stored.group == kept.message_id
    assert bridge.reschedule(kept.message_id, delay=10) == 1
    assert bridge.cancel(kept.message_id) == 1 and bridge.cancel(kept.message_id) == 0
    bridge.close()


def test_the_dramatiq_transport_sends_error_copies_to_the_error_queue_as_they_are() -> None:
    message = dramatiq.Message(
        queue_name="mail", actor_name="send_mail", args=("x",), kwargs={}, options={}, message_id="m1"
    )
    stored = DelayedMessage.create("mail", message.encode(), delay=0, message_id="m1")
    assert DramatiqTransport._message_of(stored).queue_name == "mail"
    elsewhere = stored.with_changes(destination="other")
    with pytest.raises(InvalidMessage, match="is for queue 'mail'"):
        DramatiqTransport._message_of(elsewhere)
    error = stored.with_changes(destination="duetime.errors", headers={"duetime-error-type": "x"})
    copy = DramatiqTransport._message_of(error)
    assert copy.queue_name == "duetime.errors" and copy.options["duetime_error"]["duetime-error-type"] == "x"
    assert PUBLISH_HEADER == "celery-publish"


@pytest.mark.parametrize(
    ("target", "store", "said"),
    [
        ("celery", "postgress://db/app", "Did you mean postgres://?"),
        ("celery", 5, "is not a backend URL"),
        ("celery", "duetime.db", "is not a backend URL"),
        ("dramatiq", "garbage://x", "No store for URL scheme 'garbage'"),
    ],
)
def test_a_wrong_store_is_said_when_the_bridge_is_installed(target: str, store: object, said: str) -> None:
    """Not at the first delayed task, deep in a worker (the client opens lazily, once per process)."""
    from celery import Celery

    from duetime.bridges import celery as celery_bridge
    from duetime.bridges import dramatiq as dramatiq_bridge

    with pytest.raises(ConfigurationError, match=re.escape(said)):
        if target == "celery":
            celery_bridge.install(Celery("t", broker="memory://"), store=store)  # type: ignore[arg-type]
        else:
            dramatiq_bridge.install(StubBroker(), store=store)  # type: ignore[arg-type]


def test_install_says_what_it_takes() -> None:
    from duetime.bridges import celery as celery_bridge
    from duetime.bridges import dramatiq as dramatiq_bridge

    with pytest.raises(ConfigurationError, match=r"takes a Celery app \(celery.Celery\(...\)\), got str"):
        celery_bridge.install("app", store="sqlite:///x.db")
    with pytest.raises(ConfigurationError, match=r"takes a Dramatiq broker .*, got Celery"):
        from celery import Celery

        dramatiq_bridge.install(Celery("t"), store="sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="endpoint name 'a b' is not allowed"):
        dramatiq_bridge.install(StubBroker(), store="sqlite:///x.db", endpoint="a b")


async def test_the_broker_transports_share_the_blocking_drivers_thread_pool() -> None:
    """Celery's and Dramatiq's transports ran their own thread pools: a call after close failed
    with the executor's "cannot schedule new futures after shutdown". They use the one pool every
    blocking driver uses, and say what every closed transport says."""
    from duetime.errors import TransportUnavailable

    for transport in (
        CeleryTransport.from_url("celery+amqp://guest:guest@localhost:5672//"),
        DramatiqTransport.from_url("dramatiq+redis://localhost:6379/0"),
    ):
        await transport.close()
        await transport.close()  # a second close does nothing
        with pytest.raises(TransportUnavailable, match="The transport is closed"):
            await transport.start()


async def test_a_polled_store_tells_of_a_later_next_due_once_the_earlier_one_has_gone() -> None:
    """A store that cannot be told (MariaDB; PostgreSQL behind a pooler) is asked its next due time
    every interval. Seen t1, then (t1 delivered, t2 stored between two looks) t2 later than t1: the
    dispatcher sleeping toward nothing must hear of t2, or it sleeps its whole minute."""
    from duetime.backends._on_a_thread import Subscribers, poll_next_due

    t1 = datetime(2030, 1, 1, tzinfo=UTC)
    answers = iter([t1, t1, t1 + timedelta(seconds=5), None, t1])
    told: list[datetime | None] = []
    subscribers = Subscribers()
    subscribers.add(told.append)

    def next_due() -> datetime | None:
        try:
            return next(answers)
        except StopIteration:
            raise asyncio.CancelledError from None

    with contextlib.suppress(asyncio.CancelledError):
        await poll_next_due(next_due, 0.001, subscribers)
    assert told == [t1, t1 + timedelta(seconds=5), t1]


def test_send_each_keeps_what_was_sent_and_sorts_each_failure_by_what_the_broker_said() -> None:
    """One message at a time: the broker's refusal of one (an AMQP reply code, wrapped or not)
    fails it alone; a connection lost without a code, or one that cannot be opened again, is an
    outage for it and everything after it, never for what went before."""
    from datetime import UTC, datetime

    from duetime import DelayedMessage
    from duetime.backends.refusals import send_each
    from duetime.errors import InvalidMessage, MessageRefused, TransportError, TransportUnavailable

    class Closed(Exception):
        def __init__(self, reply_code: int) -> None:
            super().__init__(reply_code, "closed")
            self.reply_code = reply_code

    class Wrapped(Exception):  # Dramatiq wraps pika's error as its first argument
        pass

    batch = [DelayedMessage(f"m{i}", "q", datetime(2030, 1, 1, tzinfo=UTC)) for i in range(7)]
    said: dict[str, BaseException] = {
        "m1": Closed(503),  # COMMAND_INVALID: the broker closed the connection on this one
        "m2": Wrapped(Closed(403)),
        "m3": InvalidMessage("not a task"),
        "m4": ValueError("odd"),
        "m5": ConnectionError("reset by peer"),
    }
    sent, resets = [], []

    def send(m: DelayedMessage) -> None:
        if m.message_id in said:
            raise said[m.message_id]
        sent.append(m.message_id)

    results = send_each(batch, send, outages=(ConnectionError,), reset=lambda: resets.append(1), broker="b")
    assert sent == ["m0"]
    assert results[0] is None
    assert isinstance(results[1], MessageRefused) and isinstance(results[2], MessageRefused)
    assert isinstance(results[3], InvalidMessage)
    assert type(results[4]) is TransportError
    assert all(isinstance(r, TransportUnavailable) for r in results[5:])  # m5 and m6: an outage
    said = {"m0": TransportUnavailable("cannot connect")}
    again = send_each(batch[:3], send, outages=(ConnectionError,), reset=lambda: None, broker="b")
    assert [str(r) for r in again] == ["cannot connect"] * 3
