"""What duetime's two web servers share (the probes of ``duetime run`` and ``duetime dashboard``):
a socket bound before anything starts, so a port in use is a one-line error and not a traceback
from deep inside uvicorn, and uvicorn run inside an event loop someone else owns."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Iterator

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
