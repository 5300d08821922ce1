"""Who may use the dashboard, proof that a change came from its own pages, and what a browser is
told about the pages.

- **Login**: HTTP basic auth (the browser asks) with the user and password from
  ``DUETIME_DASHBOARD_USER`` (default ``duetime``) and ``DUETIME_DASHBOARD_PASSWORD``, or
  ``Authorization: Bearer <password>`` for scripts and reverse proxies. With a password set every
  page asks for it (messages can hold personal data); without one the dashboard shows but never
  changes anything, and hides message bodies and headers unless told to show them.
- **Throttled**: wrong credentials are limited per client address and overall (a guesser gets
  ``429`` and waits), each failure is logged and counted (``/metrics``). A browser that has
  logged in before keeps a signed cookie of its own (``duetime_known``): its requests have a
  limit of their own instead, so guessers, however many addresses they come from, never lock
  the real user out. The client address is the connection's: ``X-Forwarded-For`` is read only
  from the proxies ``duetime dashboard --forwarded-allow-ips`` names.
- **CSRF**: a browser sends basic-auth credentials with any request to the site, and a reverse
  proxy adds its bearer token to every request, a forged form from another site included. So
  every change must also carry a token only the dashboard's own pages know (an HMAC of a random
  cookie, checked whatever else the request carries), and the browser's own word on where the
  request comes from (``Sec-Fetch-Site``, ``Origin``) must not name another site.
- **What the browser may do**: a Content-Security-Policy without inline script or style (no data
  from a message can ever run as code), no framing, no sniffing, no referrer, and a bounded body.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import sha256
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duetime.settings import (
    DASHBOARD_PASSWORD_VARIABLE,
    DASHBOARD_SECRET_VARIABLE,
    DASHBOARD_USER_VARIABLE,
    variable,
)

log = logging.getLogger("duetime.dashboard")

#: Paths anyone may reach: what a load balancer or a reverse proxy probes.
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
#: The largest request body accepted: a form of the error queue's page with every id selected is
#: a few KB; anything near this is not a form of ours.
MAX_BODY = 256 * 1024
#: The cookie whose HMAC is the pages' CSRF token, and the form field that carries the token.
CSRF_COOKIE, CSRF_FIELD = "duetime_csrf", "csrftoken"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Sent with every answer. No inline script or style anywhere: a message's text can never run.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser sends `Origin: null` on our own forms
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials | None:
        password = variable(DASHBOARD_PASSWORD_VARIABLE, env)
        return cls(variable(DASHBOARD_USER_VARIABLE, env) or "duetime", password) if password else None

    def accept(self, authorization: str) -> bool:
        """Whether an ``Authorization`` header value carries these credentials."""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), self.password.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and (
            hmac.compare_digest(user.encode(), self.user.encode())
            & hmac.compare_digest(password.encode(), self.password.encode())
        )


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


#: Wrong credentials allowed in a window, from one client address and from all together; past
#: either limit a request is refused (429) unchecked until the window has room again.
PER_CLIENT_FAILURES, OVERALL_FAILURES, FAILURE_WINDOW = 10, 100, 60.0
#: Client addresses remembered at most (the oldest forgotten first): bounded memory under a flood.
CLIENTS_REMEMBERED = 10_000
#: The cookie a browser gets once it logged in: its requests are throttled apart from the rest.
KNOWN_COOKIE = "duetime_known"
#: How long that cookie lasts (seconds): a month.
KNOWN_FOR = 30 * 86_400


def known_cookie(key: bytes) -> str:
    """A new ``duetime_known`` value: a random id and its HMAC (only the dashboard can make one)."""
    ident = os.urandom(12).hex()
    return f"{ident}.{hmac.new(key, ident.encode(), sha256).hexdigest()[:32]}"


def known_device(key: bytes, cookie_header: str) -> str | None:
    """The id of a ``duetime_known`` cookie this dashboard made, or None."""
    value = _cookie(cookie_header, KNOWN_COOKIE, 57, "0123456789abcdef.")
    ident, _, mac = value.partition(".")
    if not ident or not mac:
        return None
    expected = hmac.new(key, ident.encode(), sha256).hexdigest()[:32]
    return ident if hmac.compare_digest(mac.encode(), expected.encode()) else None


class LoginThrottle:
    """Failed logins in the last :data:`FAILURE_WINDOW` seconds, per client and overall, and
    the totals ``/metrics`` shows. A guesser at 2,000 passwords a second gets ten a minute."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.clients: OrderedDict[str, deque[float]] = OrderedDict()
        self.everyone: deque[float] = deque()
        self.failures_total = 0
        self.refused_total = 0

    def _recent(self, times: deque[float], now: float) -> int:
        while times and times[0] <= now - FAILURE_WINDOW:
            times.popleft()
        return len(times)

    def wait(self, client: str, device: str | None = None) -> float:
        """Seconds ``client`` must wait before its credentials are checked again (0: now). A
        ``device`` (a browser that logged in before) is held to its own failures only."""
        now = self.clock()
        key = client if device is None else f"known:{device}"
        mine = self.clients.get(key)
        waits = []
        if mine is not None and self._recent(mine, now) >= PER_CLIENT_FAILURES:
            waits.append(mine[0] + FAILURE_WINDOW - now)
        if device is None and self._recent(self.everyone, now) >= OVERALL_FAILURES:
            waits.append(self.everyone[0] + FAILURE_WINDOW - now)
        return max(waits, default=0.0)

    def failed(self, client: str, device: str | None = None) -> int:
        """Count a failure of ``client`` (or of its known ``device``); how many it has had in
        the window."""
        now = self.clock()
        key = client if device is None else f"known:{device}"
        mine = self.clients.pop(key, None) or deque()
        mine.append(now)
        self.clients[key] = mine  # the most recent last
        while len(self.clients) > CLIENTS_REMEMBERED:
            self.clients.popitem(last=False)
        if device is None:
            self.everyone.append(now)
        self.failures_total += 1
        return self._recent(mine, now)

    def metrics(self) -> str:
        """The counts in Prometheus's text format."""
        return (
            "# HELP duetime_dashboard_login_failures_total Requests with wrong credentials.\n"
            "# TYPE duetime_dashboard_login_failures_total counter\n"
            f"duetime_dashboard_login_failures_total {self.failures_total}\n"
            "# HELP duetime_dashboard_logins_refused_total Requests refused unchecked: too many "
            "wrong credentials.\n"
            "# TYPE duetime_dashboard_logins_refused_total counter\n"
            f"duetime_dashboard_logins_refused_total {self.refused_total}\n"
        )


