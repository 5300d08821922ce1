"""One exception tree for duetime.

Every class's docstring is its default message, so ``raise StoreNotReady()`` already tells the
user what went wrong and what to do about it. The tree (a test holds it to the classes)::

    DuetimeError
    ├── InvalidMessage                the message breaks a rule: fix the named field
    ├── InvalidSchedule               a recurring schedule that cannot be kept as given
    │   └── ScheduleExists
    ├── ScheduleNotFound
    ├── ConfigurationError            cannot work as configured: the message says the fix
    │   ├── InvalidSetting
    │   ├── ApiKeyExists
    │   ├── WebhookExists
    │   ├── UnknownScheme
    │   ├── MissingExtra              install the extra it names
    │   └── UnsupportedTransactionMode
    ├── StoreError                    the store did not do what was asked
    │   ├── StoreNotReady             run `duetime setup`
    │   ├── StorageFull               free space; nothing was stored
    │   ├── NotReplicated             send it again with the same id
    │   ├── DuplicateMessageId        a new id, or say what to do with the stored one
    │   ├── MessageNotFound
    │   └── MessageInFlight           being forwarded: look again in a moment
    ├── TransportError                the transport could not send
    │   ├── DestinationNotFound       to the error queue: declare the queue
    │   ├── MessageRefused            never carriable as it is: to the error queue
    │   ├── RetryLater                not taken this time (a 5xx, a 429): tried again later
    │   └── TransportUnavailable      an outage: the dispatcher waits and reconnects
    │       └── DestinationUnavailable
    │           └── RouteUnavailable  one route is down: its messages wait, the others go on
    ├── ConnectionFailed              a server cannot be reached: address, user, password
    ├── DeadlineExceeded              no answer in time (a partition, an overload)
    └── CriticalError                 the dispatcher stopped: its supervisor starts it again
"""

from __future__ import annotations

import shlex


class DuetimeError(Exception):
    """duetime failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__class__.__doc__ or "").strip())


class InvalidMessage(DuetimeError, ValueError):
    """The delayed message is invalid: check the named field."""


class InvalidSchedule(DuetimeError, ValueError):
    """A recurring schedule that cannot be kept as given (a cron expression that never fires, an
    unknown time zone, an interval of 0)."""


class ScheduleExists(InvalidSchedule):
    """A recurring schedule with that id is there already."""


class ScheduleNotFound(DuetimeError, LookupError):
    """No recurring schedule with that id in the endpoint."""


class ConfigurationError(DuetimeError, ValueError):
    """duetime is configured in a way that cannot work: read the message for the fix."""


class InvalidSetting(ConfigurationError):
    """A setting's value breaks its rule. ``setting`` is its name where it was given (a Python
    field, a command-line flag, an environment variable), so each front end can say it in its own
    words with :meth:`named`."""

    def __init__(self, setting: str, rule: str) -> None:
        self.setting, self.rule = setting, rule
        super().__init__(f"{setting} {rule}.")

    def named(self, name: str) -> InvalidSetting:
        """The same error, the setting called by the name the user gave it (``--batch-size``)."""
        return InvalidSetting(name, self.rule)


class ApiKeyExists(ConfigurationError):
    """An API key of that name is in use: revoke it first, or choose another name."""


class WebhookExists(ConfigurationError):
    """A webhook endpoint of that name is registered: remove it first, or choose another name."""


class UnknownScheme(ConfigurationError):
    """No backend is registered for that URL scheme."""


#: The top-level module of each optional library -> the extra of pyproject.toml that installs it.
#: Written once: the registry and the command line's last resort turn any missing one into
#: :meth:`MissingExtra.of`'s line (through :meth:`MissingExtra.for_module`), the line the dashboard,
#: metrics and bulk jobs give for theirs.
EXTRA_OF_MODULE: dict[str, str] = {
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "pymysql": "mysql",
    "aio_pika": "rabbitmq",
    "aiormq": "rabbitmq",
    "pamqp": "rabbitmq",
    "redis": "redis",
    "nats": "nats",
    "aiohttp": "webhooks",
    "paho": "mqtt",
    "anyio": "webhooks",
    "h11": "webhooks",
    "kombu": "celery",
    "celery": "celery",
    "dramatiq": "dramatiq",
    "pika": "dramatiq",
    "prometheus_client": "metrics",
    "opentelemetry": "otel",
    "fastapi": "api",
    "cryptography": "encryption",
    "pydantic": "api",
    "starlette": "dashboard",
    "uvicorn": "dashboard",
    "jinja2": "dashboard",
    "multipart": "dashboard",
    "python_multipart": "dashboard",
    "itsdangerous": "dashboard",
    "pyspark": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "numpy": "spark",
    "matplotlib": "spark",
}


def install_command(extra: str) -> str:
    """The pip line that adds ``extra`` to *this* installation.

    From a clone (``pip install -e .``) or a wheel file, ``pip install 'duetime[x]'`` would look
    for a package of that name on the package index, which is not what the user installed; so the
    line names the folder or file duetime was installed from, as pip recorded it."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlsplit

    try:
        recorded = importlib.metadata.distribution("duetime").read_text("direct_url.json")
        origin = json.loads(recorded) if recorded else {}
    except (importlib.metadata.PackageNotFoundError, ValueError):
        origin = {}
    url = origin.get("url", "") if isinstance(origin, dict) else ""
    if isinstance(url, str) and url.startswith("file://"):
        path = unquote(urlsplit(url).path)
        editable = bool((origin.get("dir_info") or {}).get("editable"))
        return f"pip install {'-e ' if editable else ''}'{path}[{extra}]'"
    return f"pip install 'duetime[{extra}]'"


