"""A message its broker can never carry is that message's failure, never an outage.

On RabbitMQ a header table over the frame size made the broker close the connection: duetime took
it for an outage, the other messages of the batch went again and again, and after the breaker the
process exited 3, on every restart. On NATS a header it refuses (or would change) failed the
publish and the dead-letter publish the same way, for ever. Now each is refused before it is
sent; the rest of its batch is delivered once; the error queue takes it where it can, and where
it cannot (the same limits) it stays stored, its failure counted and tried again an hour later.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedDeliverySettings, DelayedMessage, Dispatcher, TransactionMode, open_store
from duetime.clock import SYSTEM
from duetime.error_headers import ERROR_MESSAGE, kept_in_store
from duetime.message import MAX_BODY_BYTES
from duetime.operations.retry_or_discard import discard, goes_to, send_back, take
from tests.conftest import run_cli
from tests.integration.conftest import cleanup, open_broker
from tests.services import RABBITMQ

pytestmark = pytest.mark.slow


def refused_on(kind: str) -> dict[str, dict[str, str] | bytes]:
    """Per broker, messages it can never carry: headers (or a body) by what is wrong with them."""
    if kind == "rabbitmq":
        return {
            "a 200 KB header (over the frame size)": {"big": "x" * 200_000},
            "a header name over 128 bytes (cut by the client)": {"n" * 200: "v"},
            "a body over the broker's max_message_size": b"y" * 5000,
        }
    return {
        "a header name with a space": {"bad name": "v"},
        "a header name with a colon": {"a:b": "v"},
        "a header name that is not ASCII": {"ünï": "v"},
        "a header value with CR/LF": {"x": "a\r\nInjected: 1"},
        "a header value with spaces around it": {"x": " padded "},
        "JetStream's own header": {"Nats-Msg-Id": "mine"},
        "JetStream's expectations": {"Nats-Expected-Stream": "other"},
        "a body over the server's max_payload": b"z" * (1024 * 1024 + 10),
    }


@pytest.mark.parametrize("broker", ["rabbitmq", "nats"], indirect=True)
async def test_a_message_the_broker_can_never_carry_fails_alone(
    broker: tuple[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kind, transport = broker
    if kind == "rabbitmq":
        transport.max_message_size = 4096  # as `?max_message_size=4096` would
    tag = f"{kind}{id(transport) % 100000}"
    queue, error_queue = f"uncarried.{tag}", f"uncarried.error.{tag}"
    await transport.declare(queue)
    await transport.declare(error_queue)
    store = open_store(f"sqlite:///{tmp_path}/u.db")
    await store.setup_infrastructure("u")
    await store.initialize("u", TransactionMode.AT_LEAST_ONCE)
    settings = DelayedDeliverySettings(
        error_queue=error_queue, transaction_mode=TransactionMode.AT_LEAST_ONCE, number_of_retries=3
    )
    try:
        good = [
            DelayedMessage.create(queue, f"good {i}".encode(), delay=0, headers={"i": str(i)})
            for i in range(3)
        ]
        bad = {
            why: DelayedMessage.create(
                queue,
                what if isinstance(what, bytes) else b"bad",
                delay=0,
                headers=what if isinstance(what, dict) else {},
            )
            for why, what in refused_on(kind).items()
        }
        await store.store_many([good[0], *bad.values(), good[1], good[2]])
        dispatcher = Dispatcher(store, transport, settings, endpoint="u")
        before = SYSTEM.now()
        stats = await dispatcher.run_burst()
        assert stats.forwarded == 3
        got = await transport.receive(queue, 20, 2.0)
        assert sorted(m.body for m in got) == [b"good 0", b"good 1", b"good 2"]  # once each
        assert await transport.receive(queue, 20, 0.5) == []
        await transport.acknowledge(got)
        for why, message in bad.items():
            kept = await store.get(message.message_id)
            assert kept is not None, why
            assert kept.failure_count == 1, why
            assert kept.due_at > before + timedelta(minutes=59), why  # put aside, not retried at once
            assert kept.body == message.body and dict(kept.headers) == dict(message.headers), why
        said = [r.getMessage() for r in caplog.records if "can be carried neither" in r.getMessage()]
        assert len(said) == len(bad), said
        assert stats.dead_lettered == 0
        # the error queue holds a notice of each (reason, where it was going; no body, none of its
        # headers): what `errors list` and the dashboard show; retry reschedules, discard cancels
        notices = await transport.peek(error_queue, 50)
        assert sorted(n.message_id for n in notices) == sorted(m.message_id for m in bad.values())
        for n in notices:
            assert kept_in_store(n.headers) and n.body == b""
            assert "cannot carry message" in n.headers[ERROR_MESSAGE]
            assert goes_to(n) == queue
        first, second = (m.message_id for m in list(bad.values())[:2])
        taken, _ = await take(transport, error_queue, [first])
        done = await send_back(store, transport, taken)
        assert done.sent == 1 and (await store.get(first)).due_at <= SYSTEM.now()  # type: ignore[union-attr]
        taken, _ = await take(transport, error_queue, [second])
        assert await discard(store, transport, taken) == 1
        assert await store.get(second) is None
        assert len(await transport.peek(error_queue, 50)) == len(bad) - 2
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("transport", "header", "said"),
    [
        (
            "NATS",
            "Nats-Expected-Stream=other",
            "header 'Nats-Expected-Stream' is one NATS's clients read as their own",
        ),
        ("NATS", "bad name=v", "header name 'bad name' is not allowed on NATS"),
        ("RABBITMQ", "n" * 200 + "=v", "is over AMQP's 128 bytes (it would be cut)"),
    ],
)
def test_schedule_refuses_what_its_transport_could_never_carry(
    tmp_path: Path, transport: str, header: str, said: str
) -> None:
    """Stored, such a message would only fail when due: `schedule` says so at once."""
    from tests import services
    from tests.conftest import run_cli

    url = getattr(services, transport)
    services.require(url)
    store = f"sqlite:///{tmp_path / 's.db'}"
    assert run_cli("setup", "--store", store).returncode == 0
    done = run_cli(
        "schedule", "orders", "hi", "--in", "1h", "--header", header, "--store", store, "--transport", url
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert said in line and "Nothing was stored" in line, line
    assert run_cli("list", "--json", "--store", store).stdout == ""


def test_load_lists_what_its_transport_could_never_carry_and_stores_nothing(tmp_path: Path) -> None:
    import json

    from tests import services
    from tests.conftest import run_cli

    services.require(services.NATS)
    store = f"sqlite:///{tmp_path / 's.db'}"
    assert run_cli("setup", "--store", store).returncode == 0
    lines = [
        {"destination": "orders", "delay": "1h", "body": "fine"},
        {"destination": "orders", "delay": "1h", "body": "bad", "headers": {"a:b": "v"}},
    ]
    file = tmp_path / "in.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli("load", str(file), "--store", store, "--transport", services.NATS)
    assert done.returncode == 1
    assert "line 2: nats://" in done.stderr and "header name 'a:b' is not allowed on NATS" in done.stderr
    assert "nothing was stored" in done.stderr
    assert run_cli("list", "--json", "--store", store).stdout == ""


async def test_nats_gives_back_non_ascii_header_values_as_the_text_they_were(tmp_path: Path) -> None:
    """nats-py parses headers with the email parser, which handed a value with non-ASCII bytes
    back as an ``email.header.Header`` object, on receive and on a look at the stream."""
    t = await open_broker("nats")
    try:
        await t.declare("texts")
        m = DelayedMessage.create("texts", b"x", delay=0, headers={"greeting": "héllo 'ünï' ✓"})
        assert await t.send_batch([m]) == [None]
        [seen] = await t.peek("texts", 10)
        [got] = await t.receive("texts", 10, 2.0)
        for headers in (seen.headers, got.headers):
            assert headers["greeting"] == "héllo 'ünï' ✓"
        await t.acknowledge([got])
    finally:
        await cleanup("nats", t)


@pytest.mark.parametrize(
    "unforeseen", ["a body over the broker's real limit", "a header over the frame size"]
)
async def test_a_message_that_breaks_the_connection_fails_alone_and_the_rest_is_delivered(
    unforeseen: str, tmp_path: Path
) -> None:
    """What the checks do not foresee. A URL that says the broker takes 512 MiB (it takes 128):
    the broker closes the channel on a 129 MiB body, naming it. With the header check missing:
    the broker closes the whole connection on a 200 KB header, naming nothing. Either way the
    messages after it in the batch came back "unavailable" with it: before, that was an outage,
    the batch went again and again until the dispatch breaker ended the process. Now what was lost
    goes again one at a time until the one that breaks the connection alone is found (or the
    broker named it):
    it stays stored aside with a notice in the error queue (which cannot carry it either), every
    other message is delivered (again only if it was in flight when the connection broke), and no
    breaker counts anything."""
    transport = await open_broker("rabbitmq")
    if unforeseen.startswith("a body"):
        transport.max_message_size = 512 * 1024 * 1024  # as a wrong `?max_message_size=` would
        body, headers, said = b"h" * (129 * 1024 * 1024), {}, "PRECONDITION_FAILED - message size"
    else:
        transport._refusal = lambda publish, frame_max: None  # a check that did not see it coming
        body, headers, said = b"x", {"big": "x" * 200_000}, "dropped its connection each time"
    tag = f"split{id(transport) % 100000}"
    queue, error_queue = f"uncarried.{tag}", f"uncarried.error.{tag}"
    await transport.declare(queue)
    await transport.declare(error_queue)
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    await store.setup_infrastructure("s")
    await store.initialize("s", TransactionMode.AT_LEAST_ONCE)
    # Claiming a 129 MiB row rewrites it (the lease is in the row): 2 s alone, past the default
    # 10 s deadline on a loaded machine (a full suite run; once past 15 s, half the fetch
    # breaker's default time, which caps a call's deadline). The deadline is not what is tested.
    settings = DelayedDeliverySettings(
        error_queue=error_queue,
        operation_timeout=timedelta(seconds=60),
        time_to_trigger_fetch_circuit_breaker=timedelta(seconds=120),
        time_to_trigger_store_circuit_breaker=timedelta(seconds=120),
    )
    try:
        good = [DelayedMessage.create(queue, f"good {i}".encode(), delay=0) for i in range(5)]
        bad = DelayedMessage.create(queue, body, delay=0, headers=headers)
        if len(body) > MAX_BODY_BYTES:  # stored before sizes were bounded: read as it is
            await asyncio.to_thread(store.sync._insert, [good[0], bad, *good[1:]])  # type: ignore[attr-defined]
        else:
            await store.store_many([good[0], bad, *good[1:]])
        dispatcher = Dispatcher(store, transport, settings, endpoint="s")
        stats = await dispatcher.run_burst()
        got = await transport.receive(queue, 20, 2.0)
        got += await transport.receive(queue, 20, 0.5)
        await transport.acknowledge(got)
        bodies = [m.body for m in got]
        # each at least once; at most once more, and only what the broker took but had not yet
        # confirmed when it closed the connection (as after any dropped connection)
        assert sorted(set(bodies)) == [f"good {i}".encode() for i in range(5)]
        assert all(bodies.count(b) <= 2 for b in bodies), bodies
        assert stats.forwarded == 5 and stats.outages == 0 and not dispatcher.dispatch_breaker.armed
        kept = await store.get(bad.message_id)
        assert kept is not None and kept.failure_count == 1 and len(kept.body) == len(body)
        (notice,) = await transport.peek(error_queue, 50)
        assert notice.message_id == bad.message_id and kept_in_store(notice.headers)
        assert said in notice.headers[ERROR_MESSAGE]
        listed = await asyncio.to_thread(
            run_cli,
            *("errors", "list", "--store", f"sqlite:///{tmp_path}/s.db", "--endpoint", "s"),
            *("--transport", RABBITMQ, "--error-queue", error_queue),
        )
        assert listed.returncode == 0, listed.stderr
        error_column = " ".join(
            line.split("│")[3].strip() for line in listed.stdout.splitlines() if line.count("│") > 3
        )
        assert "(kept in the store: retry reschedules it, discard cancels it)" in error_column
    finally:
        await store.close()
        await cleanup("rabbitmq", transport)
