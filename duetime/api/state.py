"""The HTTP API as a library object: the store it serves, the rules it applies, who may call it.

``duetime serve`` only parses its flags, opens an :class:`HttpApi` and serves it; a program may
do the same, or mount :meth:`HttpApi.app` in an ASGI server of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from duetime import audit
from duetime.api.access import Access, Caller
from duetime.api_keys import Scope
from duetime.audit import Action, Actor, Via
from duetime.client import DelayedMessageClient, record
from duetime.clock import SYSTEM
from duetime.engine.deadline import within
from duetime.errors import ConfigurationError
from duetime.interfaces import ApiKeyStore, Clock, DelayedMessageStore, RecurringStore
from duetime.message import DelayedMessage
from duetime.operations.carry import CarryRule
from duetime.operations.message_files import store_new
from duetime.registry import default_transport, has_default_transport, open_ready_store
from duetime.settings import DEFAULT_ENDPOINT, DelayedDeliverySettings

T = TypeVar("T")

#: Where a request's scope carries the caller's name to its log line.
CALLER_NOTE = "duetime.caller"
#: Seconds a request waits for the store before it answers 503 (a partitioned server never answers).
ANSWER_WITHIN = 10.0


@dataclass
class HttpApi:
    """One store's HTTP API. Open it with :meth:`open`; close it when done."""

    store: DelayedMessageStore
    store_url: str
    endpoint: str
    carry: CarryRule
    #: Where the error queue is (a queue transport's URL), None: the store has none of its own
    #: and none was given (the error queue's routes then answer 501).
    transport_url: str | None
    error_queue: str
    answer_within: float = ANSWER_WITHIN
    clock: Clock = SYSTEM
    client: DelayedMessageClient = field(init=False)
    access: Access = field(init=False)

    def __post_init__(self) -> None:
        self.client = DelayedMessageClient(self.store, endpoint=self.endpoint)
        if not isinstance(self.store, ApiKeyStore):
            raise ConfigurationError(
                f"{type(self.store).__name__} keeps no API keys, which the HTTP API needs; "
                "duetime's own stores do."
            )
        self.access = Access(self.store)

    @classmethod
    async def open(
        cls,
        store_url: str,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        transport: str | None = None,
        error_queue: str | None = None,
        answer_within: float = ANSWER_WITHIN,
    ) -> HttpApi:
        """The API of the store at ``store_url`` (set up already: `duetime setup`)."""
        queue = error_queue or DelayedDeliverySettings.from_env().error_queue
        store = await open_ready_store(store_url, endpoint)
        try:
            carry = await CarryRule.open(store_url, transport, queue)
        except BaseException:
            await store.close()
            raise
        errors_at = transport or (default_transport(store_url) if has_default_transport(store_url) else None)
        return cls(store, store_url, endpoint, carry, errors_at, queue, answer_within)

    async def within(self, call: Awaitable[T]) -> T:
        """``call``'s answer, or DeadlineExceeded (503) after :attr:`answer_within`."""
        return await within(call, self.answer_within, "the store")

    async def store_new(self, messages: Sequence[DelayedMessage]) -> int:
        return await store_new(self.store, messages)

    @property
    def schedules(self) -> RecurringStore:
        if not isinstance(self.store, RecurringStore):
            raise ConfigurationError(f"{type(self.store).__name__} keeps no recurring schedules.")
        return self.store

    def app(self, *, ready: Callable[[], None] | None = None) -> Any:
        """The ASGI application (FastAPI) that serves this API."""
        from duetime.api.app import create_app

        return create_app(self, ready=ready)

    async def close(self) -> None:
        await self.carry.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self.store.close()


@dataclass(frozen=True, slots=True)
class Served:
    """What a route handler has: the API, who called, and from where."""

    api: HttpApi
    caller: Caller
    origin: str = ""

    @property
    def actor(self) -> Actor:
        """The caller as the audit trail records it: its key's name (a server without keys,
        loopback only, has no name to give)."""
        name = f"key:{self.caller.key.name}" if self.caller.key else "no key (open server)"
        return Actor(name, Via.HTTP_API, self.origin)

    @property
    def client(self) -> DelayedMessageClient:
        """The API's client, its changes recorded as this caller's."""
        return self.api.client.acting_as(self.actor)

    async def audit(self, action: Action, target: str, **said: Any) -> None:
        """Keep a change this request made in the store's audit trail."""
        await record(self.api.store, audit.made(self.actor, action, target, **said))


#: The document's name for the key a route needs (the check itself is :meth:`Access.caller`, so
#: that its refusals are problems like any other, and a route costs no dependency of FastAPI's own
#: for it: they were a sixth of a request's CPU).
BEARER = "HTTPBearer"
BEARER_SCHEME = {
    "type": "http",
    "description": "An API key: `duetime api-keys create NAME --scope ...`",
    "scheme": "bearer",
}
#: The dependencies :func:`caller_with` made: a route that has one needs a key.
_KEYED: set[Callable[..., Awaitable[Served]]] = set()


def caller_with(scope: Scope) -> Callable[..., Awaitable[Served]]:
    """The dependency of a route that needs ``scope``."""

    async def served(request: Request) -> Served:
        api: HttpApi = request.app.state.api
        caller = await api.access.caller(request.headers.get("authorization"), scope)
        said = request.scope.get(CALLER_NOTE)
        if isinstance(said, dict):
            said["name"] = caller.name  # for the request's log line (app._Logged)
        return Served(api, caller, request.client.host if request.client else "")

    _KEYED.add(served)
    return served


def say_keys_needed(routes: Sequence[BaseRoute]) -> None:
    """Marks, for the OpenAPI document (and the clients made from it), each route that needs a
    bearer key: the ones with a :func:`caller_with` dependency."""
    for route in routes:
        if isinstance(route, APIRoute) and any(d.call in _KEYED for d in route.dependant.dependencies):
            route.openapi_extra = {**(route.openapi_extra or {}), "security": [{BEARER: []}]}
