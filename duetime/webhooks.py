"""Webhook endpoints: what one is, its signature, its retries and the addresses it may reach.

A webhook endpoint is a destination name with an HTTP(S) URL: a message sent to ``billing`` is
POSTed to the URL registered as ``billing`` (``duetime webhooks add billing https://...``). The
store that holds the messages keeps the endpoints (:class:`duetime.interfaces.WebhookStore`), so
every dispatcher of the store delivers to the same ones and a change reaches them within seconds.

Requests are signed as the Standard Webhooks specification says (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of
``{id}.{timestamp}.{body}``), so a receiver verifies them with the ``standardwebhooks`` library of
its language. The secret is kept readable in the store (the signature needs it), unlike an API
key's; during a rotation two secrets sign every request and the receiver accepts either.

This module is the rules (stdlib only); the HTTP client is ``duetime.backends.webhooks``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from urllib.parse import urlsplit

from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_duration
from duetime.inputs.identifiers import check_name

#: What a Standard Webhooks secret starts with (the base64 of its key follows).
SECRET_PREFIX = "whsec_"
#: The delays after each failed attempt, in seconds: Standard Webhooks' own schedule (5 seconds,
#: 5 minutes, 30 minutes, 2, 5, 10 and 10 hours), so eight attempts over a day and a bit.
STANDARD_SCHEDULE: tuple[float, ...] = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
#: The same, as ``--retry-schedule`` takes it.
STANDARD_SCHEDULE_TEXT = "5s,5m,30m,2h,5h,10h,10h"
#: The longest a ``Retry-After`` answer is waited for; a longer one is waited this long.
LONGEST_RETRY_AFTER = 86400.0
#: Secrets that sign at once: the new one and the one it replaces, during a rotation.
MAX_SECRETS = 2
#: The statuses that mean "not now" rather than "never": tried again on the schedule.
RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504}) | frozenset(range(505, 600))
#: A message header passed on as an HTTP header: a token (RFC 9110), never one of ours.
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
#: Headers the request sets itself, which no message header may replace.
OWN_HEADERS = frozenset(
    {"content-type", "content-length", "host", "webhook-id", "webhook-timestamp", "webhook-signature"}
    | {"transfer-encoding", "connection", "user-agent", "authorization", "cookie"}
)
#: The cloud metadata services (AWS, GCP, Azure, on IPv4 and IPv6): never reached, even if a
#: network holding them is allowed, unless allowed by their own address.
METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)


def new_secret() -> str:
    """A new signing secret: ``whsec_`` and the base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def check_secret(secret: str) -> str:
    """A Standard Webhooks secret (``whsec_`` and base64 of 24 to 64 bytes), or a one-line error."""
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith(SECRET_PREFIX) or not 24 <= len(key) <= 64:
        raise ConfigurationError(
            "a webhook secret is 'whsec_' and the base64 of 24 to 64 random bytes; leave --secret "
            "out and one is made for you."
        )
    return secret


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,`` signature of the request, as Standard Webhooks defines it."""
    key = _key_of(secret)
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


@functools.lru_cache(maxsize=64)
def _key_of(secret: str) -> bytes:
    """A secret's key bytes (decoded once a secret, not once a request)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature_header(secrets_: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per active secret, space-separated."""
    return " ".join(signature(s, message_id, timestamp, body) for s in secrets_)


def check_url(url: str) -> str:
    """An http(s) URL with a host and no user or password in it (a secret in a URL is printed
    wherever the URL is), or a one-line error."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url)
    ):
        raise ConfigurationError(
            f"a webhook URL is http:// or https://, a host and a path, without a user or "
            f"password (sign with --secret instead); got {url!r}."
        )
    del port
    return url


#: Ports a URL without one means.
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_url(destination: str) -> bool:
    """A destination given as a URL (``https://…``) rather than an endpoint's name."""
    return destination.startswith(("http://", "https://"))


def check_url_pattern(pattern: str) -> str:
    """A URL pattern an endpoint delivers for: an http(s) URL whose host may start with one
    ``*.`` label (any subdomain, never the domain itself) and whose path may hold ``*`` (any
    characters, ``/`` too); no user, password, query or fragment. Else a one-line error."""
    parts = urlsplit(pattern.replace("*.", "wildcard.", 1) if "://*." in pattern else pattern)
    host_pattern = pattern.split("://", 1)[-1].split("/", 1)[0]
    if (
        "*" in host_pattern.removeprefix("*.")
        or parts.query
        or parts.fragment
        or "?" in pattern
        or "#" in pattern
    ):
        raise ConfigurationError(
            f"a webhook URL pattern is http(s)://HOST/PATH, its host exact or starting with one '*.' "
            f"label and '*' only in its path, without a query; got {pattern!r}."
        )
    check_url(parts.geturl().replace("*", "x"))
    return pattern


def _path_regex(path: str) -> re.Pattern[str]:
    """A pattern's path as a regular expression: ``*`` is any characters, everything else itself."""
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in path) + r"\Z", re.DOTALL)


