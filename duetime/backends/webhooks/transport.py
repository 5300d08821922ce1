"""Delivery by HTTP: each message POSTed, signed, to the webhook endpoint its destination names.

The endpoints are the store's (``duetime webhooks add``), read again every
:data:`REFRESH_EVERY` seconds, so every dispatcher of the store delivers to the same ones and a
rotated secret or a removed endpoint takes effect within seconds.

The HTTP client is httpcore, the connection pool under httpx (same maintainers): it lets the
connection itself be made by duetime (:class:`GuardedNetwork`), which checks the address a
name resolved to just before connecting to that very address. A check of the name beforehand
would let a resolver answer a public address to the check and 127.0.0.1 to the connection (DNS
rebinding); httpx's own client has no place for that. One pool per endpoint: its connection
limit and keep-alive are the endpoint's.

What an answer means (:func:`outcome`): a 2xx is delivered; 408, 425, 429 and 5xx, a timeout, a
refused or reset connection are :class:`RetryLater` on the endpoint's schedule (``Retry-After``
honoured), then the error queue; any other status goes to the error queue at once with the status
and the first kilobyte of what the receiver said.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

import httpcore

from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    MessageRefused,
    RetryLater,
    TransportUnavailable,
    one_line,
)
from duetime.interfaces import AsyncClosing, WebhookStore
from duetime.message import DelayedMessage, outgoing_headers
from duetime.version import __version__
from duetime.webhooks import (
    LONGEST_RETRY_AFTER,
    RETRIED_STATUSES,
    WebhookEndpoint,
    check_url,
    signature_header,
)

#: How often the endpoints are read again from the store.
REFRESH_EVERY = 2.0
#: What of a refusing receiver's answer is kept in the error queue's headers.
KEPT_OF_ANSWER = 1024
#: The most of an answer read (the rest is not waited for: the connection is closed instead).
READ_AT_MOST = 64 * 1024
#: Redirects followed in a row, where an endpoint allows them.
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: The system's certificate authorities (SSL_CERT_FILE and SSL_CERT_DIR name others, as for
#: every OpenSSL program), made once: a context is costly to make and safe to share.
_TRUSTED = ssl.create_default_context()
#: Who is calling, as the receiver's logs show it.
USER_AGENT = f"duetime/{__version__} (webhooks)"


class AddressNotAllowed(Exception):
    """The name resolved only to addresses the endpoint may not reach."""


class GuardedNetwork(httpcore.AsyncNetworkBackend):
    """httpcore's own network backend, connecting only to addresses ``endpoint`` may reach.

    The name is resolved here and the connection made to the address checked, so what was
    checked is what is connected to; TLS still verifies the certificate against the name (httpcore
    passes it on as the server name). Every spelling of an address (``2130706433``, ``0x7f.1``,
    ``::ffff:127.0.0.1``) is the address the resolver makes of it, and that is what is judged."""

    def __init__(self, endpoint: WebhookEndpoint, resolve: Resolver | None = None) -> None:
        self.endpoint = endpoint
        self.inner = httpcore.AnyIOBackend()
        self.resolve = resolve or _resolve

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await asyncio.wait_for(self.resolve(host, port), timeout)
        except (OSError, TimeoutError) as error:
            raise httpcore.ConnectError(f"{host} does not resolve: {one_line(error)}") from error
        allowed = [a for a in addresses if self.endpoint.reaches(a)]
        if not allowed:
            raise AddressNotAllowed(
                f"{host} is {', '.join(addresses) or 'no address'}, which webhook "
                f"{self.endpoint.name!r} may not reach (loopback, private, link-local and metadata "
                f"addresses are refused); allow it on purpose with `duetime webhooks add ... --allow ADDRESS`"
            )
        last: Exception | None = None
        for address in allowed:
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as error:
                last = error
        assert last is not None
        raise last

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise AddressNotAllowed("webhooks are delivered over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


Resolver = Callable[[str, int], Any]


async def _resolve(host: str, port: int) -> list[str]:
    """Every address of ``host``, as the system resolver answers (and reads numbers such as
    ``2130706433``)."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


def _retry_after(headers: Sequence[tuple[bytes, bytes]]) -> float | None:
    """A ``Retry-After`` answer in seconds (a number or an HTTP date), or None."""
    for name, value in headers:
        if name.lower() != b"retry-after":
            continue
        text = value.decode("latin-1").strip()
        try:
            seconds = float(text)
        except ValueError:
            try:
                seconds = parsedate_to_datetime(text).timestamp() - time.time()
            except (TypeError, ValueError):
                return None
        return min(max(seconds, 0.0), LONGEST_RETRY_AFTER)
    return None


