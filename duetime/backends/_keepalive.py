"""How long a dead peer may go unnoticed on a connection: the one rule every backend's sockets
follow, so that no thread waits for ever in a read on a partitioned network.

A partition resets nothing: a read waits until the kernel gives up, which by the operating
system's defaults is two hours of silence before the first keepalive probe (and about 15 minutes
of retransmissions for data sent and never acknowledged). With these settings an idle connection
to a peer that went silent is found dead within about 25 s (10 s idle, then 3 probes 5 s apart),
and one whose sent data goes unacknowledged within 30 s. A healthy peer answers probes at the TCP
level, so a long query or a long blocking read is never cut by them.
"""

from __future__ import annotations

import socket
from typing import Any

IDLE, INTERVAL, COUNT = 10, 5, 3
#: Milliseconds sent data may stay unacknowledged before the connection is dropped.
USER_TIMEOUT_MS = 30_000

#: libpq's names for the same (connection options; a URL that sets one keeps its own).
LIBPQ = {
    "keepalives": "1",
    "keepalives_idle": str(IDLE),
    "keepalives_interval": str(INTERVAL),
    "keepalives_count": str(COUNT),
    "tcp_user_timeout": str(USER_TIMEOUT_MS),
}


def socket_options() -> dict[int, int]:
    """The TCP-level options (``TCP_KEEPIDLE`` and friends) by their number, where this
    platform has them (redis-py takes them in this form)."""
    wanted = {
        "TCP_KEEPIDLE": IDLE,
        "TCP_KEEPINTVL": INTERVAL,
        "TCP_KEEPCNT": COUNT,
        "TCP_USER_TIMEOUT": USER_TIMEOUT_MS,
    }
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def keep_alive(sock: Any) -> None:
    """Turn keepalive probes and the unacknowledged-data limit on for a connected socket."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket has no network to lose
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in socket_options().items():
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
