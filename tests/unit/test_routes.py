"""Routes without a network: a batch split by route, a route that is down waiting on its own
(held in the store, tried again after its back-off) while the others deliver, and the dispatcher's
outage only when no route can be reached."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from duetime import DelayedMessage
from duetime.backends.memory import MemoryTransport
from duetime.encryption import KEY_HEADER, Keyring, sealer_from_environment
from duetime.engine.outages import Backoff
from duetime.engine.routes import RoutedTransport, read_routes, routed
from duetime.errors import ConfigurationError, RouteUnavailable, TransportUnavailable
from duetime.testing import FakeClock
from tests.unit.helpers import Rig

T = datetime(2030, 1, 1, tzinfo=UTC)


class Switchable(MemoryTransport):
    """A broker that can be taken away and brought back: while away, a send fails as a whole (or,
    with ``answers``, each message answers 'unavailable', as a transport whose connection dropped
    does) and a start fails."""

    def __init__(self, *, answers: bool = False) -> None:
        super().__init__()
        self.away = False
        self.answers = answers
        self.sends = 0
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        if self.away:
            raise TransportUnavailable("connection refused")
        await super().start()

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        self.sends += 1
        if not self.away:
            return await super().send_batch(messages)
        if self.answers:
            return [TransportUnavailable("connection reset") for _ in messages]
        raise ConnectionResetError("the broker went away")


def message(i: int, destination: str) -> DelayedMessage:
    return DelayedMessage(f"m{i}", destination, T, b"")


async def test_routes_split_a_batch_and_one_transport_down_holds_back_only_its_own() -> None:
    routes = read_routes("hook.*=memory:// orders.*=memory://")
    assert [r.pattern for r in routes] == ["hook.*", "orders.*"]
    hooks, orders, rest = MemoryTransport(), Switchable(), MemoryTransport()
    orders.away = True
    t = RoutedTransport([(routes[0], hooks), (routes[1], orders)], rest)
    for q in ("hook.a", "other"):
        await t.declare(q)
    batch = [message(i, d) for i, d in enumerate(["hook.a", "orders.x", "other", "hook.a"])]
    results = await t.send_batch(batch)
    assert results[0] is None and results[2] is None and results[3] is None
    assert isinstance(results[1], RouteUnavailable) and results[1].tried
    assert [m.message_id for m in hooks.messages("hook.a")] == ["m0", "m3"]
    assert [m.message_id for m in rest.messages("other")] == ["m2"]
    with pytest.raises(ConfigurationError, match="PATTERN=TRANSPORT_URL"):
        read_routes(["orders.*"])
    opened: list[str] = []

    def open_transport(url: str) -> MemoryTransport:
        opened.append(url)
        return MemoryTransport()

    assert isinstance(routed([], "memory://", open_transport), MemoryTransport)
    routed(read_routes("a=memory://x b=memory://x"), "memory://y", open_transport)
    assert opened == ["memory://", "memory://x", "memory://y"]  # one transport per URL


@pytest.mark.parametrize("answers", [False, True], ids=["raises", "answers-unavailable"])
async def test_a_down_route_waits_its_back_off_without_a_try_while_another_route_delivers(
    answers: bool,
) -> None:
    clock = FakeClock()
    orders, rest = Switchable(answers=answers), MemoryTransport()
    t = RoutedTransport(
        [(read_routes("orders.*=memory://")[0], orders)],
        rest,
        backoff=Backoff(1, 4),
        monotonic=clock.monotonic,
    )
    await t.start()
    await rest.declare("other")
    await orders.declare("orders.x")
    orders.away = True
    waits = []
    for i in range(5):
        results = await t.send_batch([message(2 * i, "orders.x"), message(2 * i + 1, "other")])
        assert results[1] is None, "the route that is up delivered"
        down = results[0]
        assert isinstance(down, RouteUnavailable), down
        waits.append((down.tried, round(down.retry_in, 3)))
        clock.advance(down.retry_in)
    # tried, waited 1 s; tried, 2 s; tried, 4 s (the longest): never tried in between
    assert waits == [(True, 1.0), (True, 2.0), (True, 4.0), (True, 4.0), (True, 4.0)]
    assert orders.sends == 5
    for tried in (True, False, False):  # its turn came: one try, then none until the next turn
        (down,) = await t.send_batch([message(20, "orders.x")])
        assert isinstance(down, RouteUnavailable) and down.tried is tried
        clock.advance(1)
    assert orders.sends == 6, "a route waiting its back-off is not tried"
    clock.advance(4)
    orders.away = False
    assert await t.send_batch([message(21, "orders.x")]) == [None]
    assert [m.message_id for m in orders.messages("orders.x")] == ["m21"]


async def test_with_every_route_down_it_is_the_dispatchers_outage_and_each_send_tries() -> None:
    clock = FakeClock()
    orders, rest = Switchable(), Switchable()
    t = RoutedTransport([(read_routes("orders.*=memory://")[0], orders)], rest, monotonic=clock.monotonic)
    orders.away = rest.away = True
    for _ in range(3):
        results = await t.send_batch([message(1, "orders.x"), message(2, "other")])
        assert all(type(r) is TransportUnavailable for r in results), results
    assert orders.sends == rest.sends == 3
    with pytest.raises(TransportUnavailable):
        await t.start()  # the dispatcher's probe: nothing answers


class CannotConnect(MemoryTransport):
    """A broker that is not there when the run starts, and is there later."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0

    async def start(self) -> None:
        self.tries += 1
        if self.tries == 1:
            raise TransportUnavailable("not there yet")


