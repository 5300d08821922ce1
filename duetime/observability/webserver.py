"""What duetime's web servers share (the probes of ``duetime run``, ``duetime dashboard`` and
``duetime serve``): a socket bound before anything starts, so a port in use is a one-line error and
not a traceback from deep inside uvicorn, uvicorn run inside an event loop someone else owns, and
a served application started and stopped one way (:func:`serve`)."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from duetime.errors import ConfigurationError, MissingExtra

try:
    import uvicorn
except ImportError as missing:  # pragma: no cover - depends on what is installed
    raise MissingExtra.of("The web server", "metrics", also=" (or duetime[dashboard])") from missing


def loopback(host: str) -> bool:
    """Whether every address ``host`` names is this machine's own (nobody else can connect)."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False  # bind() will say why in one line
    return bool(found) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found
    )


def bind(host: str, port: int, *, what: str, option: str, shared: bool = False) -> socket.socket:
    """The listening socket; ``what`` and ``option`` name it in the error (``the metrics port``,
    ``--metrics-port``). ``shared``: other processes may listen on the same port (SO_REUSEPORT),
    and the kernel spreads the connections among them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP said out loud: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets that say they are TCP, and without it every keep-alive answer written in two
    # parts waited for the client's delayed ACK, 40 ms a request
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        host_option = option.replace("port", "host")  # --port/--host, --metrics-port/--metrics-host
        if error.errno == errno.EADDRINUSE:
            fix = f"is in use; pick another with {option}"
        elif error.errno == errno.EACCES:
            fix = f"may not be opened by this user (ports below 1024 need root); pick another with {option}"
        else:  # a name that does not resolve, an address this machine does not have
            fix = (
                f"cannot be opened ({error.strerror}); give {host_option} an address of this machine "
                "(127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
            )
        raise ConfigurationError(f"{what} {host}:{port} {fix}.") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handling: the command that starts it stops on SIGTERM itself,
    and the server stops with it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SignalledServer(uvicorn.Server):
    """uvicorn's server, told to let SIGTERM and SIGINT end it the way they end `duetime run`:
    it shuts down gracefully and the command exits 0. (uvicorn raises the signal again once it
    has shut down, so the process dies of it, 143 or 130, and a supervisor or script reads a clean
    stop as a failure.)"""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def serve(
    app: Any,
    sock: socket.socket,
    *,
    forwarded_allow_ips: str | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
) -> None:
    """Serve the ASGI ``app`` on the bound ``sock`` until SIGTERM or SIGINT. The ``X-Forwarded-*``
    headers are believed only from ``forwarded_allow_ips`` (uvicorn trusts 127.0.0.1 by default:
    a local client could then pick its own address for each try, past a per-client throttle);
    ``certfile`` and ``keyfile`` serve TLS."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips or "",
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
    )
    await SignalledServer(config).serve(sockets=[sock])
