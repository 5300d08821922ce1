"""The dashboard served: its options checked, its port bound, the pages served until stopped.

`duetime dashboard` reads its flags into a :class:`DashboardServer` and starts it; a program of
its own does the same, and gets what the command does (the same checks, the same refusal to open
the pages to other machines without a password, the same ready line).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duetime.dashboard.app import Dashboard
from duetime.dashboard.security import Credentials, secret
from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact
from duetime.observability.webserver import bind, loopback, serve
from duetime.registry import default_transport
from duetime.settings import (
    DEFAULT_DASHBOARD_HOST,
    DEFAULT_DASHBOARD_PORT,
    DEFAULT_ENDPOINT,
    DEFAULT_ERROR_QUEUE,
)

log = logging.getLogger("duetime.dashboard")

#: How often the charts look at the store, and how long a page waits for it (seconds).
DEFAULT_SAMPLE_EVERY, DEFAULT_ANSWER_WITHIN = 10.0, 10.0


@dataclass(frozen=True)
class DashboardServer:
    """The dashboard of ``store`` on ``host``:``port``.

    ``credentials`` (by default from DUETIME_DASHBOARD_USER and DUETIME_DASHBOARD_PASSWORD) are
    what a change needs: without them the pages show but change nothing, and a ``host`` other
    machines reach is refused unless ``allow_no_password``. ``transport``: where the error
    queue is (by default the store's own queue tables)."""

    store: str
    endpoints: Sequence[str] = (DEFAULT_ENDPOINT,)
    transport: str | None = None
    error_queue: str = DEFAULT_ERROR_QUEUE
    host: str = DEFAULT_DASHBOARD_HOST
    port: int = DEFAULT_DASHBOARD_PORT
    read_only: bool = False
    show_contents: bool = False
    allow_no_password: bool = False
    sample_every: float = DEFAULT_SAMPLE_EVERY
    answer_within: float = DEFAULT_ANSWER_WITHIN
    #: The reverse proxies (comma-separated) whose X-Forwarded-For names the client.
    forwarded_allow_ips: str | None = None
    credentials: Credentials | None = field(default_factory=Credentials.from_env)

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ConfigurationError("--sample-every must be at least 1s")
        if not 0 < self.answer_within <= 3600:
            raise ConfigurationError("--timeout must be more than 0s and at most 1h")

    def bind(self) -> socket.socket:
        """The listening socket: an address this machine lacks, or a port taken, is one line
        (said first: it is the one to mend before the password)."""
        sock = bind(self.host, self.port, what="The dashboard port", option="--port")
        try:
            self._check_exposure()
        except BaseException:
            sock.close()
            raise
        return sock

    def _check_exposure(self) -> None:
        if self.credentials is None and not self.allow_no_password and not loopback(self.host):
            raise ConfigurationError(
                f"--host {self.host} lets other machines in, and no DUETIME_DASHBOARD_PASSWORD is set: "
                "set one, or pass --allow-no-password to open the read-only pages to anyone who "
                "reaches the port"
            )

    async def serve(
        self, sock: socket.socket | None = None, *, on_stop: Callable[[], None] | None = None
    ) -> None:
        """Open the stores, serve the pages until the task is cancelled (or a stop signal ends the
        server), then close them. ``sock``: one :meth:`bind` made (bound now otherwise);
        ``on_stop``: called before the stores are closed (a command arms its exit watchdog)."""
        if sock is None:
            sock = self.bind()
        else:
            self._check_exposure()
        try:
            board = await Dashboard.open(
                self.store,
                list(self.endpoints),
                transport_url=self.transport or default_transport(self.store),
                error_queue=self.error_queue,
                read_only=self.read_only,
                credentials=self.credentials,
                show_contents=self.show_contents,
                sample_every=self.sample_every,
                answer_within=self.answer_within,
            )
        except BaseException:
            sock.close()
            raise
        address, bound = sock.getsockname()[:2]

        def ready() -> None:
            """Said once the server runs and a stop signal ends it cleanly: a script that stops
            it when it reads this line never kills it half-started (exit 143)."""
            log.info(
                "dashboard of %s on http://%s:%d/ (%s)",
                redact(self.store),
                address,
                bound,
                "read-only"
                if not board.can_change
                else f"changes need user {self._user()!r} and the password",
            )
            if self.credentials is None and not self.read_only:
                log.info("set DUETIME_DASHBOARD_PASSWORD to cancel, reschedule and retry from the dashboard")

        try:
            await serve(
                board.app(secret=secret(), ready=ready), sock, forwarded_allow_ips=self.forwarded_allow_ips
            )
        finally:
            if on_stop is not None:
                on_stop()
            await board.close()
            sock.close()

    def _user(self) -> str:
        return self.credentials.user if self.credentials else ""