class MissingExtra(ConfigurationError, ImportError):
    """A part of duetime needs a library that is not installed: install the extra named in the
    message. Every missing extra is reported this way, by :meth:`of`."""

    @classmethod
    def of(cls, what: str, extra: str, library: str | None = None, also: str = "") -> MissingExtra:
        """``{what} needs {library or the extra}: pip install 'duetime[{extra}]'{also}.``"""
        needs = f"the {library!r} library" if library else f"the {extra} extra"
        return cls(f"{what} needs {needs}: {install_command(extra)}{also}.")

    @classmethod
    def for_module(cls, missing: ModuleNotFoundError, what: str) -> MissingExtra | None:
        """The line for a module that failed to import, if an extra installs it (else None: then
        the module is not optional and its absence is a real fault)."""
        library = (missing.name or "").split(".")[0]
        extra = EXTRA_OF_MODULE.get(library)
        return cls.of(what, extra, library=library) if extra else None


class UnsupportedTransactionMode(ConfigurationError):
    """The store cannot honour this transaction mode with this transport."""


class StoreError(DuetimeError):
    """The store did not do what was asked: the message says why, and what to do."""


class StoreNotReady(StoreError):
    """The store has no schema yet: run `duetime setup` (or `setup_infrastructure()`) first."""


class DuplicateMessageId(StoreError):
    """A delayed message with this id is already stored; ids are never silently overwritten."""


class MessageNotFound(StoreError, LookupError):
    """No delayed message with that id is stored."""


class StorageFull(StoreError):
    """The disk or the server holding the store is full: free some space (or raise its memory
    limit); the call that says so stored nothing."""


class TransportError(DuetimeError):
    """The transport could not send the message."""


class DestinationNotFound(TransportError):
    """The destination does not exist; the message goes to the error queue instead."""


class MessageRefused(TransportError):
    """The transport can never carry this message as it is (too large for the server, or a
    header it would refuse or change): a failure of this message alone, never an outage. It
    goes to the error queue with the reason, without retries."""


class RetryLater(TransportError):
    """The destination answered, or failed to answer, in a way that means "not now" (an HTTP 5xx,
    408 or 429, a timeout, a refused or reset connection): the message waits ``after`` seconds in
    the store and is tried again, as its destination's retry schedule says. A failure of that one
    destination, never an outage of the transport: the others keep being delivered."""

    def __init__(self, message: str | None = None, *, after: float) -> None:
        super().__init__(message)
        self.after = after


class TransportUnavailable(TransportError):
    """The transport cannot be reached (connection lost, broker restarting, network partition).

    Nothing is wrong with the messages: the dispatcher leaves them in the store, counts one outage
    against the dispatch breaker, backs off and reconnects.
    """


class DestinationUnavailable(TransportUnavailable):
    """The transport answers, but a destination cannot take messages now (a RabbitMQ quorum queue
    electing a new leader after a node was lost, a queue full that refuses more): an outage of
    that destination like any other, and never a sign that the message broke the connection."""


class RouteUnavailable(DestinationUnavailable):
    """A route's transport cannot be reached while another route's can (``duetime run --route``):
    its messages wait in the store, held for ``retry_in`` seconds, until the route is tried again,
    and the other routes go on. No circuit breaker counts it: a restart would not mend one route,
    and would stop the others. ``tried``: this answer came from a try, not from the wait between
    two tries (an outage is counted once per try)."""

    def __init__(self, message: str, *, route: str, retry_in: float, tried: bool) -> None:
        super().__init__(message)
        self.route = route
        self.retry_in = retry_in
        self.tried = tried


