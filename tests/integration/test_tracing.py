"""OpenTelemetry spans for storing and forwarding, with the real SDK collecting them in memory:
a SQLite store delivering into its own queue (exactly-once) and into a separate one
(at-least-once), the front door, and the producer's `traceparent` reaching the consumer unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import duetime
from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, FrontDoor, TransactionMode
from duetime.backends.sqlite import SqliteQueueTransport, SqliteStore, SyncSqliteQueue, SyncSqliteStore

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    """The SDK, as an application (or `opentelemetry-instrument`) would configure it; set once per
    process, as OpenTelemetry allows."""
    sdk = trace.get_tracer_provider()
    if not isinstance(sdk, TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(sdk)
    yield
    sdk.shutdown()  # the tests after these collect nothing


@pytest.fixture(autouse=True)
def clean() -> None:
    EXPORTER.clear()


def spans(name: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def linked_traces(span: ReadableSpan) -> set[str]:
    return {format(link.context.trace_id, "032x") for link in span.links}


def prepare(db: Path, *queues: str) -> None:
    store = SyncSqliteStore(db)
    store.setup_infrastructure("shop")
    store.close()
    q = SyncSqliteQueue(db)
    for name in queues:
        q.declare(name)
    q.close()


async def test_storing_links_to_the_message_and_stamps_one_without_a_trace(tmp_path: Path) -> None:
    tracer = trace.get_tracer("the web app")
    async with duetime.connect(f"sqlite:///{tmp_path / 's.db'}", endpoint="shop") as client:
        traced = await client.schedule("orders", b"1", delay="1h", headers={"traceparent": TRACEPARENT})
        with tracer.start_as_current_span("POST /orders") as request:
            plain = await client.schedule("orders", b"2", delay="1h")
        untraced = await client.schedule("orders", b"3", delay="1h")  # no trace under way: left alone
        stored_traced, stored_plain = await client.get(traced.message_id), await client.get(plain.message_id)
        stored_untraced = await client.get(untraced.message_id)
    assert stored_untraced is not None and "traceparent" not in stored_untraced.headers
    first, second, _ = spans("duetime schedule")
    assert linked_traces(first) == {TRACE_ID}
    assert first.attributes is not None and first.attributes["messaging.destination.name"] == "orders"
    assert stored_traced is not None and stored_traced.headers["traceparent"] == TRACEPARENT  # unchanged
    # No traceparent of its own: it gets the schedule span's, a child of the request's span.
    assert second.parent is not None and second.parent.span_id == request.get_span_context().span_id
    assert stored_plain is not None
    parts = stored_plain.headers["traceparent"].split("-")
    assert parts[1] == format(request.get_span_context().trace_id, "032x")
    assert parts[2] == format(second.context.span_id, "016x")


@pytest.mark.parametrize("mode", [TransactionMode.EXACTLY_ONCE, TransactionMode.AT_LEAST_ONCE])
async def test_forwarding_a_batch_makes_one_span_linked_to_each_traced_message(
    tmp_path: Path, mode: TransactionMode
) -> None:
    db = tmp_path / "f.db"
    prepare(db, "orders")
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    sync = SyncSqliteStore(db)
    sync.initialize("shop", TransactionMode.AT_LEAST_ONCE)
    due = datetime.now(UTC) - timedelta(seconds=1)
    sync.store_many(
        [
            DelayedMessage("a", "orders", due, b"a", {"traceparent": TRACEPARENT}),
            DelayedMessage("b", "orders", due, b"b", {"traceparent": other, "tracestate": "k=v"}),
            DelayedMessage("c", "orders", due, b"c"),
        ]
    )
    sync.close()
    EXPORTER.clear()
    # At-least-once needs a transport that is not the store's own queue: a second file.
    target = db if mode is TransactionMode.EXACTLY_ONCE else tmp_path / "target.db"
    prepare(target, "orders")
    async with SqliteStore(SyncSqliteStore(db)) as store, SqliteQueueTransport(target) as transport:
        dispatcher = Dispatcher(
            store, transport, DelayedDeliverySettings(transaction_mode=mode), endpoint="shop"
        )
        await dispatcher.run_burst()
    (forward,) = spans("duetime forward")
    assert linked_traces(forward) == {TRACE_ID, "1" * 32}
    assert forward.attributes is not None and forward.attributes["messaging.batch.message_count"] == 3
    assert forward.start_time is not None and forward.end_time is not None
    assert forward.start_time <= forward.end_time
    with SyncSqliteQueue(target) as queue:
        received = {m.message_id: m.headers for m in queue.receive("orders", 10, 1.0)}
    assert received["a"]["traceparent"] == TRACEPARENT
    assert received["b"]["traceparent"] == other and received["b"]["tracestate"] == "k=v"
    assert "traceparent" not in received["c"]  # stored without one: none added on the way


async def test_a_batch_without_traced_messages_makes_no_span(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    prepare(db, "orders")
    sync = SyncSqliteStore(db)
    sync.initialize("shop", TransactionMode.AT_LEAST_ONCE)
    sync.store(DelayedMessage("x", "orders", datetime.now(UTC) - timedelta(seconds=1), b"x"))
    sync.close()
    async with SqliteStore(SyncSqliteStore(db)) as store, SqliteQueueTransport(db) as transport:
        dispatcher = Dispatcher(store, transport, endpoint="shop")
        await dispatcher.run_burst()
    assert dispatcher.stats.forwarded == 1
    assert spans("duetime forward") == []


async def test_the_front_door_makes_a_schedule_span_for_what_it_stores(tmp_path: Path) -> None:
    db = tmp_path / "door.db"
    prepare(db, "orders")
    store, transport = SqliteStore(SyncSqliteStore(db)), SqliteQueueTransport(db)
    dispatcher = Dispatcher(store, transport, endpoint="shop")
    door = FrontDoor(dispatcher, transport, wait=0.05)
    await dispatcher.start()
    await door.start()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    envelope = DelayedMessage(
        "e1",
        "shop.Timeouts",
        datetime.now(UTC),
        b"1",
        {"duetime-route-to": "orders", "duetime-deliver-at": later, "traceparent": TRACEPARENT},
    )
    with SyncSqliteQueue(db) as queue:
        assert queue.send([envelope]) == [None]
    assert await door.process_once() == 1
    (stored_span,) = spans("duetime schedule")
    assert linked_traces(stored_span) == {TRACE_ID}
    stored = await store.get("e1")
    assert stored is not None and stored.headers["traceparent"] == TRACEPARENT
    dispatcher.stop()
    await store.close()
    await transport.close()
