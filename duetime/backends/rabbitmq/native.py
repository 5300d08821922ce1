"""RabbitMQ native delays (as NServiceBus.RabbitMQ does them): the broker itself holds a message for up to 268,435,455 s.

28 levels, each a topic exchange and a queue whose messages expire after 2^level seconds. The
delay in whole seconds, written in binary (most significant bit first), is the first 28 words of
the routing key, then the destination. Exchange N sends a message whose bit N is 1 to queue N
(expiry then dead-letters it to exchange N-1) and one whose bit N is 0 straight to exchange N-1.
Level 0 ends in the delivery exchange, where each destination is bound by ``#.<destination>``.
Messages the delivery exchange cannot route (a destination deleted while they were on their way)
go to its alternate exchange and wait in a catch-all queue instead of being dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel
from aio_pika.exceptions import ChannelClosed, DeliveryError

from duetime.backends.rabbitmq.arrival import DEATH_HEADERS, arrival_headers, early_by
from duetime.backends.rabbitmq.batchwrite import Publish
from duetime.backends.rabbitmq.transport import RabbitMqTransport, amqp_properties_of
from duetime.backends.rabbitmq.wire import Int32, Int64
from duetime.bulk_interfaces import NativeDelayTopology
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, DestinationNotFound, InvalidMessage, TransportError
from duetime.inputs.identifiers import check_name
from duetime.message import Delay, DelayedMessage, outgoing_headers
from duetime.nservicebus_wire import DELAY_IN_SECONDS

__all__ = [
    "DEATH_HEADERS",
    "LEVELS",
    "MAX_DELAY",
    "NAMES",
    "DelayTooLong",
    "NativeDelays",
    "Names",
    "arrival_headers",
    "delay_seconds",
    "early_by",
    "first_level",
    "level_binding",
    "routing_key",
]

LEVELS = 28
MAX_DELAY = 2**LEVELS - 1  # 268,435,455 s, about 8.5 years


class DelayTooLong(InvalidMessage):
    """The delay does not fit the topology's levels."""


@dataclass(frozen=True)
class Names:
    """What the topology's exchanges and queues are called."""

    level_prefix: str
    delivery: str
    #: Alternate exchange and queue of the delivery exchange; None where the names belong to
    #: another system whose delivery exchange was declared without one (NServiceBus).
    catchall: str | None
    #: Level queues as NServiceBus.RabbitMQ 4.3-6.x declared them: classic and lazy, with no
    #: queue-type arguments (declaring them otherwise fails with PRECONDITION_FAILED).
    classic_lazy: bool = False
    #: Level numbers written with two digits (``…-level-07``, NServiceBus) or as they are
    #: (``celery_delayed_7``, kombu).
    padded: bool = True
    #: Classic level queues refuse publishes when full too (kombu declares ``x-overflow`` for
    #: both queue types; a declaration without it fails against its queues).
    always_reject_publish: bool = False
    #: Where an exchange is named after the destination, bind it (NServiceBus's conventional
    #: topology routes through it); kombu binds queues itself and its exchanges may be direct,
    #: which cannot route a delayed routing key, so its destinations are bound as queues.
    bind_exchange: bool = True

    def level(self, n: int) -> str:
        return f"{self.level_prefix}{n:02d}" if self.padded else f"{self.level_prefix}{n}"


NAMES = {
    "duetime": Names("duetime.delay-level-", "duetime.delay-delivery", "duetime.delay-catchall"),
    "nsb-v2": Names("nsb.v2.delay-level-", "nsb.v2.delay-delivery", None),
    "nsb-v1": Names("nsb.delay-level-", "nsb.delay-delivery", None, classic_lazy=True),
    # kombu.transport.native_delayed_delivery (Celery 5.5+ on quorum queues)
    "celery": Names(
        "celery_delayed_",
        "celery_delayed_delivery",
        None,
        padded=False,
        always_reject_publish=True,
        bind_exchange=False,
    ),
}


def delay_seconds(delay: timedelta | float, levels: int = LEVELS) -> int:
    """Whole seconds, rounded up (never early); a delay that does not fit is refused, never cut."""
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidMessage(f"delay must be a finite number of seconds, got {seconds}.")
    whole = max(0, math.ceil(seconds - 1e-9))
    limit = 2**levels - 1
    if whole > limit:
        raise DelayTooLong(
            f"a native delay of {whole:,} s is longer than the {levels}-level topology holds ({limit:,} s, "
            "about 8.5 years); keep such messages in a duetime store instead."
        )
    return whole


