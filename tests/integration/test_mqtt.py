"""MQTT against the real Mosquitto: an outage through the test's own proxy, a topic's session
keeping what is published while nobody reads, and the front door for MQTT publishers."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from duetime import DelayedMessage
from duetime.backends.mqtt.transport import MqttTransport
from duetime.errors import TransportUnavailable
from tests.conftest import run_cli
from tests.integration.proxy import TcpProxy
from tests.services import MQTT, require

AT = urlsplit(MQTT)


@pytest.fixture
def topic() -> str:
    require(MQTT)
    return f"it/{uuid.uuid4().hex[:8]}"


async def test_a_broker_that_goes_away_is_an_outage_and_the_transport_comes_back(topic: str) -> None:
    proxy = TcpProxy(AT.hostname or "127.0.0.1", AT.port or 1883)
    t = MqttTransport(f"mqtt://127.0.0.1:{proxy.port}", connect_timeout=2, publish_timeout=2)
    reader = MqttTransport.from_url(MQTT)
    try:
        await reader.declare(topic)
        await t.start()
        due = datetime.now(UTC)
        assert await t.send_batch([DelayedMessage("a", topic, due, b"1")]) == [None]
        proxy.cut()
        lost = None
        for _ in range(20):  # the cut is seen by the next write or the keep-alive
            try:
                results = await t.send_batch([DelayedMessage("b", topic, due, b"2")])
            except TransportUnavailable as error:
                lost = error
                break
            if isinstance(results[0], TransportUnavailable):
                lost = results[0]
                break
        assert lost is not None, "an outage went unnoticed"
        proxy.restore()
        await t.start()
        assert await t.send_batch([DelayedMessage("c", topic, due, b"3")]) == [None]
        got: list = []  # type: ignore[type-arg]
        for _ in range(20):  # receive waits for the first only: "c" may come a moment after "a"
            got += await reader.receive(topic, 10, 0.5)
            if {m.message_id for m in got} >= {"a", "c"}:
                break
        assert {m.message_id for m in got} >= {"a", "c"}
        await reader.acknowledge(got)
    finally:
        await t.close()
        await reader.delete(topic)
        await reader.close()
        proxy.close()


async def test_what_is_published_while_nobody_reads_waits_in_the_topics_session(topic: str) -> None:
    first = MqttTransport.from_url(MQTT)
    await first.declare(topic)
    await first.close()  # nobody reads now
    sender = MqttTransport.from_url(MQTT)
    await sender.start()
    due = datetime.now(UTC)
    assert (
        await sender.send_batch([DelayedMessage(f"w{i}", topic, due, b"x") for i in range(5)]) == [None] * 5
    )
    await sender.close()
    later = MqttTransport.from_url(MQTT)
    try:
        got = await later.receive(topic, 10, 3.0)
        assert [m.message_id for m in got] == [f"w{i}" for i in range(5)]
        # not acknowledged: a reader that stops gets them again
        await later.close()
        again = MqttTransport.from_url(MQTT)
        redelivered = await again.receive(topic, 10, 3.0)
        assert [m.message_id for m in redelivered] == [f"w{i}" for i in range(5)]
        assert await again.acknowledge(redelivered) == 5
        await again.close()
    finally:
        cleanup = MqttTransport.from_url(MQTT)
        await cleanup.delete(topic)
        await cleanup.close()


def publish(topic: str, body: bytes, **properties: str) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(AT.hostname or "127.0.0.1", AT.port or 1883)
    client.loop_start()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = list(properties.items())
    client.publish(topic, body, qos=1, properties=props).wait_for_publish(5)
    client.loop_stop()
    client.disconnect()


def test_the_front_door_stores_what_mqtt_publishers_send_once_by_its_id(tmp_path: Path) -> None:
    require(MQTT)
    endpoint = f"mq{uuid.uuid4().hex[:6]}"
    door = f"{endpoint}.Timeouts"
    url = f"sqlite:///{tmp_path / 'store.db'}"
    due = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    args = ("--store", url, "--endpoint", endpoint)
    assert run_cli("setup", *args).returncode == 0
    assert run_cli("queues", "declare", door, "--transport", MQTT).returncode == 0
    try:
        for _ in range(2):  # the same publish twice (a publisher's retry): stored once
            publish(door, b"lights off", **{"message-id": "lights-1", "duetime-route-to": "home/lights",
                                           "duetime-deliver-at": due, "room": "hall"})  # fmt: skip
        publish(door, b"no destination", **{"message-id": "bad-1", "duetime-deliver-at": due})
        done = run_cli(
            "run",
            "--burst",
            "--front-door",
            *args,
            "--transport",
            MQTT,
            "--error-queue",
            f"{endpoint}.errors",
        )
        assert done.returncode == 0, done.stderr
        shown = run_cli("show", "lights-1", "--json", *args)
        assert shown.returncode == 0, shown.stderr
        stored = json.loads(shown.stdout)
        assert stored["destination"] == "home/lights" and stored["headers"]["room"] == "hall"
        assert "duetime-route-to" not in stored["headers"]
        listed = run_cli("list", "--json", *args).stdout.splitlines()
        assert [json.loads(line)["id"] for line in listed] == ["lights-1"]
    finally:
        t = MqttTransport.from_url(MQTT)
        import asyncio

        async def end() -> None:
            for name in (door, f"{endpoint}.errors"):
                await t.delete(name)
            await t.close()

        asyncio.run(end())
