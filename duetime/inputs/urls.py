"""URLs as users give them: their options read and checked once, and the one rule that hides
their secrets."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from duetime.errors import ConfigurationError

#: Schemes whose URL may carry a token as its only user part (``nats://TOKEN@host``).
TOKEN_SCHEMES = frozenset({"nats", "tls", "nats+tls"})
#: Query options whose value is a secret: any name holding one of these words.
SECRET_WORDS = ("password", "passwd", "secret", "token", "apikey", "api_key", "credential")
HIDDEN = "***"
_USERINFO = re.compile(r"(?<=//)[^/?#@\s]*(?=@)")
_PASSWORD_LIKE = re.compile(r"(?<=:)[^:/?#@\s]*(?=@)")


def redact(url: str) -> str:
    """The URL with every secret in it replaced by ``***``: the only form that goes into logs,
    errors, pages, metrics and records. One rule for every form a secret takes: a password
    (``user:PW@``), a token as the only user part (``nats://TOKEN@host``), a query option named
    like a secret (``?password=``, ``?sslpassword=``, ``?token=``), and a URL too malformed to
    parse (``postgresql:/user:PW@host``: whatever sits before an ``@`` is hidden)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an IPv6 address not closed: hide whatever sits before an @
        return _PASSWORD_LIKE.sub(HIDDEN, _USERINFO.sub(HIDDEN, url))
    if not parts.netloc and "//" not in url:  # ``scheme:/user:PW@host``: a slash short
        return _PASSWORD_LIKE.sub(HIDDEN, url)
    hidden, netloc = url, parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:{HIDDEN}"
        elif parts.scheme.lower() in TOKEN_SCHEMES:
            userinfo = HIDDEN
        hidden = hidden.replace(f"//{netloc}", f"//{userinfo}@{host}", 1)
    if parts.query:  # every other character stays as it was written
        query = "&".join(_hide_option(option) for option in parts.query.split("&"))
        hidden = hidden.replace(f"?{parts.query}", f"?{query}", 1)
    return hidden


def _hide_option(option: str) -> str:
    name, equals, _value = option.partition("=")
    secret = any(word in name.lower().replace("-", "_") for word in SECRET_WORDS)
    return f"{name}={HIDDEN}" if equals and secret else option


#: Bounds for numeric URL options: seconds from a millisecond to a day, counts up to a million.
#: Beyond them a value is a typo (``1e300``, ``1e-300``) that would hang or spin, not a setting.
SECONDS_RANGE = (0.001, 86_400.0)
COUNT_RANGE = (1.0, 1_000_000.0)


def number_option(
    options: Mapping[str, str], name: str, default: float, *, whole: bool = False, minimum: float = 0.0
) -> float:
    """A numeric URL option (``?claim_timeout=30``), or ConfigurationError naming it and the fix.

    Seconds must lie in :data:`SECONDS_RANGE`, whole numbers in :data:`COUNT_RANGE`.
    """
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(int(raw)) if whole else float(raw)
    except ValueError:
        kind = "a whole number" if whole else "a number (seconds)"
        raise ConfigurationError(
            f"URL option {name}={raw!r} must be {kind}, e.g. {name}={default:g}."
        ) from None
    if not value > minimum:
        raise ConfigurationError(f"URL option {name} must be greater than {minimum:g}, got {raw!r}.")
    low, high = COUNT_RANGE if whole else SECONDS_RANGE
    if not (math.isfinite(value) and low <= value <= high):
        unit = "" if whole else " seconds"
        raise ConfigurationError(f"URL option {name}={raw!r} must be between {low:g} and {high:g}{unit}.")
    return value


def url_options(url: str, known: Collection[str], what: str) -> tuple[str, dict[str, str]]:
    """The URL without its query, and its options by name (a name given twice keeps its last
    value): the one reader of a backend URL's options. A name not in ``known`` is refused."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    refuse_unknown(options, known, what, url)
    return urlunsplit(parts._replace(query="")), options


def refuse_unknown(options: Mapping[str, str], known: Collection[str], what: str, url: str) -> None:
    """A one-line error naming the options ``what`` takes, for a name it does not: the drivers
    drop a name they do not know without a word, so a misspelt option would do nothing."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigurationError(
            f"Unknown {what} URL option(s) {unknown} in {redact(url)}; known: {', '.join(sorted(set(known)))}."
        )


def one_url_per_host(url: str) -> list[str]:
    """The URL of each server a URL names, as libpq reads several hosts: ``user:pw@a:1,b:2/x?o=1``
    is ``user:pw@a:1/x?o=1`` and ``user:pw@b:2/x?o=1`` (a cluster's nodes in one setting)."""
    parts = urlsplit(url)
    users, at, hosts = parts.netloc.rpartition("@")
    return [urlunsplit(parts._replace(netloc=f"{users}{at}{host}")) for host in hosts.split(",") if host] or [
        url
    ]