#: The characters of a host name (after urlsplit lowers it): no percent sign, no other escape.
_HOST_NAME = re.compile(r"[a-z0-9.-]+")
#: A path that names something else than it seems: dot segments, encoded slashes, dots or
#: backslashes (a receiver may decode them into a path the pattern never allowed).
_TRICKY_PATH = re.compile(r"(^|/)\.\.?(/|$)|%2f|%2e|%5c|\\", re.IGNORECASE)


def url_matches(pattern: str, url: str) -> bool:
    """``url`` is one ``pattern`` allows, compared part by part (never as text: ``@``, ``#`` and
    encoded characters cannot make one host look like another): the same scheme and port, no
    user or fragment, the host itself or one of its subdomains where the pattern says ``*.``,
    and a path the pattern's matches, with no dot segment or encoded separator in it."""
    try:
        want, got = urlsplit(pattern.replace("://*.", "://wildcard.", 1)), urlsplit(url)
        want_port = want.port or DEFAULT_PORTS.get(want.scheme)
        got_port = got.port or DEFAULT_PORTS.get(got.scheme)
    except ValueError:
        return False
    host = got.hostname or ""
    if (
        got.scheme != want.scheme
        or got.username is not None
        or got.fragment
        or "#" in url
        or not (_HOST_NAME.fullmatch(host) or ":" in host)  # a name's own characters, or IPv6
        or got_port != want_port
        or _TRICKY_PATH.search(got.path)
        or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url)
    ):
        return False
    wanted_host = (want.hostname or "").lower()
    if pattern.split("://", 1)[-1].startswith("*."):
        suffix = wanted_host.removeprefix("wildcard")
        if not (host.endswith(suffix) and len(host) > len(suffix) and not host.startswith(".")):
            return False
    elif host != wanted_host:
        return False
    return bool(_path_regex(want.path or "/").match(got.path or "/"))


def endpoint_for_url(endpoints: Iterable[WebhookEndpoint], url: str) -> WebhookEndpoint | None:
    """The endpoint whose URL pattern allows ``url``, the most specific (longest pattern) where
    several do; None where none does."""
    allowing = [e for e in endpoints if e.is_pattern and url_matches(e.url, url)]
    return max(allowing, key=lambda e: (len(e.url), e.name), default=None)


def check_networks(networks: Iterable[str]) -> tuple[str, ...]:
    """Networks (``10.0.0.0/8``, ``127.0.0.1``, ``::1``) an endpoint may reach although they are
    internal, each written as Python's ``ipaddress`` writes it."""
    found: list[str] = []
    for text in networks:
        try:
            found.append(str(ipaddress.ip_network(text.strip(), strict=False)))
        except ValueError:
            raise ConfigurationError(
                f"--allow takes an address or a network (127.0.0.1, 10.0.0.0/8, ::1); got {text!r}."
            ) from None
    return tuple(found)


def check_header_names(names: Iterable[str]) -> tuple[str, ...]:
    """The message headers passed on as HTTP headers: tokens, none of the request's own."""
    found: list[str] = []
    for name in names:
        if not _HEADER_NAME.match(name) or name.lower() in OWN_HEADERS:
            raise ConfigurationError(
                f"--header takes a message header's name to pass on (letters, digits, '-', '_'), "
                f"not one the request sets itself ({', '.join(sorted(OWN_HEADERS))}); got {name!r}."
            )
        found.append(name)
    return tuple(found)


