"""One call to a ready client, context managers, and delays written as the CLI takes them, on the
embedded default and on PostgreSQL."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import duetime
from duetime import StoreNotReady
from tests.services import postgres_schema


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/duetime.db"
    else:
        with postgres_schema() as pg:
            yield pg


async def test_connect_sets_up_and_closes_in_one_step(url: str) -> None:
    async with duetime.connect(url, endpoint="shop") as client:
        message = await client.schedule("orders", b"hello", delay="10m")
        assert timedelta(minutes=9, seconds=59) < message.due_at - client.clock.now() <= timedelta(minutes=10)
        assert await client.reschedule(message.message_id, delay="1h30m")
    client = await duetime.connect(url, endpoint="shop")  # idempotent: the store is there already
    try:
        stored = await client.get(message.message_id)
        assert stored is not None and stored.body == b"hello"
    finally:
        await client.close()


def test_connect_sync_and_stores_as_context_managers(url: str) -> None:
    with duetime.connect_sync(url, endpoint="shop") as client:
        first = client.schedule("orders", b"a", delay="90s")
    with duetime.open_sync_store(url) as store:
        store.initialize("shop", duetime.TransactionMode.AT_LEAST_ONCE)
        assert store.get(first.message_id) is not None


async def test_async_store_and_transport_close_on_the_way_out(url: str) -> None:
    async with duetime.open_store(url) as store:
        await store.setup_infrastructure("shop")
        await store.initialize("shop", duetime.TransactionMode.AT_LEAST_ONCE)
    async with duetime.open_transport(url) as transport:
        assert transport is not None


async def test_connect_without_setup_names_the_missing_store(url: str) -> None:
    with pytest.raises(StoreNotReady, match="duetime setup"):
        await duetime.connect(url, endpoint="nothere", setup=False)


def test_connect_reads_duetime_store_like_the_cli(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUETIME_STORE", url)
    with duetime.connect_sync(endpoint="shop") as client:
        client.schedule("orders", b"x", delay=5)
    with duetime.connect_sync(url, endpoint="shop") as client:
        assert len(client.list().messages) == 1


def test_bad_delay_text_is_a_clear_error() -> None:
    with pytest.raises(duetime.InvalidMessage, match="negative"):
        duetime.DelayedMessage.create("orders", b"", delay="-5m")
    with pytest.raises(duetime.InvalidMessage):
        duetime.DelayedMessage.create("orders", b"", delay="soon")


def _probes(sock: socket.socket) -> tuple[int, int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    )


#: What every connection's socket must carry: a silent peer is found dead in ~25-30 s, not hours.
PROBES = (1, 10, 5, 3, 30_000)


def test_every_server_connection_finds_a_silent_peer_dead_within_seconds() -> None:
    """A partition resets nothing; without keepalives a read waits for the kernel's two hours, and
    a stopping process waits for that thread (libpq, PyMySQL and redis-py all default to none)."""
    import os
    import socket

    from duetime import open_sync_store
    from tests.services import REDIS, mariadb_database, require

    with postgres_schema() as pg:
        store = open_sync_store(pg)
        store.setup_infrastructure("k")
        with store.pool.connection() as conn:  # type: ignore[attr-defined]
            sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
            try:
                assert _probes(sock) == PROBES
            finally:
                sock.close()
        store.close()
        assert open_sync_store(f"{pg}&keepalives_idle=60").options.conninfo.count("keepalives_idle=60") == 1  # type: ignore[attr-defined]
    with mariadb_database() as my:
        store = open_sync_store(my)
        store.setup_infrastructure("k")
        assert _probes(store._connection()._sock) == PROBES  # type: ignore[attr-defined]
        store.close()
    require(REDIS)
    store = open_sync_store(REDIS)
    store.setup_infrastructure("k")
    connection = store.client.connection_pool.get_connection()  # type: ignore[attr-defined]
    try:
        assert _probes(connection._sock) == PROBES
    finally:
        store.client.connection_pool.release(connection)  # type: ignore[attr-defined]
        store.close()
