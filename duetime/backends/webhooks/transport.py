"""Delivery by HTTP: each message POSTed, signed, to the webhook endpoint its destination names.

The endpoints are the store's (``duetime webhooks add``), read again every
:data:`REFRESH_EVERY` seconds, so every dispatcher of the store delivers to the same ones and a
rotated secret or a removed endpoint takes effect within seconds.

The HTTP client is aiohttp: its connector connects to the addresses its resolver answers, and
duetime's resolver (:class:`GuardedResolver`) answers only those the endpoint may reach, so what is
checked is what is connected to. A check of the name beforehand would let a resolver answer a
public address to the check and 127.0.0.1 to the connection (DNS rebinding). A host written as
an address (``2130706433``, ``[::ffff:127.0.0.1]``) is never resolved, so it is checked before the
request (:func:`check_literal`). httpx was measured first: on the same receiver its pool cost
0.8 ms of CPU a request at 10 connections, aiohttp's 0.09 ms (``bench/webhooks_bench.py``). One
connector per endpoint: its connection limit and keep-alive are the endpoint's.

What an answer means (:func:`outcome`): a 2xx is delivered; 408, 425, 429 and 5xx, a timeout, a
refused or reset connection are :class:`RetryLater` on the endpoint's schedule (``Retry-After``
honoured), then the error queue; any other status goes to the error queue at once with the status
and the first kilobyte of what the receiver said.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from duetime.backends.transport_base import AsyncClientTransport
from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    MessageRefused,
    RetryLater,
    TransportUnavailable,
    one_line,
)
from duetime.inputs.urls import redact
from duetime.interfaces import WebhookStore
from duetime.message import DelayedMessage, outgoing_headers
from duetime.version import __version__
from duetime.webhooks import (
    ADDRESS_REFUSED,
    LONGEST_RETRY_AFTER,
    NOT_SENT,
    RETRIED_STATUSES,
    TIMED_OUT,
    UNREACHABLE,
    AttemptLog,
    WebhookEndpoint,
    check_url,
    endpoint_for_url,
    is_url,
    signature_header,
    status_class,
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


class AddressNotAllowed(OSError):
    """The name resolved only to addresses the endpoint may not reach."""


def _not_allowed(endpoint: WebhookEndpoint, host: str, addresses: Sequence[str]) -> AddressNotAllowed:
    return AddressNotAllowed(
        f"{host} is {', '.join(addresses) or 'no address'}, which webhook {endpoint.name!r} may not "
        f"reach (loopback, private, link-local and metadata addresses are refused); allow it on "
        f"purpose with `duetime webhooks add {endpoint.name} URL --allow ADDRESS`"
    )


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def _resolve(host: str, port: int) -> list[str]:
    """Every address of ``host``, as the system resolver answers."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


class GuardedResolver(AbstractResolver):
    """The connector's resolver: the addresses of a name that ``endpoint`` may reach, and the
    connection is made to one of those. None: AddressNotAllowed, which the request reports."""

    def __init__(self, endpoint: WebhookEndpoint, resolve: Resolver | None = None) -> None:
        self.endpoint = endpoint
        self._resolve = resolve or _resolve

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await self._resolve(host, port)
        allowed = [a for a in addresses if self.endpoint.reaches(a)]
        if not allowed:
            raise _not_allowed(self.endpoint, host, addresses)
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for a in allowed
        ]

    async def close(self) -> None:
        pass


def check_literal(endpoint: WebhookEndpoint, host: str) -> None:
    """A host written as an address in any spelling (``127.1``, ``2130706433``, ``0x7f.1``,
    ``::ffff:127.0.0.1``), which the connector connects to without asking the resolver: checked
    here, as the system reads it. A name passes (its resolver checks it)."""
    addresses = _literal_addresses(host)
    if addresses and not all(endpoint.reaches(a) for a in addresses):
        raise _not_allowed(endpoint, host, list(addresses))