def read_schedule(text: str) -> tuple[float, ...]:
    """``5s,5m,30m`` as the delays after each failed attempt; ``none`` for no retries."""
    if text.strip().lower() == "none":
        return ()
    try:
        delays = tuple(parse_duration(part.strip()).total_seconds() for part in text.split(","))
    except ValueError:
        delays = ()
    if not delays or any(d < 0 for d in delays):
        raise ConfigurationError(
            f"--retry-schedule is the delays after each failed attempt, such as 5s,5m,30m,2h (or "
            f"'none'); got {text!r}."
        )
    return delays


@dataclass(frozen=True, slots=True)
class WebhookEndpoint:
    """A destination delivered by HTTP. ``secrets`` sign (newest first); ``headers`` are the
    message headers passed on; ``allow`` the internal networks it may reach on purpose;
    ``retry_schedule`` the delay after each failed attempt (out of it: the error queue)."""

    name: str
    url: str
    secrets: tuple[str, ...]
    created_at: datetime
    headers: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    retry_schedule: tuple[float, ...] = STANDARD_SCHEDULE
    timeout: float = 10.0
    connect_timeout: float = 5.0
    max_connections: int = 10
    follow_redirects: bool = False
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default=(), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        check_name("webhook", self.name)
        if "*" in self.url:
            check_url_pattern(self.url)
        else:
            check_url(self.url)
        if not 1 <= len(self.secrets) <= MAX_SECRETS:
            raise ConfigurationError(f"a webhook signs with 1 or {MAX_SECRETS} secrets.")
        for secret in self.secrets:
            check_secret(secret)
        check_header_names(self.headers)
        if not 0 < self.timeout <= 300 or not 0 < self.connect_timeout <= self.timeout:
            raise ConfigurationError(
                "--timeout is from 0 to 300 seconds, and --connect-timeout above 0 and not longer than it."
            )
        if not 1 <= self.max_connections <= 1000:
            raise ConfigurationError("--max-connections is from 1 to 1,000.")
        nets = tuple(ipaddress.ip_network(n, strict=False) for n in check_networks(self.allow))
        object.__setattr__(self, "networks", nets)

    @property
    def is_pattern(self) -> bool:
        """Its URL is a pattern: it delivers messages whose destination is a URL it allows
        (:func:`url_matches`), each to that URL."""
        return "*" in self.url

    def retry_after(self, failures: int) -> float | None:
        """The wait after the ``failures``-th failed attempt (1 is the first), or None: none left."""
        return self.retry_schedule[failures - 1] if 1 <= failures <= len(self.retry_schedule) else None

    def rotated(self, secret: str) -> WebhookEndpoint:
        """``secret`` signs first; the newest old one signs beside it until the next rotation."""
        return replace(self, secrets=(check_secret(secret), self.secrets[0]))

    def without_old_secret(self) -> WebhookEndpoint:
        """Only the newest secret signs: the receivers all have it."""
        return replace(self, secrets=self.secrets[:1])

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "url": self.url,
                "secrets": list(self.secrets),
                "created_at": self.created_at.isoformat(),
                "headers": list(self.headers),
                "allow": list(self.allow),
                "retry_schedule": list(self.retry_schedule),
                "timeout": self.timeout,
                "connect_timeout": self.connect_timeout,
                "max_connections": self.max_connections,
                "follow_redirects": self.follow_redirects,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> WebhookEndpoint:
        data = json.loads(text)
        return cls(
            name=data["name"],
            url=data["url"],
            secrets=tuple(data["secrets"]),
            created_at=datetime.fromisoformat(data["created_at"]),
            headers=tuple(data.get("headers", ())),
            allow=tuple(data.get("allow", ())),
            retry_schedule=tuple(float(d) for d in data.get("retry_schedule", STANDARD_SCHEDULE)),
            timeout=float(data.get("timeout", 10.0)),
            connect_timeout=float(data.get("connect_timeout", 5.0)),
            max_connections=int(data.get("max_connections", 10)),
            follow_redirects=bool(data.get("follow_redirects", False)),
        )

    def reaches(self, address: str) -> bool:
        """Whether a request may connect to ``address`` (an IP as the resolver answered it).

        Public addresses, yes. Loopback, private, link-local, multicast, unspecified, reserved
        and shared (carrier NAT) ones, and the cloud metadata services, only inside ``allow``.
        An IPv4 address written as IPv6 (``::ffff:127.0.0.1``, NAT64's ``64:ff9b::/96``, 6to4)
        is judged as the IPv4 address it carries, so no spelling slips past."""
        return _reaches(self.networks, address)


