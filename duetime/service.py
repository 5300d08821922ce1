"""duetime inside your own program: the dispatcher and its companions, started and stopped as one.

``duetime run`` is this service with a command line around it; an application that would rather
not run a second process starts it in its own event loop::

    store, transport = duetime.open_store(url), duetime.open_transport(url)
    async with duetime.Service(store, transport, endpoint="shop"):
        ...  # the application runs; due messages are delivered meanwhile

or in a FastAPI (or Starlette) app's lifespan::

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with duetime.Service(store, transport, endpoint="shop"):
            yield

The companions: the heartbeat (so ``duetime stats`` and the dashboard see this dispatcher), the
front door (``front_door=True``: what senders put on the endpoint's timeouts queue is stored),
and the metrics and probe server (``metrics_port=``). Leaving the ``async with`` stops them: the
batch in flight is finished first. A circuit breaker that trips ends the service; ``wait()``
(and leaving the ``async with``) raises its :class:`~duetime.CriticalError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from types import TracebackType

from duetime.engine.dispatcher import Dispatcher, check_dispatcher_inputs
from duetime.engine.sinks import DispatchStats
from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact
from duetime.interfaces import DelayedMessageStore, DeliveryLog, Located, ReceivingTransport, Transport
from duetime.nservicebus.frontdoor import FrontDoor, front_door_queue
from duetime.observability.heartbeat import Heartbeat
from duetime.settings import DEFAULT_ENDPOINT, DelayedDeliverySettings

log = logging.getLogger("duetime")


class Service:
    """One endpoint's dispatcher with its heartbeat, and its front door and metrics if asked for.

    ``setup=True`` creates the endpoint's tables or keys first (as ``duetime run --setup``).
    ``transport_name`` is how ``stats`` and the dashboard name the transport (default: its URL,
    its secrets hidden)."""

    def __init__(
        self,
        store: DelayedMessageStore,
        transport: Transport,
        settings: DelayedDeliverySettings | None = None,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        front_door: bool = False,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        ready_after: float = 10.0,
        delivery_log: DeliveryLog | None = None,
        setup: bool = True,
        transport_name: str | None = None,
    ) -> None:
        check_dispatcher_inputs(store, transport)
        self.transport_name = transport_name or redact(
            transport.url if isinstance(transport, Located) else type(transport).__name__
        )
        if front_door and not isinstance(transport, ReceivingTransport):
            raise ConfigurationError(
                f"the front door (--front-door) needs a transport duetime can read the "
                f"{front_door_queue(endpoint)} queue from; {self.transport_name} is not one (use "
                "RabbitMQ, NATS, Redis streams or the store's own queue tables), or leave it out."
            )
        self.dispatcher = Dispatcher(
            store,
            transport,
            settings or DelayedDeliverySettings(),
            endpoint=endpoint,
            delivery_log=delivery_log,
        )
        self.store, self.transport, self.endpoint = store, transport, endpoint
        self.front_door = front_door
        self.metrics_port, self.metrics_host, self.ready_after = metrics_port, metrics_host, ready_after
        self.setup = setup
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Set up, bind the metrics port (one in use is an error now, not later) and start
        everything as tasks of this event loop; returns once the dispatcher has started (its store
        answered, its transport connected)."""
        if self._task is not None:
            if self._task.done():
                raise ConfigurationError(
                    "This Service has stopped and cannot be started again; make a new one (its store "
                    "and transport are closed with it)."
                )
            return
        if self.setup and not await self.dispatcher.reach_store(
            lambda: self.store.setup_infrastructure(self.endpoint), "setting it up"
        ):
            return
        servers = self._servers()  # first: a port in use is an error before any coroutine exists
        companions = [Heartbeat(self.dispatcher, self.transport_name).run(), *servers]
        if self.front_door:
            companions.append(FrontDoor(self.dispatcher, self.transport).run())  # type: ignore[arg-type]
        self._task = asyncio.ensure_future(self._together(companions))
        started = asyncio.ensure_future(self.dispatcher.connected())
        await asyncio.wait([started, self._task], return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # it ended before it started: say why
            started.cancel()
            await self._task

    def _servers(self) -> list[Awaitable[None]]:
        if self.metrics_port is None:
            return []
        from duetime.observability.metrics import instrument
        from duetime.observability.probes import ProbeServer, bind

        sock = bind(self.metrics_host, self.metrics_port)
        registry, backlog = instrument(self.dispatcher)
        server = ProbeServer(self.dispatcher, registry, backlog, sock, ready_after=self.ready_after)
        address, bound = server.address
        log.info("metrics on http://%s:%d/metrics, probes /healthz and /readyz", address, bound)
        return [server.run()]

    async def _together(self, companions: list[Awaitable[None]]) -> None:
        """The dispatcher and its companions; the companions end when the dispatcher stops."""
        await asyncio.gather(self.dispatcher.run(), *companions)

    def stop(self) -> None:
        """Ask for a graceful stop (the batch in flight is finished); :meth:`wait` for it."""
        self.dispatcher.stop()

    async def wait(self) -> None:
        """Until the service has stopped; raises CriticalError if a breaker ended it."""
        if self._task is not None:
            await self._task

    async def run(self) -> None:
        """Start, and serve until :meth:`stop` (or a tripped breaker: CriticalError)."""
        await self.start()
        await self.wait()

    async def run_burst(self) -> DispatchStats:
        """Store what waits at the front door, deliver what is due now, and return (a cron job's
        run); the heartbeat records a dispatcher that ran and stopped."""
        if self.setup:
            await self.store.setup_infrastructure(self.endpoint)
        if self.front_door:
            await self.dispatcher.start()
            door = FrontDoor(self.dispatcher, self.transport, wait=0.5)  # type: ignore[arg-type]
            await door.start()
            while await door.process_once():
                pass
            await door.finish()
        stats = await self.dispatcher.run_burst()
        await Heartbeat(self.dispatcher, self.transport_name).beat(stopped=True)
        return stats

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
        await self.wait()