async def test_a_route_down_at_the_start_holds_back_no_other_and_is_tried_again() -> None:
    route = read_routes("late.*=memory://")[0]
    late, rest = CannotConnect(), MemoryTransport()
    t = RoutedTransport([(route, late)], rest)
    await t.start()  # the other connected: no error
    for q, where in (("late.a", late), ("other", rest)):
        await where.declare(q)
    batch = [message(1, "late.a"), message(2, "other")]
    assert await t.send_batch(batch) == [None, None]  # tried again, and there now
    assert late.tries == 2
    with pytest.raises(TransportUnavailable):
        await RoutedTransport([(route, CannotConnect())], CannotConnect()).start()  # none: an error


@pytest.mark.parametrize("answers", [False, True], ids=["raises", "answers-unavailable"])
async def test_the_dispatcher_keeps_the_other_routes_going_past_the_breaker_and_loses_nothing(
    answers: bool,
) -> None:
    """A route down for twice the dispatch breaker's time: the other route's messages go on at
    their due times, no breaker trips, the down route's messages wait in the store (held, never
    blamed on a message or sent to the error queue), and all go once it is back."""
    rig = await Rig().setup("orders", "other")
    orders = Switchable(answers=answers)
    await orders.declare("orders.x")
    t = RoutedTransport(
        [(read_routes("orders.*=memory://")[0], orders)],
        rig.queues,
        backoff=Backoff(1, 5),
        monotonic=rig.clock.monotonic,
    )
    rig.build(rig.store, t)
    orders.away = True
    for i in range(60):
        await rig.store.store(rig.message(i, i, "orders.x" if i % 2 else "other"))
    await rig.start()
    try:
        await rig.tick(1, steps=60)  # 60 s: twice the breaker's 30 s
        assert len(rig.delivered("other")) == 30, "the route that is up was held back"
        assert rig.criticals == [] and rig.dispatcher.calls.breakers.dispatch.failures == 0
        assert rig.queues.messages(rig.settings.error_queue) == []
        assert (await rig.store.counts(rig.clock.now())).total == 30  # the down route's, all stored
        tries = orders.sends + orders.starts
        assert 12 <= tries <= 20, tries  # one try per back-off (5 s at the most), not one a round
        orders.away = False
        await rig.tick(1, steps=10)
        assert sorted(m.message_id for m in orders.messages("orders.x")) == sorted(
            f"m{i}" for i in range(1, 60, 2)
        )
        assert (await rig.store.counts(rig.clock.now())).total == 0
    finally:
        rig.dispatcher.stop()
        await rig.task  # type: ignore[misc]


async def test_a_sealed_route_seals_each_message_and_without_a_keyring_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DUETIME_ENCRYPTION_KEYS", raising=False)
    inner, rest = MemoryTransport(), MemoryTransport()
    opened = {"memory://sealed": inner, "memory://rest": rest}
    t = routed(read_routes("pay.*=sealed:memory://sealed"), "memory://rest", opened.__getitem__)
    assert "pay.*=sealed:memory://sealed" in str(getattr(t, "url", ""))
    with pytest.raises(ConfigurationError, match="delivers sealed: set DUETIME_ENCRYPTION_KEYS"):
        await t.start()
    Keyring.new("k1").write(tmp_path / "keys.json")
    monkeypatch.setenv("DUETIME_ENCRYPTION_KEYS", str(tmp_path / "keys.json"))
    await t.start()
    for queue in ("pay.in", "x"):
        await t.declare(queue)
    sent = [
        DelayedMessage("m1", "pay.in", T, b"card 4111", {"name": "Ann"}),
        DelayedMessage("m2", "x", T, b"plain"),
    ]
    assert await t.send_batch(sent) == [None, None]
    [got] = inner.messages("pay.in")
    assert got.body != b"card 4111" and got.headers[KEY_HEADER].startswith("k1 ")
    sealer = sealer_from_environment()
    assert sealer is not None
    body, headers = sealer.open_parts(got.message_id, got.queue, got.body, got.headers)
    assert (body, {k: v for k, v in headers.items() if not k.startswith("duetime-")}) == (
        b"card 4111",
        {"name": "Ann"},
    )
    assert [m.body for m in rest.messages("x")] == [b"plain"]  # the other route: as it was
    with pytest.raises(ConfigurationError, match="'sealed:' before the URL"):
        read_routes("pay.*=sealed:nothing")