def _header(headers: Sequence[tuple[bytes, bytes]], wanted: bytes) -> str | None:
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


def outcome(
    endpoint: WebhookEndpoint, message: DelayedMessage, status: int, headers: Any, answer: bytes
) -> Exception | None:
    """What the receiver's answer makes of this attempt."""
    if 200 <= status < 300:
        return None
    said = " ".join(answer[:KEPT_OF_ANSWER].decode("utf-8", "replace").split())
    reason = f"webhook {endpoint.name!r} answered {status}" + (f": {said!r}" if said else "")
    if status in RETRIED_STATUSES:
        return retry_or_give_up(endpoint, message, reason, _retry_after(headers))
    return MessageRefused(reason)


def retry_or_give_up(
    endpoint: WebhookEndpoint, message: DelayedMessage, reason: str, asked: float | None = None
) -> Exception:
    """RetryLater while the endpoint's schedule has a try left (after what the receiver asked
    for, if it did), else a refusal that says how many tries were made."""
    failures = message.failure_count + 1
    wait = endpoint.retry_after(failures)
    if wait is None:
        return MessageRefused(f"{reason}; gave up after {failures} attempt{'s' if failures != 1 else ''}")
    return RetryLater(reason, after=wait if asked is None else asked)


class WebhookTransport(AsyncClosing):
    """Sends each message to the webhook endpoint named by its destination (``webhooks://``).

    The endpoints come from the store the dispatcher delivers from (:meth:`attach_store`, which
    ``duetime.Service`` calls), or are given (``endpoints=``, for tests and embedding)."""

    def __init__(
        self,
        endpoints: Sequence[WebhookEndpoint] | None = None,
        *,
        resolve: Resolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = "webhooks://"
        self._given = list(endpoints) if endpoints is not None else None
        self._store: WebhookStore | None = None
        self._endpoints: dict[str, WebhookEndpoint] = {e.name: e for e in self._given or ()}
        self._pools: dict[str, tuple[WebhookEndpoint, httpcore.AsyncConnectionPool]] = {}
        self._read_at = -REFRESH_EVERY
        self._resolve = resolve
        self._clock = clock
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> WebhookTransport:
        """``webhooks://``: the endpoints the store keeps (``duetime webhooks add``)."""
        if url.rstrip("/") not in ("webhooks:", "webhooks:/"):
            raise ConfigurationError(
                f"a webhook transport's URL is webhooks:// and nothing else; got {url!r}."
            )
        return cls()

    def attach_store(self, store: object) -> None:
        """Read the endpoints from ``store`` (a :class:`WebhookStore`)."""
        if self._given is None:
            if not isinstance(store, WebhookStore):
                raise ConfigurationError(
                    f"{type(store).__name__} keeps no webhook endpoints; deliver from a duetime store."
                )
            self._store = store

    async def start(self) -> None:
        if self._closed:
            raise TransportUnavailable("the webhook transport is closed")
        await self._refresh(force=True)

    async def declare(self, queue: str) -> None:
        """A webhook is not made by declaring it: one that is not registered is a one-line error."""
        await self._refresh(force=True)
        if queue not in self._endpoints:
            raise DestinationNotFound(_not_registered(queue))

    async def close(self) -> None:
        self._closed = True
        pools, self._pools = self._pools, {}
        for _, pool in pools.values():
            with contextlib.suppress(Exception):
                await pool.aclose()

    async def endpoints(self) -> list[WebhookEndpoint]:
        """The endpoints as last read."""
        await self._refresh()
        return list(self._endpoints.values())

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        if self._closed:
            raise TransportUnavailable("the webhook transport is closed")
        try:
            await self._refresh()
        except Exception as error:  # the store cannot be read: nothing goes until it can
            raise TransportUnavailable(f"cannot read the webhook endpoints: {one_line(error)}") from error
        return list(await asyncio.gather(*(self._send(m) for m in messages)))

    async def _refresh(self, force: bool = False) -> None:
        if self._store is None or (not force and time.monotonic() - self._read_at < REFRESH_EVERY):
            return
        self._endpoints = {e.name: e for e in await self._store.webhooks()}
        self._read_at = time.monotonic()
        for name, (kept, pool) in list(self._pools.items()):
            if self._endpoints.get(name) != kept:  # changed or removed: its next request opens anew
                del self._pools[name]
                with contextlib.suppress(Exception):
                    await pool.aclose()

    def _pool(self, endpoint: WebhookEndpoint) -> httpcore.AsyncConnectionPool:
        kept = self._pools.get(endpoint.name)
        if kept is not None and kept[0] == endpoint:
            return kept[1]
        pool = httpcore.AsyncConnectionPool(
            ssl_context=_TRUSTED,
            max_connections=endpoint.max_connections,
            keepalive_expiry=30.0,
            network_backend=GuardedNetwork(endpoint, self._resolve),
        )
        self._pools[endpoint.name] = (endpoint, pool)
        return pool

    async def _send(self, message: DelayedMessage) -> Exception | None:
        endpoint = self._endpoints.get(message.destination)
        if endpoint is None:
            return DestinationNotFound(_not_registered(message.destination))
        try:
            request = _request_headers(endpoint, message, int(self._clock()))
        except MessageRefused as refused:
            return refused
        try:
            async with asyncio.timeout(endpoint.timeout):
                return await self._post(endpoint, message, request)
        except AddressNotAllowed as refused:
            return MessageRefused(str(refused))
        except (TimeoutError, httpcore.TimeoutException):
            return retry_or_give_up(endpoint, message, f"webhook {endpoint.name!r} did not answer in time")
        except (httpcore.NetworkError, httpcore.RemoteProtocolError) as error:
            said = one_line(error) or type(error).__name__
            return retry_or_give_up(
                endpoint, message, f"webhook {endpoint.name!r} could not be reached: {said}"
            )
        except (httpcore.UnsupportedProtocol, httpcore.LocalProtocolError, ConfigurationError) as error:
            return MessageRefused(f"webhook {endpoint.name!r}: {one_line(error)}")

    async def _post(
        self, endpoint: WebhookEndpoint, message: DelayedMessage, headers: list[tuple[bytes, bytes]]
    ) -> Exception | None:
        url = endpoint.url
        timeouts = {"connect": endpoint.connect_timeout, "read": endpoint.timeout, "write": endpoint.timeout}
        for _ in range(MAX_REDIRECTS + 1):
            async with self._pool(endpoint).stream(
                "POST", url, headers=headers, content=message.body, extensions={"timeout": timeouts}
            ) as response:
                answer = bytearray()
                async for chunk in response.aiter_stream():
                    answer += chunk
                    if len(answer) >= READ_AT_MOST:
                        break
            location = _header(response.headers, b"location")
            if response.status in REDIRECTS and endpoint.follow_redirects and location:
                url = check_url(urljoin(url, location))
                continue
            return outcome(endpoint, message, response.status, response.headers, bytes(answer))
        return MessageRefused(f"webhook {endpoint.name!r} redirected more than {MAX_REDIRECTS} times")


def _request_headers(
    endpoint: WebhookEndpoint, message: DelayedMessage, timestamp: int
) -> list[tuple[bytes, bytes]]:
    """The request's headers: the signature's three, the content type and due time, and the
    message headers the endpoint passes on; MessageRefused for one HTTP cannot carry unchanged."""
    sent = outgoing_headers(message)
    content_type = (
        sent.get("content-type") or sent.get("NServiceBus.ContentType") or "application/octet-stream"
    )
    headers = {
        "content-type": content_type,
        "user-agent": USER_AGENT,
        "duetime-due-at": sent["duetime-due-at"],
        "webhook-id": message.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(endpoint.secrets, message.message_id, timestamp, message.body),
    }
    lowered = {name.lower(): value for name, value in sent.items()}
    for name in endpoint.headers:
        if name.lower() in lowered:
            headers[name] = lowered[name.lower()]
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers.items():
        if not _carriable(value):
            what = "id" if name == "webhook-id" else f"header {name!r}"
            raise MessageRefused(
                f"a webhook request cannot carry the message's {what} unchanged (it holds a line break, "
                f"a control character or a character beyond ASCII)"
            )
        out.append((name.encode("ascii"), value.encode("ascii")))
    return out


def _carriable(value: str) -> bool:
    return value.isascii() and all(32 <= ord(c) < 127 or c == "\t" for c in value)


def _not_registered(name: str) -> str:
    return (
        f"no webhook endpoint is registered as {name!r}: `duetime webhooks add {name} URL` "
        f"registers one (`duetime webhooks list` shows those there are)"
    )
