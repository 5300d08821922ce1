"""URL scheme -> backend class, imported only when used, with "did you mean" on typos."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Generator
from datetime import timedelta
from typing import Any, cast
from urllib.parse import urlsplit

from duetime.audit import Actor
from duetime.bulk_interfaces import KeyedBulkRows, NativeDelayTopology, SqlDatabase
from duetime.client import DelayedMessageClient, SyncDelayedMessageClient
from duetime.errors import ConfigurationError, MissingExtra, UnknownScheme, command
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact, remember
from duetime.interfaces import DelayedMessageStore, SyncDelayedMessageStore, Transport
from duetime.settings import DEFAULT_ENDPOINT, STORE_VARIABLE, TransactionMode, variable

#: scheme -> (async store, sync store)
STORES: dict[str, tuple[str, str]] = {
    "sqlite": ("duetime.backends.sqlite.store:SqliteStore", "duetime.backends.sqlite.store:SyncSqliteStore"),
    "memory": ("duetime.backends.memory.store:MemoryStore", "duetime.backends.memory.store:SyncMemoryStore"),
    "postgresql": (
        "duetime.backends.postgres.store:PostgresStore",
        "duetime.backends.postgres.store:SyncPostgresStore",
    ),
    "postgres": (
        "duetime.backends.postgres.store:PostgresStore",
        "duetime.backends.postgres.store:SyncPostgresStore",
    ),
    "mysql": ("duetime.backends.mysql.store:MysqlStore", "duetime.backends.mysql.store:SyncMysqlStore"),
    "mariadb": ("duetime.backends.mysql.store:MysqlStore", "duetime.backends.mysql.store:SyncMysqlStore"),
    "redis": ("duetime.backends.redis.store:RedisStore", "duetime.backends.redis.store:SyncRedisStore"),
    "redis+sentinel": (
        "duetime.backends.redis.store:RedisStore",
        "duetime.backends.redis.store:SyncRedisStore",
    ),
}
TRANSPORTS: dict[str, str] = {
    "sqlite": "duetime.backends.sqlite.queue:SqliteQueueTransport",
    "memory": "duetime.backends.memory.transport:MemoryTransport",
    "postgresql": "duetime.backends.postgres.queue:PostgresQueueTransport",
    "postgres": "duetime.backends.postgres.queue:PostgresQueueTransport",
    "amqp": "duetime.backends.rabbitmq.transport:RabbitMqTransport",
    "amqps": "duetime.backends.rabbitmq.transport:RabbitMqTransport",
    "redis": "duetime.backends.redis.transport:RedisTransport",
    "redis+sentinel": "duetime.backends.redis.transport:RedisTransport",
    "nats": "duetime.backends.nats.transport:NatsTransport",
    "webhooks": "duetime.backends.webhooks.transport:WebhookTransport",
    "mqtt": "duetime.backends.mqtt.transport:MqttTransport",
    "mqtts": "duetime.backends.mqtt.transport:MqttTransport",
    "celery+amqp": "duetime.backends.celery.transport:CeleryTransport",
    "celery+amqps": "duetime.backends.celery.transport:CeleryTransport",
    "celery+redis": "duetime.backends.celery.transport:CeleryTransport",
    "celery+rediss": "duetime.backends.celery.transport:CeleryTransport",
    "dramatiq+amqp": "duetime.backends.dramatiq.transport:DramatiqTransport",
    "dramatiq+amqps": "duetime.backends.dramatiq.transport:DramatiqTransport",
    "dramatiq+redis": "duetime.backends.dramatiq.transport:DramatiqTransport",
    "dramatiq+rediss": "duetime.backends.dramatiq.transport:DramatiqTransport",
}

#: scheme -> the SQL database bulk jobs and the delivery log read and write through
SQL_DATABASES: dict[str, str] = {
    "postgresql": "duetime.backends.postgres.sql_database:PostgresDatabase",
    "postgres": "duetime.backends.postgres.sql_database:PostgresDatabase",
    "mysql": "duetime.backends.mysql.sql_database:MariaDbDatabase",
    "mariadb": "duetime.backends.mysql.sql_database:MariaDbDatabase",
    "sqlite": "duetime.backends.sqlite.sql_database:SqliteDatabase",
}
#: scheme -> the bulk writer of a store of keys (its ledger beside the store's keys)
KEYED_BULK_ROWS: dict[str, str] = {
    "redis": "duetime.backends.redis.bulk_rows:RedisBulkRows",
    "redis+sentinel": "duetime.backends.redis.bulk_rows:RedisBulkRows",
}


def scheme_of(url: str) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"{redact(url)!r} is not a backend URL; write scheme://..., e.g. sqlite:///duetime.db."
            if isinstance(url, str)
            else f"{url!r} is not a backend URL; write scheme://..., e.g. sqlite:///duetime.db."
        )
    try:
        return urlsplit(url).scheme.lower()
    except ValueError as error:  # an IPv6 address not closed: ``postgresql://u@[::1/db``
        raise ConfigurationError(
            f"cannot read the {url.split('://', 1)[0][:20]}:// URL: {error} (an IPv6 address is written in "
            "brackets, as [::1]:5432); check it."
        ) from None


def _load(target: str, what: str) -> type[Any]:
    """The class ``module:attr`` names; ``what`` names it to a user whose extra is missing."""
    module_name, _, attr = target.partition(":")
    try:
        # Each package before its module: importing ``a.b.c`` by name locks ``c`` and then
        # imports ``a.b``, while a thread importing ``a.b`` holds its lock and wants ``c`` (its
        # ``__init__`` imports it): importlib's deadlock error, every time one thread opened a
        # SQLite store while another opened its queue. Taken in this order, no two threads
        # wait on each other.
        parts = module_name.split(".")
        for depth in range(1, len(parts)):
            importlib.import_module(".".join(parts[:depth]))
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = MissingExtra.for_module(error, what)
        if missing is None:
            raise
        raise missing from error
    return cast(type[Any], getattr(module, attr))


def _pick(kind: str, url: str, table: dict[str, Any]) -> Any:
    remember(url)  # whatever a driver later says of it, its secrets are scrubbed from logs
    scheme = scheme_of(url)
    if scheme not in table:
        close = difflib.get_close_matches(scheme, table, n=1)
        hint = f" Did you mean {close[0]}://?" if close else ""
        raise UnknownScheme(f"No {kind} for URL scheme {scheme!r}.{hint} Known: {', '.join(sorted(table))}.")
    return table[scheme]


def _scheme(url: str) -> str:
    return url.partition(":")[0].lower()


def is_sql_database(url: str) -> bool:
    """``url`` names a SQL database bulk jobs read and write (no driver import, no connection)."""
    return _scheme(url) in SQL_DATABASES


def is_keyed_store(url: str) -> bool:
    """``url`` names a store of keys bulk jobs write through :func:`open_keyed_bulk_rows`."""
    return _scheme(url) in KEYED_BULK_ROWS


def open_sql_database(url: str) -> SqlDatabase:
    """The SQL database ``url`` names, as bulk jobs and the delivery log use it (its bulk options
    ``layout``, ``table`` and ``schema`` read); one line for any other URL, never a guess."""
    if not is_sql_database(url):
        raise ConfigurationError(
            f"{redact(url)} is not a database URL bulk jobs can read; use postgresql://, "
            "mysql:// or sqlite:///, or a parquet:/ or jsonl:/ path."
        )
    remember(url)
    cls = _load(SQL_DATABASES[_scheme(url)], f"A {_scheme(url)}:// database")
    return cast(SqlDatabase, cls.from_url(url))


def open_keyed_bulk_rows(url: str) -> KeyedBulkRows:
    """The bulk writer of the store of keys ``url`` names (checked now; it connects when used)."""
    cls = _load(_pick("bulk writer", url, KEYED_BULK_ROWS), f"A {_scheme(url)}:// store")
    return cast(KeyedBulkRows, cls.from_url(url))


async def open_native_delays(amqp_url: str, names: str, *, levels: int) -> NativeDelayTopology:
    """RabbitMQ's native delay topology on the broker at ``amqp_url``, its connection started."""
    transport = open_transport(amqp_url)
    cls = _load("duetime.backends.rabbitmq.native:NativeDelays", "RabbitMQ's native delays")
    native = cls(transport, names, levels=levels)
    await transport.start()
    return cast(NativeDelayTopology, native)