@functools.lru_cache(maxsize=4096)
def _literal_addresses(host: str) -> tuple[str, ...]:
    """The addresses ``host`` is as a literal, as the system reads it; none for a name. Kept:
    a spelling always reads the same, and asking the system took a seventh of a burst's time."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in found))


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


class WebhookTransport(AsyncClientTransport):
    """Sends each message to the webhook endpoint named by its destination (``webhooks://``).

    On :class:`~duetime.backends.transport_base.AsyncClientTransport`: every request of a batch
    starts at once (each endpoint's connection limit queues what is over it), and each answer,
    retries included, is awaited after.

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
        self._sessions: dict[str, tuple[WebhookEndpoint, aiohttp.ClientSession]] = {}
        self._read_at = -REFRESH_EVERY
        self._resolve = resolve
        self._clock = clock
        #: What each attempt came to, per endpoint (the metrics read it).
        self.attempt_log = AttemptLog()

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

    async def _open(self) -> None:
        await self._refresh(force=True)

    async def declare(self, queue: str) -> None:
        """A webhook is not made by declaring it: one that is not registered (or a URL no
        endpoint's pattern allows) is a one-line error."""
        await self._refresh(force=True)
        endpoint, _ = self._endpoint_for(queue)
        if isinstance(endpoint, Exception):
            raise endpoint

    async def _let_go(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for _, session in sessions.values():
            with contextlib.suppress(Exception):
                await session.close()

    async def endpoints(self) -> list[WebhookEndpoint]:
        """The endpoints as last read."""
        await self._refresh()
        return list(self._endpoints.values())

    async def _ready(self) -> None:
        try:
            await self._refresh()
        except Exception as error:  # the store cannot be read: nothing goes until it can
            raise TransportUnavailable(f"cannot read the webhook endpoints: {one_line(error)}") from error

    def _hand_over(self, message: DelayedMessage) -> Awaitable[Exception | None]:
        return asyncio.ensure_future(self._send(message))

    async def _refresh(self, force: bool = False) -> None:
        if self._store is None or (not force and time.monotonic() - self._read_at < REFRESH_EVERY):
            return
        self._endpoints = {e.name: e for e in await self._store.webhooks()}
        self._read_at = time.monotonic()
        for name, (kept, session) in list(self._sessions.items()):
            if self._endpoints.get(name) != kept:  # changed or removed: its next request opens anew
                del self._sessions[name]
                with contextlib.suppress(Exception):
                    await session.close()

    def _session(self, endpoint: WebhookEndpoint) -> aiohttp.ClientSession:
        """The endpoint's connections: at most ``max_connections``, kept alive between messages."""
        kept = self._sessions.get(endpoint.name)
        if kept is not None and kept[0] == endpoint:
            return kept[1]
        connector = aiohttp.TCPConnector(
            limit=endpoint.max_connections,
            limit_per_host=endpoint.max_connections,
            keepalive_timeout=30.0,
            resolver=GuardedResolver(endpoint, self._resolve),
            ssl=_TRUSTED,
        )
        # The attempt's whole time is :meth:`_attempt`'s own timeout (redirects included): a
        # second timer a request here cost a scheduled call and a task lookup for nothing.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=endpoint.connect_timeout)
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            trust_env=False,  # never a proxy from the environment: the address check is ours
        )
        self._sessions[endpoint.name] = (endpoint, session)
        return session

    async def _send(self, message: DelayedMessage) -> Exception | None:
        endpoint, url = self._endpoint_for(message.destination)
        if isinstance(endpoint, Exception):
            return endpoint
        try:
            request = _request_headers(endpoint, message, int(self._clock()))
        except MessageRefused as refused:
            self.attempt_log.record(endpoint.name, NOT_SENT, None, int(self._clock()))
            return refused
        started = time.monotonic()
        answer, came_to = await self._attempt(endpoint, message, request, url)
        self.attempt_log.record(endpoint.name, came_to, time.monotonic() - started, int(self._clock()))
        return answer

    def _endpoint_for(self, destination: str) -> tuple[WebhookEndpoint | Exception, str]:
        """The endpoint that delivers ``destination`` and the URL it posts to: the endpoint of that
        name at its URL, or for a URL the endpoint whose pattern allows it, at that URL."""
        endpoint = self._endpoints.get(destination)
        if endpoint is not None and endpoint.is_pattern:
            return MessageRefused(
                f"webhook {destination!r} delivers to the URLs its pattern {endpoint.url} allows: give "
                "one of them as the destination, not its name"
            ), ""
        if endpoint is not None:
            return endpoint, endpoint.url
        if not is_url(destination):
            return DestinationNotFound(_not_registered(destination)), ""
        found = endpoint_for_url(self._endpoints.values(), destination)
        if found is None:
            return MessageRefused(
                f"no webhook endpoint allows the URL {redact(destination)}: add one whose URL is a pattern "
                "it matches (`duetime webhooks add NAME 'https://host/path/*' --secret …`)"
            ), ""
        return found, destination

    async def _attempt(
        self, endpoint: WebhookEndpoint, message: DelayedMessage, request: dict[str, str], url: str
    ) -> tuple[Exception | None, str]:
        """One attempt's answer, and what it came to (for :attr:`attempts`)."""
        try:
            async with asyncio.timeout(endpoint.timeout):
                status, answer = await self._post(endpoint, self._session(endpoint), message, request, url)
                return answer, status_class(status)
        except AddressNotAllowed as refused:
            return MessageRefused(str(refused)), ADDRESS_REFUSED
        except aiohttp.ClientConnectorDNSError as error:
            if isinstance(error.os_error, AddressNotAllowed):
                return MessageRefused(str(error.os_error)), ADDRESS_REFUSED
            said = f"its name does not resolve: {error.os_error}"
            reason = f"webhook {endpoint.name!r} could not be reached: {said}"
            return retry_or_give_up(endpoint, message, reason), UNREACHABLE
        except (TimeoutError, aiohttp.ServerTimeoutError):
            reason = f"webhook {endpoint.name!r} did not answer in time"
            return retry_or_give_up(endpoint, message, reason), TIMED_OUT
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as error:
            reason = f"webhook {endpoint.name!r} could not be reached: {one_line(error)}"
            return retry_or_give_up(endpoint, message, reason), UNREACHABLE
        except (aiohttp.InvalidURL, aiohttp.ClientResponseError, ConfigurationError, ValueError) as error:
            return MessageRefused(f"webhook {endpoint.name!r}: {one_line(error)}"), NOT_SENT

    async def _post(
        self,
        endpoint: WebhookEndpoint,
        session: aiohttp.ClientSession,
        message: DelayedMessage,
        headers: dict[str, str],
        url: str,
    ) -> tuple[int, Exception | None]:
        """The last answer's status and what it makes of the attempt (``url``: where it posts)."""
        for _ in range(MAX_REDIRECTS + 1):
            check_literal(endpoint, urlsplit(url).hostname or "")
            async with session.post(
                url, data=message.body, headers=headers, allow_redirects=False
            ) as response:
                answer = await response.content.read(READ_AT_MOST)
                status, location = response.status, response.headers.get("location")
                answered = list(response.raw_headers)
            if status in REDIRECTS and endpoint.follow_redirects and location:
                url = check_url(urljoin(url, location))
                continue
            return status, outcome(endpoint, message, status, answered, answer)
        return status, MessageRefused(f"webhook {endpoint.name!r} redirected more than {MAX_REDIRECTS} times")


def _request_headers(endpoint: WebhookEndpoint, message: DelayedMessage, timestamp: int) -> dict[str, str]:
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
    for name, value in headers.items():
        if not _carriable(value):
            what = "id" if name == "webhook-id" else f"header {name!r}"
            raise MessageRefused(
                f"a webhook request cannot carry the message's {what} unchanged (it holds a line break, "
                f"a control character or a character beyond ASCII)"
            )
    return headers


#: What an HTTP header's value carries unchanged: printable ASCII and tabs.
_CARRIABLE = re.compile(r"[\t\x20-\x7e]*\Z")


def _carriable(value: str) -> bool:
    return _CARRIABLE.match(value) is not None


def _not_registered(name: str) -> str:
    return (
        f"no webhook endpoint is registered as {name!r}: `duetime webhooks add {name} URL` "
        f"registers one (`duetime webhooks list` shows those there are)"
    )
