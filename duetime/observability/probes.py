"""The port ``duetime run --metrics-port`` serves: ``/metrics``, ``/healthz`` and ``/readyz``.

- ``/metrics``: Prometheus text format (see :mod:`duetime.observability.metrics`).
- ``/healthz``: the loop is alive and turning. 503 when it has not turned for longer than its
  longest sleep plus a timed-out call (it is stuck), or a breaker tripped: restart the process.
- ``/readyz``: store and transport reachable, no breaker armed for longer than ``ready_after``
  seconds. 503 with the reason while the store cannot be reached, the transport is down, or a
  breaker keeps failing: take the process out of rotation, alert, but do not restart it (it
  recovers by itself when the outage ends).

A small Starlette app served by uvicorn in the dispatcher's own event loop: if that loop freezes,
the probes stop answering too, which is what a liveness probe should see.
"""

from __future__ import annotations

import asyncio
import socket

from duetime.engine.companions import Probed
from duetime.engine.deadline import within
from duetime.errors import MissingExtra, one_line
from duetime.observability import webserver
from duetime.observability.metrics import Backlog

try:
    import uvicorn
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route
except ImportError as missing:  # pragma: no cover - depends on what is installed
    raise MissingExtra.of("Metrics", "metrics") from missing

#: How long ``/readyz`` waits for the store to answer before it says it is not reachable.
STORE_CHECK_SECONDS = 2.0


def health(dispatcher: Probed) -> str | None:
    """Why the dispatcher is not alive, or None when it is."""
    tripped = [b.name for b in dispatcher.breakers.timed() if b.tripped]
    if tripped:
        return f"circuit breaker {tripped[0]} tripped; the dispatcher is stopping"
    idle = dispatcher.clock.monotonic() - dispatcher.turned_at
    if idle > dispatcher.stuck_after:
        return f"the dispatch loop has not turned for {idle:.0f} s (limit {dispatcher.stuck_after:.0f} s)"
    return None


async def readiness(dispatcher: Probed, ready_after: float) -> str | None:
    """Why the dispatcher is not ready to deliver, or None when it is."""
    problem = health(dispatcher)
    if problem is not None:
        return problem
    if dispatcher.stopping:
        return "stopping"
    try:
        await within(dispatcher.store.next_due(), STORE_CHECK_SECONDS, "asking the store")
    except Exception as error:
        return f"store unreachable: {one_line(error)}"
    if not dispatcher.transport_reachable:
        return "transport unreachable; messages stay stored until it is back"
    for name, seconds in dispatcher.breakers_armed().items():
        if seconds is not None and seconds > ready_after:
            return f"circuit breaker {name} armed for {seconds:.0f} s (failing)"
    return None


def app(dispatcher: Probed, registry: CollectorRegistry, ready_after: float) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        problem = health(dispatcher)
        return PlainTextResponse(
            "ok\n" if problem is None else f"not alive: {problem}\n", 200 if problem is None else 503
        )

    async def readyz(request: Request) -> Response:
        problem = await readiness(dispatcher, ready_after)
        return PlainTextResponse(
            "ready\n" if problem is None else f"not ready: {problem}\n", 200 if problem is None else 503
        )

    routes = [Route("/metrics", metrics), Route("/healthz", healthz), Route("/readyz", readyz)]
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, opened before anything starts: a port in use is a one-line error."""
    return webserver.bind(host, port, what="The metrics port", option="--metrics-port")


class ProbeServer:
    """Serves the probes and keeps the backlog gauges current until the dispatcher stops."""

    def __init__(
        self,
        dispatcher: Probed,
        registry: CollectorRegistry,
        backlog: Backlog,
        sock: socket.socket,
        *,
        ready_after: float = 10.0,
    ) -> None:
        self.dispatcher = dispatcher
        self.backlog = backlog
        self.sock = sock
        config = uvicorn.Config(
            app(dispatcher, registry, ready_after),
            log_level="warning",
            access_log=False,
            lifespan="off",
            proxy_headers=False,  # (nothing here reads the client's address: none is believed)
        )
        self.server = webserver.QuietServer(config)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    async def run(self) -> None:
        serving = asyncio.get_running_loop().create_task(self.server.serve(sockets=[self.sock]))
        try:
            await self.backlog.run()  # until the dispatcher stops
        finally:
            self.server.should_exit = True
            await serving
            self.sock.close()
