"""Routes: one dispatcher delivering to several transports, each destination by its route.

A route is a destination pattern (``orders.*``, as shell patterns match: ``*``, ``?``,
``[abc]``) and the transport that destination's messages go to; the first route that matches a
destination is its route, and the default transport takes the rest (the error queue too, unless a
route names it). ``duetime run --route 'reminders.*=webhooks://'`` or
``DUETIME_ROUTES='reminders.*=webhooks:// orders.*=amqp://...'`` read them; :func:`read_routes`
is the one reading of that text.

A batch is split by route and each part sent at once; every message gets its own transport's
answer, and a transport that fails as a whole fails only its own part (its messages are
unreachable, the others carried), so a broker that is down never holds back a webhook. Its
messages stay stored and count as an outage: one that lasts the dispatch breaker's time (30 s)
ends the run with exit code 3, for its supervisor to start again, as with one transport. Exactly-once
needs one transaction for the store and the transport: a dispatcher with routes delivers
at-least-once, each route's messages by their id (a receiver drops a repeat by it).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from duetime.errors import ConfigurationError, TransportUnavailable, one_line
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
        if not equals or not pattern or not url or not re.match(r"^[a-z][a-z0-9+.-]*:", url):
            raise ConfigurationError(
                f"a route is PATTERN=TRANSPORT_URL, such as 'reminders.*=webhooks://' or "
                f"'orders.*=amqp://guest:guest@localhost/'; got {redact(item)!r}."
            )
        remember(url)  # its password is kept out of every line printed from now on
        routes.append(Route(pattern, url))
    return routes


class RoutedTransport:
    """Several transports behind one: each message to the transport of its destination's route."""

    def __init__(self, routes: Sequence[tuple[Route, Transport]], default: Transport) -> None:
        self.routes = list(routes)
        self.default = default
        self._by_destination: dict[str, Transport] = {}
        #: The transports that could not be reached when started, by id.
        self._down: dict[int, Exception] = {}

    @property
    def url(self) -> str:
        """Every route and the default, as ``stats`` and the logs show it (passwords hidden)."""
        return described([r for r, _ in self.routes], _url_of(self.default))

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
        it is tried again when its messages are sent. Only when none connects is it an error."""
        results = await asyncio.gather(*(t.start() for t in self.transports), return_exceptions=True)
        failed = {
            id(t): r for t, r in zip(self.transports, results, strict=True) if isinstance(r, BaseException)
        }
        if len(failed) == len(self.transports):
            raise next(iter(failed.values()))
        for t, result in zip(self.transports, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.warning(
                    "route to %s cannot be reached: %s; tried again with its messages",
                    _shown(t),
                    one_line(result),
                )
        self._down = {k: v for k, v in failed.items() if isinstance(v, Exception)}

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

        async def send(t: Transport, indexes: list[int]) -> None:
            try:
                if id(t) in self._down:  # it could not be reached at the start: try it again now
                    await t.start()
                    self._down.pop(id(t), None)
                answers = await t.send_batch([messages[i] for i in indexes])
            except Exception as error:  # that transport is down: its part is unreachable
                down = (
                    error
                    if isinstance(error, TransportUnavailable)
                    else TransportUnavailable(one_line(error))
                )
                answers = [down] * len(indexes)
            for i, answer in zip(indexes, answers, strict=True):
                results[i] = answer

        await asyncio.gather(*(send(t, indexes) for t, indexes in parts.values()))
        return results


def described(routes: Sequence[Route], default_url: str) -> str:
    """``orders.*=amqp://guest:***@host/ *=sqlite:///duetime.db``: the routes as shown."""
    return " ".join([*(f"{r.pattern}={redact(r.url)}" for r in routes), f"*={redact(default_url)}"])


def _shown(transport: Transport) -> str:
    return redact(_url_of(transport))


def _url_of(transport: Transport) -> str:
    return transport.url if isinstance(transport, Located) else type(transport).__name__


def routed(
    routes: Sequence[Route], default_url: str, open_transport: Callable[[str], Transport]
) -> Transport:
    """The transport of ``default_url`` alone without routes, else one that routes; a URL named by
    several routes is one transport (one connection)."""
    if not routes:
        return open_transport(default_url)
    opened: dict[str, Transport] = {}

    def one(url: str) -> Transport:
        if url not in opened:
            opened[url] = open_transport(url)
        return opened[url]

    return RoutedTransport([(r, one(r.url)) for r in routes], one(default_url))