@functools.lru_cache(maxsize=4096)
def _reaches(networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], address: str) -> bool:
    """:meth:`WebhookEndpoint.reaches` for the endpoint's allowed ``networks``. Kept per networks
    and address: they always answer the same, and a burst to one webhook asked it for every
    request (parsing the address and walking the networks: 2.7 us a request, 0.7 kept)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    carried = _carried_ipv4(ip)
    if carried:
        return all(_reaches(networks, str(a)) for a in carried)
    if ip in METADATA_ADDRESSES:
        return any(net.num_addresses == 1 and ip in net for net in networks)
    if any(ip in net for net in networks if net.version == ip.version):
        return True
    return not _internal(ip)


#: Carrier-grade NAT's shared addresses (RFC 6598): inside some provider's network.
_SHARED = ipaddress.ip_network("100.64.0.0/10")


def _internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``ip`` is inside some network rather than on the internet (``ipaddress``'s checks
    walk lists of networks; :func:`_reaches` keeps the verdict, so this runs once an address)."""
    shared = ip.version == 4 and ip in _SHARED
    return bool(
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or shared
        or not ip.is_global
    )


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _carried_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for (mapped, NAT64, 6to4, Teredo's server)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


#: The bounds of the request-time histogram, in seconds (a receiver's answer: milliseconds to a
#: timeout's tens of seconds).
REQUEST_SECONDS_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: What an attempt can come to, beside the status class of an answer (``2xx``, ``4xx``, ...).
TIMED_OUT, UNREACHABLE, ADDRESS_REFUSED, NOT_SENT = "timeout", "unreachable", "address-refused", "not-sent"


@dataclass
class AttemptLog:
    """What a transport's attempts came to, per endpoint: how many of each outcome (an answer's
    status class, ``2xx`` to ``5xx``, or ``timeout``, ``unreachable``, ``address-refused``,
    ``not-sent``) and how long the requests took. Kept in memory by the transport that makes
    them; a metrics registry reads it on each scrape."""

    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    #: per endpoint: the count of requests at or under each of :data:`REQUEST_SECONDS_BOUNDS`
    #: (and one over them all), and the seconds they took in all
    seconds: dict[str, tuple[list[int], float]] = field(default_factory=dict)

    #: per endpoint: what its latest attempt came to, and when (seconds since 1970)
    latest: dict[str, tuple[str, int]] = field(default_factory=dict)

    def record(self, endpoint: str, outcome: str, took: float | None, at: int = 0) -> None:
        """One attempt to ``endpoint`` at ``at`` (seconds since 1970): its outcome, and its
        request's seconds (None: none made)."""
        key = (endpoint, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.latest[endpoint] = (outcome, at)
        if took is None:
            return
        counts, total = self.seconds.get(endpoint) or ([0] * (len(REQUEST_SECONDS_BOUNDS) + 1), 0.0)
        index = next((i for i, bound in enumerate(REQUEST_SECONDS_BOUNDS) if took <= bound), -1)
        counts[index] += 1
        self.seconds[endpoint] = (counts, total + took)


#: An endpoint's health from what its latest attempt came to: delivered, refused by the receiver
#: or by the addresses allowed (a message's or a setting's fault, not the receiver's health), or failing.
HEALTH = {"2xx": "ok", "4xx": "refusing", ADDRESS_REFUSED: "refusing", NOT_SENT: "refusing"}


def endpoint_health(logs: Iterable[AttemptLog]) -> dict[str, dict[str, int | str]]:
    """Each endpoint's attempts across ``logs`` (several dispatchers, several routes): the count of
    each outcome, what the latest came to (``last``), when (``last_at``, seconds since 1970), and
    its health from that (``health``: ``ok``, ``refusing`` or ``failing``)."""
    found: dict[str, dict[str, int | str]] = {}
    for log in logs:
        for (name, outcome), count in list(log.outcomes.items()):
            counts = found.setdefault(name, {})
            counts[outcome] = int(counts.get(outcome, 0)) + count
        for name, (outcome, at) in list(log.latest.items()):
            counts = found.setdefault(name, {})
            if at >= int(counts.get("last_at", -1)):
                counts.update(last=outcome, last_at=at, health=HEALTH.get(outcome, "failing"))
    return found


def status_class(status: int) -> str:
    """``2xx`` for 204: the outcome an answer's status gives an attempt."""
    return f"{status // 100}xx" if 100 <= status < 600 else "other"