#: The embedded default: a SQLite file in the working directory, no server.
DEFAULT_STORE_URL = "sqlite:///duetime.db"


def store_url(url: str | None) -> str:
    """``url``, else ``DUETIME_STORE`` from the environment (as the command line reads it), else
    the embedded default."""
    return url or variable(STORE_VARIABLE) or DEFAULT_STORE_URL


def check_store_url(url: str) -> str:
    """``url`` if it names a kind of store duetime has; else the one-line error :func:`open_store`
    would give. No connection and no driver import: for what opens its store later (the bridges,
    once per worker process)."""
    _pick("store", url, STORES)
    return url


def open_store(url: str, *, claim_timeout: timedelta | None = None) -> DelayedMessageStore:
    """The async store for ``url`` (e.g. ``sqlite:///duetime.db``), not yet initialized.

    ``claim_timeout`` (the settings' ``claim_timeout``) is the lease a claim holds unless the URL
    gives its own ``?claim_timeout=``.
    """
    cls = _load(_pick("store", url, STORES)[0], f"A {scheme_of(url)}:// store")
    return cast(DelayedMessageStore, cls.from_url(url, claim_timeout=claim_timeout))


def open_sync_store(url: str, *, claim_timeout: timedelta | None = None) -> SyncDelayedMessageStore:
    """The blocking twin of :func:`open_store`."""
    cls = _load(_pick("store", url, STORES)[1], f"A {scheme_of(url)}:// store")
    return cast(SyncDelayedMessageStore, cls.from_url(url, claim_timeout=claim_timeout))


