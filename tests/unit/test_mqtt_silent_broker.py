"""A broker that accepts the connection and never confirms a subscription (a loaded or stuck
Mosquitto): declaring a topic is a transport outage in one line, never a bare TimeoutError
(which the command line calls an internal error)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from duetime.errors import TransportUnavailable

pytest.importorskip("paho.mqtt")


def _silent_broker(accepted: list[socket.socket]) -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.recv(65536)  # CONNECT
            conn.sendall(b"\x20\x03\x00\x00\x00")  # CONNACK (MQTT 5): accepted, no properties
            # every packet after it (SUBSCRIBE) is read and never answered

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


async def test_a_subscription_never_confirmed_is_an_outage_in_one_line() -> None:
    from duetime.backends.mqtt.transport import MqttTransport

    accepted: list[socket.socket] = []
    server, port = _silent_broker(accepted)
    transport = MqttTransport(f"mqtt://127.0.0.1:{port}", connect_timeout=0.5)
    try:
        await transport.start()
        with pytest.raises(TransportUnavailable, match="did not confirm a subscription to 'sensors/hall'"):
            await transport.declare("sensors/hall")
    finally:
        await transport.close()
        server.close()
        for conn in accepted:
            conn.close()


def test_a_disconnect_heard_after_the_event_loop_closed_is_dropped_not_raised_in_pahos_thread() -> None:
    """Paho's network thread may report a lost connection after the program's event loop has
    closed (a transport never closed, a loop ended first): it raised "Event loop is closed" in that
    thread, which pytest blamed on whatever test ran next (a fresh Debian 12 run, a bulk test)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from duetime.backends.mqtt.transport import MqttTransport, _Connection

    async def made() -> _Connection:
        return _Connection(MqttTransport("mqtt://127.0.0.1:1"), "c-closed-loop", True)

    loop = asyncio.new_event_loop()
    connection = loop.run_until_complete(made())
    loop.close()
    connection._on_disconnect(
        None, None, None, ReasonCode(PacketTypes.DISCONNECT, "Normal disconnection"), None
    )
    assert connection.lost is not None and "lost" in connection.lost