class RequireLogin:
    """ASGI middleware: every request but :data:`OPEN_PATHS` needs the credentials; wrong ones
    are throttled (:class:`LoginThrottle`) and logged."""

    def __init__(
        self,
        app: ASGIApp,
        credentials: Credentials,
        throttle: LoginThrottle | None = None,
        *,
        secret: str = "",
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.throttle = throttle or LoginThrottle()
        self.key = (secret or os.urandom(32).hex()).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        client = str((scope.get("client") or ("unknown",))[0])
        device = known_device(self.key, _header(scope, b"cookie"))
        wait = self.throttle.wait(client, device)
        if wait > 0:
            self.throttle.refused_total += 1
            refusal = PlainTextResponse(
                f"Too many wrong logins: try again in {math.ceil(wait)} s.\n",
                429,
                headers={"Retry-After": str(math.ceil(wait))},
            )
            await refusal(scope, receive, send)
            return
        authorization = _header(scope, b"authorization")
        if not self.credentials.accept(authorization):
            if authorization:  # a browser's first request carries none: no attempt yet
                count = self.throttle.failed(client, device)
                log.warning(
                    "dashboard: wrong credentials from %s%s (%d in the last %.0f s%s)",
                    client,
                    "" if device is None else " (a browser that logged in before)",
                    count,
                    FAILURE_WINDOW,
                    "; it now waits" if count >= PER_CLIENT_FAILURES else "",
                )
            refusal = PlainTextResponse(
                "Log in: this dashboard asks for the user and password set in "
                f"{DASHBOARD_USER_VARIABLE} and {DASHBOARD_PASSWORD_VARIABLE}.\n",
                401,
                headers={"WWW-Authenticate": 'Basic realm="duetime dashboard", charset="UTF-8"'},
            )
            await refusal(scope, receive, send)
            return
        if device is not None:
            await self.app(scope, receive, send)
            return

        async def knowing(message: Message) -> None:  # logged in: this browser is known from now on
            if message["type"] == "http.response.start":
                cookie = f"{KNOWN_COOKIE}={known_cookie(self.key)}; Path=/; Max-Age={KNOWN_FOR}; HttpOnly; SameSite=Strict"
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())],
                }
            await send(message)

        await self.app(scope, receive, knowing)


