"""Who may use the dashboard, and proof that a change came from its own pages.

- **Login**: HTTP basic auth (the browser asks) with the user and password from
  ``DUETIME_DASHBOARD_USER`` (default ``duetime``) and ``DUETIME_DASHBOARD_PASSWORD``, or
  ``Authorization: Bearer <password>`` for scripts. With a password set every page asks for it
  (messages can hold personal data); without one the dashboard shows but never changes anything.
- **CSRF**: a browser sends basic-auth credentials with any request to the site, a forged form
  on another site included; so every change must also carry a token only the dashboard's own
  pages know (asgi-csrf: a signed cookie and the same value in the form). The paths that change
  data are protected even when the request carries no cookie at all.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

try:
    from asgi_csrf import asgi_csrf  # type: ignore[import-untyped]
except ImportError as missing:  # pragma: no cover - depends on what is installed
    from duetime.errors import ConfigurationError

    raise ConfigurationError("The dashboard needs its extra: pip install 'duetime[dashboard]'.") from missing

USER_ENV, PASSWORD_ENV, SECRET_ENV = (
    "DUETIME_DASHBOARD_USER",
    "DUETIME_DASHBOARD_PASSWORD",
    "DUETIME_DASHBOARD_SECRET",
)
#: Paths anyone may reach: what a load balancer or a reverse proxy probes.
OPEN_PATHS = frozenset({"/healthz"})


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Credentials | None:
        password = env.get(PASSWORD_ENV, "")
        return cls(env.get(USER_ENV) or "duetime", password) if password else None

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


class RequireLogin:
    """ASGI middleware: every request but :data:`OPEN_PATHS` needs the credentials."""

    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = dict(scope.get("headers") or [])
            if not self.credentials.accept(headers.get(b"authorization", b"").decode("latin-1")):
                refusal = PlainTextResponse(
                    "Log in: this dashboard asks for the user and password set in "
                    f"{USER_ENV} and {PASSWORD_ENV}.\n",
                    401,
                    headers={"WWW-Authenticate": 'Basic realm="duetime dashboard", charset="UTF-8"'},
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def secret(env: Mapping[str, str] = os.environ) -> str:
    """What signs the CSRF token and the note cookie: ``DUETIME_DASHBOARD_SECRET`` (set it when
    several dashboard replicas sit behind one address), else a secret new to this process."""
    return env.get(SECRET_ENV) or os.urandom(32).hex()


def protect(app: ASGIApp, changing_paths: Collection[str], secret: str) -> ASGIApp:
    """``app`` behind CSRF protection for ``changing_paths``."""
    wrapped: ASGIApp = asgi_csrf(app, signing_secret=secret, always_protect=set(changing_paths))
    return wrapped
