"""The Redis database a URL names (``redis://host:6379/N``), checked before connecting, and a
server's refusal of it said in one line: otherwise redis-py reads ``/orders`` as database 0
(the messages would go where nobody looks), and a number the server does not have reaches the
user as an unexplained ``ResponseError`` on the first command. Shared by the Redis backend and
the Celery and Dramatiq ones on a Redis broker."""

from __future__ import annotations

from urllib.parse import urlsplit

from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact


def check_database(url: str) -> str:
    """``url`` unchanged when its path is empty or a database number; else a one-line error. A
    ``unix://`` URL's path is the socket's (its database is a ``db=`` option)."""
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        database = parts.path.strip("/")
        if database and not database.isdigit():
            raise ConfigurationError(
                f"The Redis URL {redact(url)} names database {database!r}; a Redis database is a "
                "number (0 unless you chose another), e.g. redis://127.0.0.1:6379/0."
            )
    return url


def no_such_database(url: str, error: BaseException) -> ConfigurationError | None:
    """The one-line error for a database number the server does not have; None for any other.
    Told by the server's own words, whichever client (redis-py, kombu) passed them on."""
    if "DB index is out of range" in str(error):
        return ConfigurationError(
            f"cannot connect to {redact(url)}: the server has no such database (it has 16, numbered "
            "0-15, unless its `databases` setting says otherwise); use a lower number in the URL."
        )
    return None


def not_redis(url: str, error: BaseException) -> ConfigurationError:
    """A server that answered in another protocol (redis-py's ``InvalidResponse``: another kind
    of server on that port), said in one line rather than as the bytes it sent."""
    parts = urlsplit(url)
    return ConfigurationError(
        f"cannot connect to {redact(url)}: the server at {parts.hostname}:{parts.port or 6379} does not "
        "answer as Redis does; check the host and port."
    )