def has_default_transport(store_url: str) -> bool:
    """Whether :func:`default_transport` has an answer for this store (its own queue tables)."""
    return scheme_of(store_url) in ("sqlite", "postgresql", "postgres")


def default_transport(store_url: str) -> str:
    """Where a store delivers when no transport is given: the queue tables in its own database,
    which lets the dispatcher move messages exactly-once. Only SQLite and PostgreSQL have them."""
    if not has_default_transport(store_url):
        raise ConfigurationError(
            "Give --transport (or DUETIME_TRANSPORT): only SQLite and PostgreSQL stores have a default."
        )
    return store_url.split("?")[0] if scheme_of(store_url) == "sqlite" else store_url


def check_store_exists(store_url: str) -> str:
    """A command that reads or changes a store must not create one as a side effect (a typo in a
    SQLite path would leave an empty file behind): only ``setup`` and ``run`` create. Servers
    answer for themselves; a SQLite file is checked here."""
    if scheme_of(store_url) == "sqlite":
        # loaded by name, as every backend here is: what imports the registry imports no backend
        parse_sqlite_url: Any = _load("duetime.backends.sqlite.connection:parse_sqlite_url", "SQLite")
        path, _ = parse_sqlite_url(store_url)
        if not path.exists():
            raise ConfigurationError(
                f"There is no SQLite store at {path} (the file does not exist): create it with "
                f"`{command('duetime', 'setup', '--store', store_url)}`, or check the path."
            )
    return store_url


async def open_ready_store(store_url: str, endpoint: str) -> DelayedMessageStore:
    """The async store at ``store_url``, initialized for ``endpoint``: one that was set up already
    (a SQLite file that is not there is refused, never created); closed again when it is not ready."""
    store = open_store(check_store_exists(store_url))
    try:
        await store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    except BaseException:
        await store.close()
        raise
    return store


def open_transport(url: str) -> Transport:
    """The transport for ``url`` (e.g. ``sqlite:///duetime.db`` for the local queue)."""
    transport = _load(_pick("transport", url, TRANSPORTS), f"A {scheme_of(url)}:// transport")
    return cast(Transport, transport.from_url(url))


class _Connecting:
    """What :func:`connect` returns: ``await`` it for a client, or ``async with`` it to have the
    client closed at the end."""

    def __init__(self, url: str | None, endpoint: str, setup: bool, actor: Actor | None = None) -> None:
        self._args = (url, endpoint, setup)
        self._actor = actor
        self._client: DelayedMessageClient | None = None

    def __await__(self) -> Generator[Any, None, DelayedMessageClient]:
        return self._open().__await__()

    async def _open(self) -> DelayedMessageClient:
        url, endpoint, setup = self._args
        client = DelayedMessageClient(open_store(store_url(url)), endpoint=endpoint, actor=self._actor)
        try:
            if setup:
                await client.store.setup_infrastructure(client.endpoint)
            return await client.open()
        except BaseException:
            await client.close()
            raise

    async def __aenter__(self) -> DelayedMessageClient:
        self._client = await self._open()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()

    def __getattr__(self, name: str) -> Any:
        """Used as the client itself (``duetime.connect(url).schedule(...)``): say how to get one,
        rather than Python's "'_Connecting' object has no attribute". Still an AttributeError, so
        ``hasattr`` and ``getattr(..., default)`` (tools, notebooks) answer as they expect."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise _NotAClient(
            f"duetime.connect() gives something to await, not the client: write `client = await "
            f"duetime.connect(url)` or `async with duetime.connect(url) as client:`, then client.{name}(...)."
        )


class _NotAClient(ConfigurationError, AttributeError):
    """A one-line duetime error that is also the AttributeError Python expects there."""


def connect(
    url: str | None = None,
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    setup: bool = True,
    actor: Actor | None = None,
) -> _Connecting:
    """A ready async client for the store at ``url`` (default: ``DUETIME_STORE``, else the embedded
    SQLite file ``duetime.db``), in one step: the store is opened, set up if needed (idempotent; ``setup=False``
    to require an existing one) and initialized for ``endpoint``::

        async with duetime.connect("sqlite:///duetime.db", endpoint="shop") as client:
            await client.schedule("orders", b"hello", delay="10m")

    or ``client = await duetime.connect(...)`` and ``await client.close()`` when done. With an
    ``actor``, the client's changes are kept in the store's audit trail as that actor's.
    """
    return _Connecting(url, check_name("endpoint", endpoint), setup, actor)


def connect_sync(
    url: str | None = None,
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    setup: bool = True,
    actor: Actor | None = None,
) -> SyncDelayedMessageClient:
    """:func:`connect` for blocking code: ``with duetime.connect_sync(url, endpoint="shop") as client:``."""
    store = open_sync_store(store_url(url))
    try:
        if setup:
            store.setup_infrastructure(check_name("endpoint", endpoint))
        return SyncDelayedMessageClient(store, endpoint=endpoint, actor=actor)
    except BaseException:
        store.close()
        raise
