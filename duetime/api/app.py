"""The FastAPI application: the routes, the problem answers, the size limit and the request log.

The OpenAPI document is FastAPI's, made from these routes and :mod:`duetime.api.models`;
``duetime serve --openapi`` prints it, and ``docs/reference/openapi.json`` is that print (a test
compares the two).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duetime.api import audit, failed, flow, messages, schedules
from duetime.api.models import Health, Stats, counts_view
from duetime.api.problems import (
    COMMON_PROBLEMS,
    ApiProblem,
    answer,
    as_problems,
    on_duetime_error,
    on_http_error,
    on_invalid_request,
    on_problem,
    on_unexpected,
)
from duetime.api.state import (
    BEARER,
    BEARER_SCHEME,
    CALLER_NOTE,
    HttpApi,
    Served,
    caller_with,
    say_keys_needed,
)
from duetime.api_keys import Scope as KeyScope
from duetime.errors import DuetimeError
from duetime.message import MAX_BODY_BYTES
from duetime.version import __version__

log = logging.getLogger("duetime.api")

#: The largest request body: one message of the largest body in base64, with room for its
#: headers (a batch of small messages fits many times over).
MAX_REQUEST_BYTES = MAX_BODY_BYTES * 4 // 3 + 2 * 1024 * 1024

DESCRIPTION = """\
Schedule, look up and cancel delayed messages from any language: what `duetime schedule`,
`duetime list`, `duetime recurring` and `duetime errors` do, over HTTP.

Send an API key as `Authorization: Bearer <secret>` (`duetime api-keys create NAME --scope
schedule,read,manage`). Errors are `application/problem+json` (RFC 9457), each kind with its own
`type`, and a `detail` line that says what to do.
"""


def create_app(api: HttpApi, *, ready: Callable[[], None] | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if ready is not None:
            ready()
        yield

    app = FastAPI(
        title="duetime",
        version=__version__,
        description=DESCRIPTION,
        responses=COMMON_PROBLEMS,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # names a generated client's methods take: messages_create, schedules_pause, ...
        generate_unique_id_function=lambda route: (
            f"{str(route.tags[0]).replace(' ', '_')}_{route.name.strip('_')}"
        ),
    )
    app.state.api = api
    made = app.openapi
    document: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not document:
            document.update(as_problems(made()))
            document.setdefault("components", {}).setdefault("securitySchemes", {})[BEARER] = BEARER_SCHEME
        return document

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_exception_handler(ApiProblem, on_problem)
    app.add_exception_handler(DuetimeError, on_duetime_error)
    app.add_exception_handler(RequestValidationError, on_invalid_request)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    for router in (
        messages.router,
        messages.batches,
        messages.groups,
        messages.destinations,
        schedules.router,
        failed.router,
        flow.router,
        audit.router,
    ):
        say_keys_needed(router.routes)
        app.include_router(router)

    @app.get("/v1/stats", response_model=Stats, tags=["health"], summary="What the store holds now")
    async def stats(served: Annotated[Served, Depends(caller_with(KeyScope.READ))]) -> Stats:
        return counts_view(await served.api.within(served.api.store.counts(served.api.clock.now())))

    @app.get("/healthz", response_model=Health, tags=["health"], summary="The server answers")
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["health"], summary="The store answers")
    async def readyz() -> Health:
        await api.within(api.store.next_due())
        return Health(status="ok")

    say_keys_needed(app.routes)
    return _Logged(_Bounded(app, MAX_REQUEST_BYTES))  # type: ignore[return-value]


class _Bounded:
    """Refuses a request body over ``limit`` with 413, before it is all read: by its
    Content-Length when it says one, else as it arrives."""

    def __init__(self, app: FastAPI, limit: int) -> None:
        self.app, self.limit = app, limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _send(answer(413, "too-large", self._said()), scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise ApiProblem(413, "too-large", self._said())
            return message

        await self.app(scope, bounded, send)

    def _said(self) -> str:
        return (
            f"a request body may be at most {self.limit:,} bytes; send fewer messages a batch, and "
            "keep large payloads in object storage with their address in the message"
        )


async def _send(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    await response(scope, receive, send)


class _Logged:
    """One log line per request: method, path, status, milliseconds and the key's name (never its
    secret, never the query string, which may hold a customer's ids)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        started = False

        async def sending(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        caller: dict[str, str] = {}
        scope[CALLER_NOTE] = caller
        try:
            await self.app(scope, receive, sending)
        except Exception:
            # answered already (problems.on_unexpected logged it and sent the problem), and
            # Starlette raises it again for the server, which would print a second traceback
            if status == 500 and not started:
                await _send(answer(500, "internal", "the server failed unexpectedly"), scope, receive, send)
        finally:
            path = scope.get("raw_path", b"").decode("ascii", "backslashreplace") or "?"
            ms, key = (time.perf_counter() - began) * 1000, caller.get("name", "-")
            fields = {
                "method": scope["method"],
                "path": path,
                "status": status,
                "ms": round(ms, 1),
                "key": key,
            }
            # in JSON (--log-format json) each part is a field of its own, for a collector to count by
            log.info(
                "%s %s %d %.1f ms key=%s", scope["method"], path, status, ms, key, extra={"fields": fields}
            )