def routing_key(seconds: int, destination: str, levels: int = LEVELS) -> str:
    """``b27.b26.….b0.destination``: the delay in binary, most significant bit first."""
    if not 0 <= seconds <= 2**levels - 1:
        raise DelayTooLong(f"{seconds} s does not fit {levels} levels.")
    bits = format(seconds, f"0{levels}b")
    return ".".join(bits) + "." + destination


def first_level(seconds: int) -> int | None:
    """The highest level whose bit is set (where publishing starts); None for no delay."""
    return seconds.bit_length() - 1 if seconds > 0 else None


def level_binding(level: int, bit: str, levels: int = LEVELS) -> str:
    """Topic pattern that looks at this level's word only."""
    return "*." * (levels - 1 - level) + bit + ".#"


class NativeDelays:
    """Declares, checks and removes the topology, and sends messages through it."""

    def __init__(
        self,
        transport: RabbitMqTransport,
        names: str | Names = "duetime",
        *,
        levels: int = LEVELS,
        queue_type: str = "quorum",
    ) -> None:
        if isinstance(names, str):
            if names not in NAMES:
                raise ConfigurationError(f"names must be one of {sorted(NAMES)}, got {names!r}.")
            names = NAMES[names]
        if not 1 <= levels <= LEVELS:
            raise ConfigurationError(f"levels must be between 1 and {LEVELS}.")
        if queue_type not in ("quorum", "classic"):
            raise ConfigurationError("queue_type must be quorum or classic.")
        self.transport = transport
        self.names = names
        self.levels = levels
        self.queue_type = queue_type
        self.bound: set[str] = set()
        self.notes: list[str] = []

    @property
    def longest_delay(self) -> int:
        """The longest delay its levels hold, in seconds."""
        return int(min(MAX_DELAY, 2**self.levels - 1))

    async def has_queue(self, queue: str) -> bool:
        """The destination's queue is on the broker."""
        return await self.transport.has_queue(queue)

    async def close(self) -> None:
        """Close its transport's connection."""
        await self.transport.close()

    # -- topology --------------------------------------------------------------------------------

    async def broker_version(self) -> tuple[int, ...]:
        await self.transport.start()
        assert self.transport._connection is not None
        props = self.transport._connection.transport.connection.server_properties  # type: ignore[union-attr]
        raw = props.get("version", b"0")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())

    async def queue_arguments(self, level: int) -> dict[str, Any]:
        """TTL (a 64-bit integer, as NServiceBus declares it) and dead-lettering of one level;
        quorum with at-least-once dead-lettering when the broker has it (3.10+), classic otherwise,
        and :attr:`notes` says so. The v1 names get v1's classic lazy queues."""
        args: dict[str, Any] = {
            "x-message-ttl": Int64((2**level) * 1000),
            "x-dead-letter-exchange": self.names.level(level - 1) if level > 0 else self.names.delivery,
        }
        if self.names.classic_lazy:
            return args | {"x-queue-mode": "lazy"}
        kind = self.queue_type
        if kind == "quorum" and await self.broker_version() < (3, 10):
            kind = "classic"
            note = "RabbitMQ < 3.10: no quorum-queue TTL or at-least-once dead-lettering; classic queues used"
            if note not in self.notes:
                self.notes.append(note)
        args["x-queue-type"] = kind
        if kind == "quorum":
            args["x-dead-letter-strategy"] = "at-least-once"
        if kind == "quorum" or self.names.always_reject_publish:
            args["x-overflow"] = "reject-publish"
        return args

    def _delivery_arguments(self) -> dict[str, Any]:
        return {"alternate-exchange": self.names.catchall} if self.names.catchall else {}

    async def _fresh_channel(self) -> AbstractChannel:
        await self.transport.start()
        assert self.transport._connection is not None
        return await self.transport._connection.channel()

    async def setup(self) -> list[str]:
        """Declare everything; idempotent. Returns what was declared, for the operator."""
        ch = await self._fresh_channel()
        done: list[str] = []
        try:
            if self.names.catchall:
                await ch.declare_exchange(self.names.catchall, aio_pika.ExchangeType.FANOUT, durable=True)
                catchall = await ch.declare_queue(
                    self.names.catchall, durable=True, arguments={"x-queue-type": "quorum"}
                )
                await catchall.bind(self.names.catchall, routing_key="")
                done.append(f"catch-all {self.names.catchall}")
            delivery = await ch.declare_exchange(
                self.names.delivery,
                aio_pika.ExchangeType.TOPIC,
                durable=True,
                arguments=self._delivery_arguments(),
            )
            done.append(f"delivery exchange {self.names.delivery}")
            below = delivery
            for level in range(self.levels):
                name = self.names.level(level)
                exchange = await ch.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
                queue = await ch.declare_queue(
                    name, durable=True, arguments=await self.queue_arguments(level)
                )
                await queue.bind(exchange, routing_key=level_binding(level, "1", self.levels))
                await below.bind(exchange, routing_key=level_binding(level, "0", self.levels))
                below = exchange
            done.append(f"{self.levels} levels {self.names.level(0)} … {self.names.level(self.levels - 1)}")
        finally:
            await ch.close()
        return done + self.notes

    async def verify(self) -> list[str]:
        """Problems found (empty: all there with the right arguments). Declares nothing new.

        Bindings cannot be read over AMQP (that needs the management API); they are re-asserted,
        which is harmless when they exist."""
        problems: list[str] = []

        async def check(kind: str, name: str, declare: Any) -> bool:
            ch = await self._fresh_channel()
            try:
                if kind == "exchange":
                    await ch.get_exchange(name, ensure=True)
                else:
                    await ch.declare_queue(name, passive=True)
            except ChannelClosed:
                problems.append(f"{kind} {name} is missing: run `duetime rabbitmq setup`.")
                return False
            finally:
                if not ch.is_closed:
                    await ch.close()
            ch = await self._fresh_channel()
            try:
                await declare(ch)
            except ChannelClosed as error:
                problems.append(f"{kind} {name} exists with other arguments: {error}")
                return False
            finally:
                if not ch.is_closed:
                    await ch.close()
            return True

        await check(
            "exchange",
            self.names.delivery,
            lambda ch: ch.declare_exchange(
                self.names.delivery,
                aio_pika.ExchangeType.TOPIC,
                durable=True,
                arguments=self._delivery_arguments(),
            ),
        )
        if self.names.catchall:
            await check(
                "queue",
                self.names.catchall,
                lambda ch: ch.declare_queue(
                    self.names.catchall, durable=True, arguments={"x-queue-type": "quorum"}
                ),
            )
        for level in range(self.levels):
            name = self.names.level(level)
            args = await self.queue_arguments(level)
            if await check(
                "exchange",
                name,
                lambda ch, n=name: ch.declare_exchange(n, aio_pika.ExchangeType.TOPIC, durable=True),
            ):
                await check(
                    "queue", name, lambda ch, n=name, a=args: ch.declare_queue(n, durable=True, arguments=a)
                )
        if not problems:
            await self.setup()  # all present with the right arguments: re-assert the bindings
        return problems

    async def teardown(self, *, force: bool = False) -> list[str]:
        """Delete the levels, the delivery exchange and the catch-all; refuses while messages wait
        in a level queue (they would be lost) unless ``force``."""
        waiting = await self.waiting()
        busy = {q: n for q, n in waiting.items() if n}
        if busy and not force:
            raise ConfigurationError(
                f"messages still wait in {busy}; let them arrive (or pass force) before tearing down."
            )
        ch = await self._fresh_channel()
        removed = []
        try:
            for level in range(self.levels):
                await ch.queue_delete(self.names.level(level))
                await ch.exchange_delete(self.names.level(level))
            await ch.exchange_delete(self.names.delivery)
            if self.names.catchall:
                await ch.queue_delete(self.names.catchall)
                await ch.exchange_delete(self.names.catchall)
            removed.append(
                f"{self.levels} levels, {self.names.delivery}"
                + (f", {self.names.catchall}" if self.names.catchall else "")
            )
        finally:
            await ch.close()
        self.bound.clear()
        return removed

    async def waiting(self) -> dict[str, int]:
        """Messages in each level queue (and the catch-all)."""
        counts: dict[str, int] = {}
        names = [self.names.level(n) for n in range(self.levels)] + (
            [self.names.catchall] if self.names.catchall else []
        )
        for name in names:
            counts[name] = max(0, await self.depth(name))
        return counts

    async def depth(self, queue: str) -> int:
        """Messages waiting in ``queue``; -1 if there is no such queue."""
        ch = await self._fresh_channel()
        try:
            declared = await ch.declare_queue(queue, passive=True)
            return int(declared.declaration_result.message_count or 0)
        except ChannelClosed:
            return -1
        finally:
            if not ch.is_closed:
                await ch.close()

    async def bind_destination(self, destination: str) -> None:
        """Route ``#.<destination>`` from the delivery exchange to the destination before the first
        send: to its exchange where one of that name exists (NServiceBus's conventional topology
        binds it so), else to its queue."""
        if destination in self.bound:
            return
        exchange = self.names.bind_exchange and await self._exchange_of(destination)
        ch = await self._fresh_channel()
        try:
            queue = await ch.declare_queue(check_name("queue", destination), passive=True)
            if exchange:
                delivery = await ch.get_exchange(self.names.delivery, ensure=False)
                own = await ch.get_exchange(destination, ensure=False)
                await own.bind(delivery, routing_key=f"#.{destination}")
            else:
                await queue.bind(self.names.delivery, routing_key=f"#.{destination}")
        except ChannelClosed as error:
            raise DestinationNotFound(
                f"Queue {destination!r} (or the delivery exchange) does not exist: declare the queue, "
                f"and run `duetime rabbitmq setup` ({error})."
            ) from None
        finally:
            if not ch.is_closed:
                await ch.close()
        self.bound.add(destination)

    async def _exchange_of(self, destination: str) -> bool:
        """Whether an exchange named after the destination exists (looked at on a channel of its
        own: the broker closes the channel when it does not)."""
        ch = await self._fresh_channel()
        try:
            await ch.get_exchange(destination, ensure=True)
            return True
        except ChannelClosed:
            return False
        finally:
            if not ch.is_closed:
                await ch.close()

    # -- sending -------------------------------------------------------------------------------------

    async def send_batch(
        self, messages: Sequence[DelayedMessage], now: datetime | None = None, *, dispatching: bool = True
    ) -> list[Exception | None]:
        """Publish each message with the delay left until its ``due_at`` (rounded up to seconds),
        with confirms and ``mandatory``; per-message results like any transport. Not
        ``dispatching`` (a migration hands stored timeouts on), an NServiceBus timeout keeps its
        stored headers, plus only ``DelayInSeconds``, as the timeout migration tool publishes it."""
        moment = now or SYSTEM.now()
        results: list[Exception | None] = [None] * len(messages)
        publishes = []
        slots = []
        for i, m in enumerate(messages):
            try:
                seconds = delay_seconds(m.due_at - moment, self.levels)
                await self.bind_destination(m.destination)
            except (InvalidMessage, DestinationNotFound) as error:
                results[i] = error
                continue
            level = first_level(seconds)
            headers: dict[str, Any] = outgoing_headers(m, dispatching=dispatching)
            headers[DELAY_IN_SECONDS] = Int32(seconds)  # as NServiceBus's sender; stripped on arrival
            publishes.append(
                Publish(
                    self.names.delivery if level is None else self.names.level(level),
                    routing_key(seconds, m.destination, self.levels),
                    m.body,
                    amqp_properties_of(m, headers),
                )
            )
            slots.append(i)
        outcomes = await self.transport.publish_all(publishes) if publishes else []
        for i, outcome in zip(slots, outcomes, strict=True):
            if isinstance(outcome, DeliveryError):
                results[i] = DestinationNotFound(f"{messages[i].destination!r}: returned unroutable")
            elif isinstance(outcome, Exception):
                results[i] = TransportError(
                    f"native publish to {messages[i].destination!r} failed: {outcome!r}"
                )
            elif outcome is not None:  # cancelled: not sent, and not ours to swallow
                raise outcome
        return results

    async def send(
        self,
        destination: str,
        body: bytes = b"",
        *,
        delay: Delay | None = None,
        due_at: datetime | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> DelayedMessage:
        """Send one message natively; raises what went wrong."""
        message = DelayedMessage.create(
            destination, body, delay=delay, due_at=due_at, headers=headers, message_id=message_id
        )
        [error] = await self.send_batch([message])
        if error is not None:
            raise error
        return message


def _answers_for_bulk(rows: NativeDelays) -> NativeDelayTopology:
    """Never called: mypy holds here that this is what the bulk jobs ask of it (the registry
    hands it out cast, so nothing else would)."""
    return rows