class NotReplicated(StoreError):
    """The server took a write, but fewer replicas than asked for had it in time: it may be lost if
    that server fails now. Send it again with the same id (a duplicate id then means it is kept)."""


class ConnectionFailed(DuetimeError):
    """A server cannot be reached: check its address, port, user, password and that it is running."""


def connection_failed(display: str, error: BaseException | str) -> ConnectionFailed:
    """``cannot connect to URL: reason``, with the server's own words and never the password."""
    return ConnectionFailed(f"cannot connect to {display}: {server_reason(error)}")


#: What servers say when the address answers but will never let this user in: waiting will not
#: change it (PostgreSQL, MariaDB, Redis, RabbitMQ and NATS in their own words).
REFUSED_FOR_GOOD = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "access denied",
    "unknown database",
    "wrongpass",
    "invalid username-password",
    "noauth",
    "authorization violation",
    "access_refused",
)


def refused_for_good(error: BaseException) -> bool:
    """Whether ``error`` is a server refusing this user or database (a wrong password, a database
    that is not there): a start that meets it says so at once, where an outage is waited out."""
    if isinstance(error, ConfigurationError):
        return True
    text = str(error).lower()
    return any(words in text for words in REFUSED_FOR_GOOD)


def no_answer(where: str, seconds: float | None, kind: str) -> str:
    """The one wording, for every store and transport, of a server that took the connection (or
    never finished it) and then said nothing: a dead server behind a proxy, a partition, another
    kind of server on that port."""
    within = f" within {seconds:g} s" if seconds is not None else ""
    return f"no answer from {where}{within}; is it a {kind} server, and up?"


def server_reason(error: BaseException | str) -> str:
    """The useful part of a driver's connection error: PostgreSQL's "FATAL:  database "x" does
    not exist" becomes 'database "x" does not exist'; multi-line texts keep their first line."""
    text = str(error).strip()
    if "FATAL:" in text:
        text = text.split("FATAL:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__ if isinstance(error, BaseException) else "?"
    if "failed: " in first:
        first = first.rsplit("failed: ", 1)[1]
    return first.strip()


class DeadlineExceeded(DuetimeError, TimeoutError):
    """A store or transport call did not answer in time (a dead server behind a proxy, a network
    partition, or an overload)."""


class CriticalError(DuetimeError):
    """duetime hit a failure it cannot recover from by itself; the dispatcher has stopped."""


class MessageInFlight(StoreError):
    """The message is being forwarded right now and cannot be changed; look again in a moment."""


#: MariaDB/MySQL error numbers for a statement the user may not run: access to a database, a
#: command on a table, on a column, one that needs a global privilege, on a routine.
_MYSQL_NOT_PERMITTED = frozenset({1044, 1142, 1143, 1227, 1370})


def not_permitted(error: BaseException) -> ConfigurationError | None:
    """A database's refusal of a statement for want of a privilege (PostgreSQL's SQLSTATE 42501,
    MariaDB's access errors) as one line naming what was refused and what to grant; None for any
    other error. Read from the error's own fields, so no driver needs importing here."""
    code = error.args[0] if error.args and isinstance(error.args[0], int) else None
    if getattr(error, "sqlstate", None) == "42501":
        return ConfigurationError(
            f"PostgreSQL refused: {server_reason(error)}. The URL's user needs, on duetime's schema, "
            "USAGE (and CREATE for `duetime setup`) and SELECT, INSERT, UPDATE, DELETE on its tables: "
            "see 'Database privileges' on the PostgreSQL page of the docs."
        )
    if type(error).__module__.startswith("pymysql") and code in _MYSQL_NOT_PERMITTED:
        return ConfigurationError(
            f"MariaDB refused: {server_reason(error.args[1] if len(error.args) > 1 else error)}. The "
            "URL's user needs SELECT, INSERT, UPDATE, DELETE (and CREATE, INDEX for `duetime setup`) "
            "on duetime's database: see 'Database privileges' on the MariaDB page of the docs."
        )
    return None


def command(*words: str) -> str:
    """A command to suggest, as one would type it in a shell: each word quoted where it needs
    it, so a destination or path from someone else (``a b;$(x)``) is one argument, never code."""
    return shlex.join(words)


def one_line(error: BaseException) -> str:
    """An error as one log line: its type and the first line of its text."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
