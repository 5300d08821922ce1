"""URLs as users give them: their options read and checked once, and the one rule that hides
their secrets."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from duetime.errors import ConfigurationError

#: Schemes whose URL may carry a token as its only user part (``nats://TOKEN@host``).
TOKEN_SCHEMES = frozenset({"nats", "tls", "nats+tls"})
#: Option names (URL query options, keyword connection strings) whose value is a secret: a name
#: that, percent-decoded and case-folded, holds one of ``SECRET_WORDS`` or ends in one of
#: ``SECRET_ENDINGS`` (``sslkey``, ``api_key``, MariaDB's ``pwd``).
SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "apikey")
SECRET_ENDINGS = ("pwd", "key", "pass")
HIDDEN = "***"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
#: ``key=value`` pairs of a keyword connection string (libpq's ``host=h password='a b'``). A key
#: starts a word and is taken whole (possessive): tried at every letter of a long word, it cost
#: the square of the word's length (27 s for a 32 KB body).
_KEYWORD = re.compile(r"(?<!\S)([^\s=]++)(\s*+=\s*+)('(?:[^'\\]|\\.)*+'?|\S*+)")


def is_secret(name: str) -> bool:
    """Whether an option called ``name`` (as written: ``%70assword`` too) holds a secret."""
    folded = unquote(name).casefold().replace("-", "_").strip()
    return any(word in folded for word in SECRET_WORDS) or folded.endswith(SECRET_ENDINGS)


def redact(url: str) -> str:
    """The URL as it may be shown: the only form that goes into logs, errors, pages, metrics and
    records. It is rebuilt from its parts with every credential replaced by ``***``: the password
    of the user part (and a token that is the whole user part: ``nats://TOKEN@host``), every
    option whose name is a secret's (``?password=``, ``?%70assword=``, ``?pwd=``, ``?sslkey=``),
    the values of such keys in a keyword connection string (``host=h password=…``); a URL
    wrapped in another scheme (``sealed:amqp://…``) as that scheme and the URL shown.

    A password may hold ``#``, ``/`` or ``?`` unencoded (generated ones often do) and drivers
    disagree on where it ends, so the user part runs to the URL's one ``@`` wherever it is, unless
    that ``@`` sits in an option's value (:func:`_user_part_end`). What cannot be read as a URL at
    all (an ``@`` written twice among them) is shown as ``<unparsable URL: why>``; text with no
    secret in any reading is left exactly as written."""
    text = url.strip()
    scheme = _SCHEME.match(text)
    if scheme is None:
        if "=" in text and "@" not in text.split("=", 1)[0]:  # a keyword connection string
            return _KEYWORD.sub(_hide_keyword, url)
        if "@" in text:  # ``postgresql//user:PW@host``: which part is the password cannot be told
            return "<unparsable URL: it has no scheme (write scheme://…)>"
        return url
    rest = text[scheme.end() :]
    if not rest.startswith("//") and (inner := _SCHEME.match(rest)) and rest[inner.end() :].startswith("//"):
        return text[: scheme.end()] + redact(rest)  # one URL wrapping another: ``sealed:amqp://…``
    if not rest.startswith("//"):
        if "@" in rest:  # ``postgresql:/user:PW@host``: a slash short
            return f"<unparsable URL: write {scheme.group(1)}://… (two slashes after the scheme)>"
        return url
    body = rest[2:]
    try:
        at = _user_part_end(body)
    except ValueError as error:
        return f"<unparsable URL: {error}>"
    user = ""
    if at is not None:
        name, colon, _password = body[:at].partition(":")
        if colon:
            user = f"{name}:{HIDDEN}@"
        elif scheme.group(1).lower() in TOKEN_SCHEMES:
            user = f"{HIDDEN}@"
        else:
            user = f"{name}@"
        body = body[at + 1 :]
    try:
        parts = urlsplit(f"{scheme.group(1)}://{body}")
        for host in parts.netloc.split(","):  # several hosts: ``h1:5432,h2:5433``
            urlsplit(f"//{host}").port  # noqa: B018  # raises on a port that is not a number
    except ValueError as error:
        return f"<unparsable URL: {error}>"
    shown = f"{scheme.group(1)}://{user}{parts.netloc}{parts.path}"
    if parts.query or text.endswith("?"):
        shown += "?" + "&".join(_hide_option(option) for option in parts.query.split("&"))
    if parts.fragment or text.endswith("#"):
        shown += f"#{HIDDEN}"  # no URL duetime reads has one: a fragment here is a password's end
    return shown if shown != text else url


def _user_part_end(body: str) -> int | None:
    """Where the user part of ``body`` (a URL after its ``//``) ends, or None when it has none.

    Its one ``@`` ends it, wherever it is, unless that ``@`` sits in an option's value
    (``?prefix=a:b@c``: a user name holds none of ``/?#=&``, and a host none of ``=&``). Raises
    ValueError for an ``@`` written more than once: drivers disagree on which one ends the user
    part, so no reading can be shown safely. A body that starts with ``/`` has no host."""
    if body.startswith("/") or "@" not in body:
        return None
    if body.count("@") > 1:
        raise ValueError("it holds '@' more than once (write an '@' in a password as %40)")
    at = body.index("@")
    name = body[:at].partition(":")[0]
    host = re.split(r"[/?#]", body[at + 1 :], maxsplit=1)[0]
    if not host or any(c in name for c in "/?#=&") or any(c in host for c in "=&"):
        return None
    return at


def _hide_option(option: str) -> str:
    name, equals, _value = option.partition("=")
    return f"{name}={HIDDEN}" if equals and is_secret(name) else option


def _hide_keyword(match: re.Match[str]) -> str:
    name, equals, _value = match.groups()
    return f"{name}{equals}{HIDDEN}" if is_secret(name) else match.group(0)


#: Pieces of a secret shorter than this are not looked for in other text (they would match words).
SHORTEST_PIECE = 4
_SEPARATORS = re.compile(r"[#/?@:=&]")
#: The secrets :func:`scrub` replaces, longest first (a piece inside a longer one goes after it).
_remembered: tuple[str, ...] = ()


def secrets_in(url: str) -> set[str]:
    """Every text that some reading of ``url`` takes for a secret, with the pieces a driver may
    quote of it in an error (a password holding ``?`` split there: libpq's "invalid URI query
    parameter: "cret@host…""), and their percent-decoded forms."""
    found: set[str] = set()
    text = url.strip()
    if "//" in text and "@" in text:  # the widest reading: all between // and the last @
        userinfo = text.split("//", 1)[1].rsplit("@", 1)[0]
        name, colon, password = userinfo.partition(":")
        token = text.split(":", 1)[0].lower() in TOKEN_SCHEMES
        found.add(password if colon else name if token else "")
    if _SCHEME.match(text) is None:  # a keyword connection string
        found |= {value.strip("'") for name, _, value in _KEYWORD.findall(text) if is_secret(name)}
    elif "?" in text:
        for option in text.split("?", 1)[1].split("&"):
            name, equals, value = option.partition("=")
            if equals and is_secret(name):
                found |= {value, value.split("#")[0]}
    pieces = {piece for secret in found for piece in _SEPARATORS.split(secret)}
    every = found | pieces
    every |= {unquote(secret) for secret in every}
    return {secret for secret in every if len(secret) >= SHORTEST_PIECE}


def _keep(secrets: set[str]) -> None:
    global _remembered
    if not secrets <= set(_remembered):
        _remembered = tuple(sorted(set(_remembered) | secrets, key=len, reverse=True))


def remember(url: object) -> None:
    """Keep ``url``'s secrets for :func:`scrub`: called where duetime takes a URL in (the
    command line, the environment, opening a store or a transport). Not text: nothing to keep."""
    if isinstance(url, str):
        _keep(secrets_in(url))


def remember_secret(secret: str) -> None:
    """Keep ``secret`` itself (a password given on its own) for :func:`scrub`."""
    if len(secret) >= SHORTEST_PIECE:
        _keep({secret})


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***``: the last net under
    :func:`redact`, for what a driver says about a URL in its own words (an error quoting part of
    it), on every way out (the command line's output, the logs)."""
    for secret in _remembered:
        if secret in text:
            text = text.replace(secret, HIDDEN)
    return text


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


def options_of(url: str) -> dict[str, str]:
    """A URL's options by name, decoded (a name given twice keeps its last value; an empty value
    is kept): the one reader of a URL's query. A test looks for other callers of the parser."""
    return dict(option_pairs(url))


def option_pairs(url: str) -> list[tuple[str, str]]:
    """A URL's options in their order, decoded, a repeated name as often as given."""
    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def url_options(url: str, known: Collection[str], what: str) -> tuple[str, dict[str, str]]:
    """The URL without its query, and its options by name. A name not in ``known`` is refused."""
    options = options_of(url)
    refuse_unknown(options, known, what, url)
    return before_query(url), options


def split_options(url: str, ours: Collection[str]) -> tuple[str, dict[str, str]]:
    """duetime's own options of a URL that also carries its driver's: the URL with only the
    driver's (in their order, encoded again), and ours by name."""
    pairs = option_pairs(url)
    rest = [(k, v) for k, v in pairs if k not in ours]
    query = f"?{urlencode(rest)}" if rest else ""
    return before_query(url) + query, {k: v for k, v in pairs if k in ours}


def before_query(url: str) -> str:
    """The URL before its query; not urlunsplit, which drops an empty host (``sqlite:////abs``
    becomes ``sqlite://abs``, ``postgresql:///db`` loses the local socket)."""
    return url.split("?", 1)[0]


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
