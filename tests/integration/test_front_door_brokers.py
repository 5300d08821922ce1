"""The front door on the real brokers: send_delayed through RabbitMQ and Redis, stored once by id,
forwarded when due, malformed envelopes to the error queue, nothing acknowledged before it is
stored (a storage outage leaves the envelopes on the broker)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import (
    CriticalError,
    DelayedDeliverySettings,
    DelayedMessage,
    Dispatcher,
    FrontDoor,
    send_delayed,
)
from duetime.backends.sqlite import SqliteStore, SyncSqliteStore
from duetime.nservicebus.frontdoor import NSB_EXPIRE, NSB_ROUTE_TO, front_door_queue
from tests.integration.conftest import open_broker
from tests.integration.proxy import proxy_for
from tests.services import postgres_schema

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("broker", ["rabbitmq", "redis-stream"], indirect=True)
async def test_front_door_on_a_broker(broker: tuple[str, Any], tmp_path: Path) -> None:
    t = broker[1]
    endpoint = f"shop-{uuid.uuid4().hex[:6]}"
    error_queue = f"{endpoint}.error"
    await t.declare("orders-" + endpoint)
    orders = "orders-" + endpoint
    sync = SyncSqliteStore(tmp_path / "s.db")
    sync.setup_infrastructure(endpoint)
    store = SqliteStore(sync)
    dispatcher = Dispatcher(store, t, DelayedDeliverySettings(error_queue=error_queue), endpoint=endpoint)
    await dispatcher.start()
    door = FrontDoor(dispatcher, t, wait=0.2)
    await door.start()
    now = datetime.now(UTC)
    await send_delayed(t, endpoint, orders, b"now", delay=0, message_id="due-now")
    await send_delayed(t, endpoint, orders, b"later", delay=3600, message_id="later", headers={"k": "v"})
    await send_delayed(t, endpoint, orders, b"later", delay=3600, message_id="later")  # redelivery
    nsb_due = "2031-05-06 07:08:09:123456 Z"
    raw = [
        DelayedMessage(
            "nsb", front_door_queue(endpoint), now, b"nsb", {NSB_ROUTE_TO: orders, NSB_EXPIRE: nsb_due}
        ),
        DelayedMessage("broken", front_door_queue(endpoint), now, b"?", {"duetime-route-to": orders}),
        # an entry for the error queue planted by a sender, and a message sent round to a front door
        DelayedMessage(
            "to-error",
            front_door_queue(endpoint),
            now,
            b"x",
            {NSB_ROUTE_TO: error_queue, NSB_EXPIRE: nsb_due},
        ),
        DelayedMessage(
            "loop",
            front_door_queue(endpoint),
            now,
            b"x",
            {NSB_ROUTE_TO: "other.Timeouts", NSB_EXPIRE: nsb_due},
        ),
        # a dispatcher's attribution forged by a sender: dropped, the rest kept
        DelayedMessage(
            "forged",
            front_door_queue(endpoint),
            now,
            b"f",
            {
                NSB_ROUTE_TO: orders,
                NSB_EXPIRE: nsb_due,
                "duetime-error-endpoint": "victim",
                "duetime-error-original-destination": "evil",
                "kept": "yes",
            },
        ),
    ]
    assert await t.send_batch(raw) == [None] * 5
    running = asyncio.gather(dispatcher.run(), door.run())
    got: list[Any] = []
    for _ in range(50):
        got += await t.receive(orders, 10, 0.1)
        if got and door.stored >= 5:
            break
    await t.acknowledge(got)
    dead = await t.receive(error_queue, 10, 2.0)
    await t.acknowledge(dead)
    dispatcher.stop()
    await running
    assert [m.message_id for m in got] == ["due-now"] and got[0].body == b"now"
    assert "duetime-route-to" not in got[0].headers
    later = await store.get("later")
    assert later is not None and later.headers == {"k": "v"} and later.due_at > now + timedelta(minutes=59)
    nsb = await store.get("nsb")
    assert nsb is not None and nsb.due_at == datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert [m.message_id for m in dead] == ["broken", "to-error", "loop"]
    assert "no due time header" in dead[0].headers["duetime-error-message"]
    assert "is the error queue, which only dispatchers write to" in dead[1].headers["duetime-error-message"]
    assert "is an endpoint's timeouts queue" in dead[2].headers["duetime-error-message"]
    forged = await store.get("forged")
    assert forged is not None and forged.headers["kept"] == "yes"
    assert not [name for name in forged.headers if name.startswith("duetime-error-")], forged.headers
    assert (await store.counts(datetime.now(UTC))).total == 3  # later (once), nsb and forged
    assert await t.receive(front_door_queue(endpoint), 10, 0.3) == []  # all acknowledged
    await store.close()


@pytest.mark.parametrize("broker", ["rabbitmq", "redis-stream"], indirect=True)
async def test_storage_outage_leaves_envelopes_on_the_broker(broker: tuple[str, Any]) -> None:
    kind, t = broker
    endpoint = f"out-{uuid.uuid4().hex[:6]}"
    with postgres_schema() as pg, proxy_for(pg) as proxy:
        from duetime.backends.postgres import PostgresStore, SyncPostgresStore

        direct = SyncPostgresStore.from_url(pg)
        direct.setup_infrastructure(endpoint)
        store = PostgresStore.from_url(proxy.url(pg) + "&pool_timeout=0.5")
        settings = DelayedDeliverySettings(
            time_to_wait_before_triggering_critical_error_on_timeout_outages=timedelta(seconds=2),
            failure_backoff=timedelta(seconds=0.2),
            error_queue=f"{endpoint}.error",
        )
        dispatcher = Dispatcher(store, t, settings, endpoint=endpoint)
        await dispatcher.start()
        door = FrontDoor(dispatcher, t, wait=0.2)
        await door.start()
        await t.declare("orders")
        for i in range(3):
            await send_delayed(t, endpoint, "orders", b"x", delay=3600, message_id=f"o{i}")
        proxy.cut()
        with pytest.raises(CriticalError, match="fetching timeouts from storage"):
            await asyncio.wait_for(asyncio.gather(dispatcher.run(), door.run()), 30)
        await store.close()
        direct.close()
    # nothing was acknowledged: a fresh consumer gets all three back
    again = await open_broker(kind)
    if kind.startswith("redis"):
        again.prefix, again.visibility_ms = t.prefix, 0
    else:
        await t.close()  # the unacknowledged deliveries go back to the queue
    got: list[Any] = []
    for _ in range(20):
        got += await again.receive(front_door_queue(endpoint), 10, 0.2)
        if len(got) >= 3:
            break
    await again.acknowledge(got)
    assert sorted(m.message_id for m in got) == ["o0", "o1", "o2"]
    await again.close()
    if kind == "rabbitmq":
        await t.start()


def test_send_delayed_from_the_command_line(tmp_path: Path) -> None:
    import json

    import redis

    from tests.conftest import run_cli
    from tests.services import REDIS, require

    require(REDIS)
    prefix = f"duetime-cli-{uuid.uuid4().hex[:8]}:"
    broker = f"{REDIS}?mode=stream&prefix={prefix}"
    store = f"sqlite:///{tmp_path}/cli.db"

    def cli(*args: str) -> str:
        result = run_cli(*args, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    try:
        cli("setup", "--store", store, "--endpoint", "shop")
        cli("queues", "declare", "orders", "--transport", broker)
        sent = cli(
            "send-delayed",
            "orders",
            "hello",
            "--in",
            "0s",
            "--id",
            "sd1",
            "--endpoint",
            "shop",
            "--transport",
            broker,
        )
        assert sent.strip() == "sd1"
        cli(
            "send-delayed",
            "orders",
            "later",
            "--in",
            "1h",
            "--id",
            "sd2",
            "--endpoint",
            "shop",
            "--transport",
            broker,
        )
        out = cli(
            "run", "--burst", "--front-door", "--store", store, "--transport", broker, "--endpoint", "shop"
        )
        assert "forwarded 1" in out
        received = [
            json.loads(x)
            for x in cli("queues", "receive", "orders", "--transport", broker, "--wait", "1").splitlines()
        ]
        assert [(m["id"], m["body"]) for m in received] == [("sd1", "hello")]
        assert json.loads(cli("show", "sd2", "--store", store, "--endpoint", "shop"))["body"] == "later"
    finally:
        client = redis.Redis.from_url(REDIS)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
