"""Routes: one dispatcher delivering to several transports, each destination by its route.

A route is a destination pattern (``orders.*``, as shell patterns match: ``*``, ``?``,
``[abc]``) and the transport that destination's messages go to; the first route that matches a
destination is its route, and the default transport takes the rest (the error queue too, unless a
route names it). ``duetime run --route 'reminders.*=webhooks://'`` or
``DUETIME_ROUTES='reminders.*=webhooks:// orders.*=amqp://...'`` read them; :func:`read_routes`
is the one reading of that text. A route's URL may begin ``sealed:``: its messages are delivered
sealed with the keyring (:mod:`duetime.engine.sealed_route`).

A batch is split by route and each part sent at once; every message gets its own transport's
answer. A route whose transport cannot be reached while another route's can is down on its own:
its messages wait in the store, held until the route is tried again (after ``failure_backoff``,
doubling to ``max_failure_backoff`` while it stays down), and are never sent in between, so a broker
that is down never holds back a webhook, and no circuit breaker counts it (a restart would not
mend that route and would stop the others). Only when no route can be reached is it an outage of
the dispatcher, as with one transport: one that lasts the dispatch breaker's time (30 s) ends the
run with exit code 3, for its supervisor to start again. A route's connection lost in the middle
of a batch, with the route answering again at once, is no outage: the dispatcher looks for the
message that drops it (:mod:`duetime.engine.pinpoint`). Exactly-once needs one transaction for the
store and the transport: a dispatcher with routes delivers at-least-once, each route's messages by
their id (a receiver drops a repeat by it).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from duetime.engine.outages import DEFAULT_BACKOFF, Backoff
from duetime.engine.sealed_route import SEALED_PREFIX, SealedDelivery
from duetime.errors import (
    ConfigurationError,
    DestinationUnavailable,
    RouteUnavailable,
    TransportUnavailable,
    one_line,
)
from duetime.inputs.urls import redact, remember
from duetime.interfaces import Located, ReadsFromStore, Transport
from duetime.message import DelayedMessage

log = logging.getLogger("duetime.dispatcher")


@dataclass(frozen=True, slots=True)
class Route:
    """Destinations matching ``pattern`` go to the transport at ``url``."""

    pattern: str
    url: str

    def matches(self, destination: str) -> bool:
        return fnmatch.fnmatchcase(destination, self.pattern)


def read_routes(text: str | Sequence[str]) -> list[Route]:
    """``PATTERN=URL`` items (a list, or one text of them separated by spaces or new lines)."""
    items = text.split() if isinstance(text, str) else [t for item in text for t in item.split()]
    routes: list[Route] = []
    for item in items:
        pattern, equals, url = item.partition("=")
        transport = url.removeprefix(SEALED_PREFIX)
        if not equals or not pattern or not re.match(r"^[a-z][a-z0-9+.-]*:", transport):
            raise ConfigurationError(
                f"a route is PATTERN=TRANSPORT_URL, such as 'reminders.*=webhooks://' or "
                f"'orders.*=amqp://guest:guest@localhost/' ('sealed:' before the URL delivers them "
                f"sealed); got {redact(item)!r}."
            )
        remember(transport)  # its password is kept out of every line printed from now on
        routes.append(Route(pattern, url))
    return routes


@dataclass(slots=True)
class _Down:
    """A route's transport that could not be reached: since when, how often, when to try again."""

    error: Exception
    since: float
    tries: int = 1
    retry_at: float = 0.0