def secret(env: Mapping[str, str] | None = None) -> str:
    """What signs the CSRF token and the note cookie: ``DUETIME_DASHBOARD_SECRET`` (set it when
    several dashboard replicas sit behind one address), else a secret new to this process."""
    return variable(DASHBOARD_SECRET_VARIABLE, env) or os.urandom(32).hex()


class BodyTooLarge(Exception):
    """A request body over the limit, raised by the body it was read from."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"A request body is at most {limit // 1024} KB here.")


class Guard:
    """ASGI middleware, outermost: the browser headers on every answer, the body limit, the CSRF
    cookie, and the refusal of a change another site asks for.

    The token check itself needs the form, so the pages' change handlers make it
    (:func:`token_matches`); this middleware gives them the expected token as
    ``scope["csrftoken"]()`` and refuses, before any body is read, what the browser itself says
    comes from elsewhere.
    """

    def __init__(self, app: ASGIApp, secret: str, *, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.key = secret.encode()
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookie = _cookie(_header(scope, b"cookie"), CSRF_COOKIE)
        new_cookie = None
        if not cookie:
            cookie = new_cookie = os.urandom(18).hex()
        scope["csrftoken"] = lambda: token_for(self.key, cookie)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers") or [])
                present = {bytes(k).lower() for k, _ in headers}
                headers += [
                    (k.lower().encode(), v.encode())
                    for k, v in HEADERS.items()
                    if k.lower().encode() not in present
                ]
                if new_cookie:
                    headers.append(
                        (
                            b"set-cookie",
                            f"{CSRF_COOKIE}={new_cookie}; Path=/; HttpOnly; SameSite=Strict".encode(),
                        )
                    )
                message = {**message, "headers": headers}
            await send(message)

        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > self.max_body:
            await _refuse(413, str(BodyTooLarge(self.max_body)), scope, receive, send_with_headers)
            return
        if scope["method"] not in SAFE_METHODS:
            elsewhere = _from_elsewhere(scope)
            if elsewhere:
                await _refuse(403, f"Refused: {elsewhere}", scope, receive, send_with_headers)
                return
        read = 0

        async def bounded_receive() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        try:
            await self.app(scope, bounded_receive, send_with_headers)
        except BodyTooLarge as error:
            if not started:
                await _refuse(413, str(error), scope, receive, send_with_headers)


async def _refuse(status: int, text: str, scope: Scope, receive: Receive, send: Send) -> None:
    await PlainTextResponse(text + "\n", status)(scope, receive, send)


def _cookie(header: str, name: str, length: int = 36, alphabet: str = "0123456789abcdef") -> str:
    """The value of cookie ``name`` if it has the shape the dashboard gives it, else ''."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return ""
    morsel = jar.get(name)
    value = morsel.value if morsel else ""
    return value if len(value) == length and all(c in alphabet for c in value) else ""


def _from_elsewhere(scope: Scope) -> str:
    """Why a change request comes from another site by the browser's own word, or ''."""
    site = _header(scope, b"sec-fetch-site")
    if site and site not in ("same-origin", "none"):
        return f"this change was sent from another site (Sec-Fetch-Site: {site[:20]})."
    origin = _header(scope, b"origin")
    if origin:
        ours = {h for h in (_header(scope, b"host"), _header(scope, b"x-forwarded-host")) if h}
        theirs = urlsplit(origin).netloc if origin != "null" else "null"
        if theirs not in ours:
            return "this change was sent from a page of another site (its Origin is not this dashboard)."
    return ""


def token_for(key: bytes, cookie: str) -> str:
    return hmac.new(key, cookie.encode(), sha256).hexdigest()


def token_matches(scope: Scope, given: str) -> bool:
    """Whether a form's token is the one this browser's cookie was given (constant time)."""
    expected = scope["csrftoken"]() if "csrftoken" in scope else ""
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())
