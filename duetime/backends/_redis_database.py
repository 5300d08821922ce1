"""The Redis database a URL names (``redis://host:6379/N``), checked before connecting, and a
server's refusal of it said in one line: otherwise redis-py reads ``/orders`` as database 0
(the messages would go where nobody looks), and a number the server does not have reaches the
user as an unexplained ``ResponseError`` on the first command. Shared by the Redis backend and
the Celery and Dramatiq ones on a Redis broker.

A Redis watched by Sentinel is named by its sentinels and the name they know it by:
``redis+sentinel://:PASSWORD@s1:26379,s2:26379,s3:26379/mymaster/0``. Its clients ask the sentinels
where the master is on every new connection, so after a failover they reach the new master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact

SENTINEL_SCHEME = "redis+sentinel"


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels, the master's name, its database
    and the master's password (the sentinels' own password, if any, is ``sentinel_password``)."""

    sentinels: list[tuple[str, int]]
    service: str
    database: int
    password: str | None
    username: str | None

    @classmethod
    def of(cls, url: str) -> SentinelTarget:
        parts = urlsplit(url)
        users, _, hosts = parts.netloc.rpartition("@")
        sentinels = []
        for host in hosts.split(","):
            name, _, port = host.rpartition(":") if ":" in host else (host, "", "26379")
            if not name or not port.isdigit():
                raise ConfigurationError(f"{redact(url)}: {host!r} is not a sentinel's HOST:PORT.")
            sentinels.append((name, int(port)))
        path = [piece for piece in parts.path.split("/") if piece]
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ConfigurationError(
                f"{redact(url)} names no master: write redis+sentinel://HOST:26379,HOST:26379/MASTER_NAME/DB "
                "(the name the sentinels watch it by, e.g. mymaster, and a database number)."
            )
        user, _, password = users.partition(":")
        return cls(
            sentinels,
            unquote(path[0]),
            int(path[1]) if len(path) == 2 else 0,
            unquote(password) if password else None,
            unquote(user) if user else None,
        )


def redis_client(url: str, **options: Any) -> Any:
    """A blocking redis-py client for ``url``: ``redis://``, ``rediss://``, ``unix://``, or a
    master found through Sentinel."""
    import redis
    from redis.sentinel import Sentinel

    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return redis.Redis.from_url(url, **options)
    target = SentinelTarget.of(url)
    sentinel = Sentinel(target.sentinels, socket_timeout=5, **_sentinel_options(options))  # type: ignore[no-untyped-call]
    return sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, db=target.database, password=target.password, username=target.username, **options
    )


def async_redis_client(url: str, **options: Any) -> Any:
    """:func:`redis_client` for asyncio (``redis.asyncio``)."""
    import redis.asyncio as aioredis
    from redis.asyncio.sentinel import Sentinel

    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return aioredis.Redis.from_url(url, **options)
    target = SentinelTarget.of(url)
    sentinel = Sentinel(target.sentinels, socket_timeout=5, **_sentinel_options(options))  # type: ignore[no-untyped-call]
    return sentinel.master_for(
        target.service, db=target.database, password=target.password, username=target.username, **options
    )


def close_redis(client: Any) -> None:
    """Close a client of :func:`redis_client` with all it opened: a master found through Sentinel
    shares a connection pool its close leaves open, and the sentinels have clients of their own."""
    client.close()
    pool = client.connection_pool
    pool.disconnect()
    for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
        sentinel.close()


async def aclose_redis(client: Any) -> None:
    """:func:`close_redis` for a client of :func:`async_redis_client`."""
    await client.aclose()
    pool = client.connection_pool
    await pool.disconnect()
    for sentinel in getattr(getattr(pool, "sentinel_manager", None), "sentinels", ()):
        await sentinel.aclose()


def _sentinel_options(options: dict[str, Any]) -> dict[str, Any]:
    """The connection options the sentinels' own connections take too (keepalives)."""
    return {k: v for k, v in options.items() if k.startswith("socket_")}


def check_database(url: str) -> str:
    """``url`` unchanged when its path is empty or a database number; else a one-line error. A
    ``unix://`` URL's path is the socket's (its database is a ``db=`` option)."""
    parts = urlsplit(url)
    if parts.scheme == SENTINEL_SCHEME:
        SentinelTarget.of(url)  # the sentinels, the master's name and its database
    elif parts.scheme in ("redis", "rediss"):
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
    where = urlsplit(url).netloc.rpartition("@")[2]  # host:port, or a Sentinel URL's several
    return ConfigurationError(
        f"cannot connect to {redact(url)}: the server at {where} does not answer as Redis does; check "
        "the host and port."
    )


@dataclass(frozen=True)
class Replication:
    """``wait=N`` (and ``wait_timeout`` in ms) in a Redis URL: every write that a caller is told
    succeeded first waits until ``N`` replicas have it (Redis's ``WAIT``, on the connection that
    wrote). A replica is otherwise asynchronous: a master that dies takes with it what it had not
    yet passed on, though it was acknowledged."""

    replicas: int = 0
    timeout_ms: int = 1000

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Replication:
        from duetime.inputs.urls import number_option

        replicas = int(number_option(options, "wait", 0, whole=True, minimum=-1))
        timeout = int(number_option(options, "wait_timeout", 1000, whole=True))
        return cls(replicas, timeout)

    def short(self, confirmed: Any) -> str | None:
        """Why a write ``WAIT`` answered ``confirmed`` for is not safe; None when it is."""
        if not self.replicas or int(confirmed) >= self.replicas:
            return None
        return (
            f"only {int(confirmed)} of the {self.replicas} replica(s) asked for (wait={self.replicas}) had the "
            f"write within {self.timeout_ms} ms; it is on the master and may be lost if it fails now"
        )


#: Writes wait for no replica (Redis's own default).
NO_WAIT = Replication()