class RoutedTransport:
    """Several transports behind one: each message to the transport of its destination's route."""

    def __init__(
        self,
        routes: Sequence[tuple[Route, Transport]],
        default: Transport,
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.routes = list(routes)
        self.default = default
        self.backoff = backoff
        self._monotonic = monotonic
        self._by_destination: dict[str, Transport] = {}
        #: The transports that could not be reached, by id: tried again when their turn comes.
        self._down: dict[int, _Down] = {}
        #: The transports not started yet (they could not be reached at the start), by id.
        self._unstarted: set[int] = set()

    @property
    def url(self) -> str:
        """Every route and the default, as ``stats`` and the logs show it (passwords hidden)."""
        return described([r for r, _ in self.routes], _url_of(self.default))

    @property
    def parts(self) -> list[Transport]:
        """Each transport once (:class:`~duetime.interfaces.HoldsTransports`)."""
        return self.transports

    @property
    def transports(self) -> list[Transport]:
        """Each transport once, the default last."""
        seen: list[Transport] = []
        for t in [*(t for _, t in self.routes), self.default]:
            if all(t is not s for s in seen):
                seen.append(t)
        return seen

    def route_of(self, destination: str) -> Transport:
        found = self._by_destination.get(destination)
        if found is None:
            found = next((t for r, t in self.routes if r.matches(destination)), self.default)
            if len(self._by_destination) < 10_000:  # a cache, not a record of every name ever sent
                self._by_destination[destination] = found
        return found

    def attach_store(self, store: object) -> None:
        for t in self.transports:
            if isinstance(t, ReadsFromStore):
                t.attach_store(store)

    async def start(self) -> None:
        """Connect every transport. One that cannot be reached does not hold back the others:
        it is tried again when its messages are sent. Only when none connects is it an error;
        and one configured wrongly (credentials, no keyring for a sealed route), which waiting
        will not mend, stops the start."""
        results = await asyncio.gather(*(t.start() for t in self.transports), return_exceptions=True)
        wrong = next((r for r in results if isinstance(r, ConfigurationError)), None)
        if wrong is not None:
            raise wrong
        failed = {
            id(t): r for t, r in zip(self.transports, results, strict=True) if isinstance(r, BaseException)
        }
        if len(failed) == len(self.transports):
            raise next(iter(failed.values()))
        for t, result in zip(self.transports, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                if id(t) not in self._down:
                    log.warning(
                        "route to %s cannot be reached: %s; tried again with its messages",
                        _shown(t),
                        one_line(result),
                    )
                    self._down[id(t)] = _Down(result, self._monotonic(), tries=0)
        self._unstarted = set(failed)

    async def declare(self, queue: str) -> None:
        await self.route_of(queue).declare(queue)

    async def close(self) -> None:
        results = await asyncio.gather(*(t.close() for t in self.transports), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        parts: dict[int, tuple[Transport, list[int]]] = {}
        for i, message in enumerate(messages):
            t = self.route_of(message.destination)
            parts.setdefault(id(t), (t, []))[1].append(i)
        results: list[Exception | None] = [None] * len(messages)
        waiting = {key for key in parts if self._waits(key)}
        failed: set[int] = set()

        async def send(key: int, t: Transport, indexes: list[int]) -> None:
            try:
                if key in self._unstarted:  # it could not be reached at the start: try it again now
                    await t.start()
                    self._unstarted.discard(key)
                answers = await t.send_batch([messages[i] for i in indexes])
                if answers and all(_lost(a) for a in answers):
                    await t.start()  # the connection dropped: does it answer again (a message's doing)?
            except Exception as error:  # that transport is down: its part is unreachable
                self._went_down(key, t, error)
                failed.add(key)
                return
            self._came_back(key, t)
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer

        await asyncio.gather(
            *(send(key, t, indexes) for key, (t, indexes) in parts.items() if key not in waiting)
        )
        for key in waiting | failed:  # after every try: whether another route answered is known
            t, indexes = parts[key]
            answer = self._answer(key, t, tried=key in failed)
            for i in indexes:
                results[i] = answer
        return results

    def _waits(self, key: int) -> bool:
        """Whether a route's messages wait without a try: it is down, its next try has not come,
        and another route can be reached (with none, each try is the dispatcher's, as with one
        transport)."""
        down = self._down.get(key)
        return down is not None and self._monotonic() < down.retry_at and self._others_up(key)

    def _others_up(self, key: int) -> bool:
        return any(id(t) not in self._down for t in self.transports if id(t) != key)

    def _answer(self, key: int, t: Transport, *, tried: bool) -> TransportUnavailable:
        """What a down route's messages are answered: they wait for its next try while another
        route can be reached; an outage of the dispatcher's when none can."""
        down = self._down[key]
        text = f"route to {_shown(t)} cannot be reached: {one_line(down.error)}"
        if not self._others_up(key):
            return TransportUnavailable(text)
        retry_in = max(down.retry_at - self._monotonic(), 0.001)
        return RouteUnavailable(text, route=_shown(t), retry_in=retry_in, tried=tried)

    def _went_down(self, key: int, t: Transport, error: Exception) -> None:
        now = self._monotonic()
        down = self._down.get(key)
        if down is None or not down.tries:
            down = self._down[key] = _Down(error, now if down is None else down.since)
        else:
            down.error, down.tries = error, down.tries + 1
        wait = self.backoff.after(down.tries)
        down.retry_at = now + wait
        log.warning(
            "route to %s cannot be reached (%s), for %.0f s now; its messages wait in the store, "
            "tried again in %g s%s",
            _shown(t),
            one_line(error),
            now - down.since,
            wait,
            "" if self._others_up(key) else " (no route can be reached)",
        )

    def _came_back(self, key: int, t: Transport) -> None:
        down = self._down.pop(key, None)
        if down is not None:
            log.info("route to %s reachable again after %.0f s", _shown(t), self._monotonic() - down.since)


def _lost(answer: Exception | None) -> bool:
    """An answer that says the connection dropped (not that a destination cannot take it now)."""
    return isinstance(answer, TransportUnavailable) and not isinstance(answer, DestinationUnavailable)


def described(routes: Sequence[Route], default_url: str) -> str:
    """``orders.*=amqp://guest:***@host/ *=sqlite:///duetime.db``: the routes as shown."""
    return " ".join([*(f"{r.pattern}={redact(r.url)}" for r in routes), f"*={redact(default_url)}"])


def _shown(transport: Transport) -> str:
    return redact(_url_of(transport))


def _url_of(transport: Transport) -> str:
    return transport.url if isinstance(transport, Located) else type(transport).__name__


def route_transport(url: str, open_transport: Callable[[str], Transport]) -> Transport:
    """The transport of a route's URL: ``sealed:URL`` is URL's, delivering messages sealed."""
    if url.startswith(SEALED_PREFIX):
        return SealedDelivery(open_transport(url.removeprefix(SEALED_PREFIX)))
    return open_transport(url)


def routed(
    routes: Sequence[Route],
    default_url: str,
    open_transport: Callable[[str], Transport],
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Transport:
    """The transport of ``default_url`` alone without routes, else one that routes; a URL named by
    several routes is one transport (one connection)."""
    if not routes:
        return open_transport(default_url)
    opened: dict[str, Transport] = {}

    def one(url: str) -> Transport:
        if url not in opened:
            opened[url] = route_transport(url, open_transport)
        return opened[url]

    return RoutedTransport([(r, one(r.url)) for r in routes], one(default_url), backoff=backoff)
