"""What the PostgreSQL store and queue share: URL options, quoted names, queries, row decoding."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from duetime.backends._keepalive import LIBPQ
from duetime.backends._store import (
    DEFAULT_CLAIM_TIMEOUT,
    HOLD_TOKEN_SQL,
    claim_timeout_option,
    load_headers,
    table_name,
)
from duetime.backends.sqlfiles import load_queries
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError, connection_failed, no_answer, one_line
from duetime.inputs.identifiers import check_name, postgres_name, quote_identifier
from duetime.inputs.urls import number_option, option_pairs, options_of, redact
from duetime.message import DelayedMessage, dump_headers

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

QUERIES = load_queries("duetime.backends.postgres")
log = logging.getLogger("duetime.postgres")
__all__ = ["PgNames", "PgOptions", "copy_row", "decode", "dump_headers", "reach", "reach_async"]
OPTIONS = {
    "schema",
    "table",
    "claim_timeout",
    "pool_size",
    "pool_timeout",
    "claims",
    "pooler",
    "listen",
    "poll",
}
#: How at-least-once dispatchers claim: row locks held while a batch is sent, or a lease column.
CLAIM_KINDS = ("lock", "lease")
#: What sits between duetime and the server: nothing, a pooler in session mode (a client keeps its
#: server connection; only start-up options do not pass), or a pooler in transaction mode
#: (PgBouncer's ``pool_mode = transaction``, pgcat, RDS Proxy, Supavisor).
POOLERS = ("none", "session", "transaction")


@dataclass(frozen=True, slots=True)
class PgOptions:
    """A ``postgresql://`` URL split into psycopg's conninfo and duetime's own options."""

    conninfo: str = field(repr=False)  # it may hold the password
    schema: str = "public"
    table: str | None = None
    claim_timeout: timedelta = DEFAULT_CLAIM_TIMEOUT
    pool_size: int = 4
    #: How long a call waits for a pooled connection before failing (then the breakers count it).
    pool_timeout: float = 5.0
    #: "lock" (one write per message; needs pool_size >= 3) or "lease" (two writes, no open
    #: transaction during a send: the default behind a pooler in transaction mode). See
    #: duetime/backends/postgres/locked_claims.py.
    claims: str = "lock"
    #: "transaction" when a pooler hands the server connection to other clients between
    #: transactions: then nothing may outlive a transaction on it (see :attr:`session_free`).
    pooler: str = "none"
    #: Where LISTEN connects for wake-ups (a conninfo); None: nowhere, dispatchers and receivers
    #: look every :attr:`poll` seconds instead.
    listen_conninfo: str | None = field(default=None, repr=False)
    #: How often a process that cannot LISTEN looks for messages others stored.
    poll: float = 0.5
    display: str = ""

    @classmethod
    def from_url(cls, url: str, *, claim_timeout: timedelta | None = None) -> PgOptions:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(f"Not a PostgreSQL URL: {redact(url)}; write postgresql://user@host/db.")
        ours = {k: v for k, v in options_of(url).items() if k in OPTIONS}
        theirs = [(k, v) for k, v in option_pairs(url) if k not in OPTIONS]
        if not any(key == "connect_timeout" for key, _ in theirs):
            theirs.append(("connect_timeout", "5"))  # an unreachable server fails fast, not in minutes
        given = {key for key, _ in theirs}
        theirs += [(key, value) for key, value in LIBPQ.items() if key not in given]  # partitions end
        claim = claim_timeout_option(ours, claim_timeout)
        pooler = ours.get("pooler", "none")
        if pooler not in POOLERS:
            raise ConfigurationError(
                f"pooler={pooler!r} in {redact(url)} is not a pooling mode; use pooler=transaction when "
                "the URL names a pooler such as PgBouncer in transaction mode, or leave it out."
            )
        if pooler == "none":
            # a pooler passes no start-up options on (PgBouncer refuses or ignores them): behind
            # one, claims set the limit in their own transaction instead (locked_claims.py)
            theirs = _end_frozen_transactions(theirs, claim.total_seconds())
        # by hand, not urlunsplit: that drops the empty host of postgresql:///db (the local socket)
        conninfo = f"postgresql://{parts.netloc}{parts.path}?{urlencode(theirs, quote_via=quote)}"
        _check_conninfo(conninfo, url)
        listen = _listen_conninfo(ours.get("listen"), pooler, parts.netloc, parts.path, theirs, url)
        pool = int(number_option(ours, "pool_size", 4, whole=True))
        pool_timeout = number_option(ours, "pool_timeout", 5.0)
        # a lock claim keeps its transaction (so, behind a pooler, a server connection) while its
        # batch is sent; a lease holds none
        claims = ours.get("claims", "lease" if pooler == "transaction" else "lock")
        if claims not in CLAIM_KINDS:
            raise ConfigurationError(
                f"claims={claims!r} in {redact(url)} is not a way to claim; use claims=lock "
                "(row locks held while a batch is sent, the default) or claims=lease."
            )
        return cls(
            conninfo=conninfo,
            schema=check_name("schema", ours.get("schema", "public")),
            table=None if "table" not in ours else check_name("table", ours["table"]),
            claim_timeout=claim,
            pool_size=pool,
            pool_timeout=pool_timeout,
            claims=claims,
            pooler=pooler,
            listen_conninfo=listen if listen != "" else conninfo,
            poll=number_option(ours, "poll", 0.5, minimum=0.01),
            display=redact(url),
        )

    @property
    def session_free(self) -> bool:
        """Whether every connection must leave nothing behind past a transaction: no server-side
        prepared statements, no session settings (``SET`` without ``LOCAL``), no LISTEN."""
        return self.pooler == "transaction"

    @property
    def connect_kwargs(self) -> dict[str, Any]:
        """What every connection is opened with. psycopg prepares a statement on the server after
        it has run five times; through a pooler in transaction mode the next transaction may run
        on another server connection, where that statement does not exist (or one of another
        client's does: "prepared statement "_pg3_0" already exists")."""
        return {"prepare_threshold": None} if self.session_free else {}


def _listen_conninfo(
    given: str | None, pooler: str, netloc: str, path: str, params: list[tuple[str, str]], url: str
) -> str | None:
    """Where LISTEN connects: "" for the URL's own server, None for nowhere (poll), or a conninfo
    for the server itself at ``listen=HOST:PORT`` (the same role, password and database).

    Through a pooler in transaction mode a LISTEN lands on whichever server connection the pooler
    picks and notifications never reach the listener, so the default there is to poll."""
    if given is None:
        return None if pooler == "transaction" else ""
    if given in ("off", "no", "false"):
        return None
    if given in ("on", "yes", "true"):
        if pooler == "transaction":
            raise ConfigurationError(
                f"listen=on in {redact(url)}: LISTEN does not work through a pooler in transaction "
                "mode; give the server's own address (listen=HOST:PORT) or leave listen out to poll."
            )
        return ""
    host, _, port = given.rpartition(":") if ":" in given else (given, "", "")
    if not host or (port and not port.isdigit()):
        raise ConfigurationError(
            f"listen={given!r} in {redact(url)} is not an address; write listen=HOST:PORT (the "
            "PostgreSQL server itself, not the pooler), listen=off to poll, or leave it out."
        )
    users = netloc.rpartition("@")[0]
    server = f"{users}@{host}" if users else host
    server += f":{port}" if port else ""
    return f"postgresql://{server}{path}?{urlencode(params, quote_via=quote)}"


def _check_conninfo(conninfo: str, url: str) -> None:
    """Options duetime does not know go to libpq, which refuses a name it does not know either:
    said in one line, before any connection is tried."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(conninfo)
    except ProgrammingError as error:
        raise bad_option(url, error) from None


def bad_option(url: str, error: Exception) -> ConfigurationError:
    """libpq's refusal of a URL option (a name, or a value such as ``connect_timeout=abc``)."""
    return ConfigurationError(
        f"{redact(url)}: {str(error).strip().splitlines()[0]}; duetime's own options are {', '.join(sorted(OPTIONS))}, "
        "the rest go to PostgreSQL's client library (e.g. sslmode, connect_timeout, application_name)."
    )


def _end_frozen_transactions(params: list[tuple[str, str]], seconds: float) -> list[tuple[str, str]]:
    """Have the server end a session that sits idle inside a transaction for longer than a claim
    lasts. Only a frozen or partitioned process waits that long inside a transaction;
    its locks then come free (and its uncommitted work rolls back) instead of stalling others. A lock
    claim waits in its transaction while its batch is sent, which a deadline keeps far shorter."""
    setting = f"-c idle_in_transaction_session_timeout={int(seconds * 1000)}"
    if any("idle_in_transaction_session_timeout" in value for key, value in params if key == "options"):
        return params
    others = [(k, v) for k, v in params if k != "options"]
    given = " ".join(v for k, v in params if k == "options")
    return [*others, ("options", f"{given} {setting}".strip())]


def connect(options: PgOptions, *, autocommit: bool = False) -> Any:
    """A direct connection; a wrong database, role, password or port is one line with the
    server's own words (:class:`ConnectionFailed`)."""
    import psycopg

    try:
        return psycopg.connect(options.conninfo, autocommit=autocommit, **options.connect_kwargs)
    except psycopg.OperationalError as error:
        raise refused(options, error) from None
    except psycopg.ProgrammingError as error:  # an option's value libpq cannot read
        raise bad_option(options.display, error) from None


@contextmanager
def pooled(pool: ConnectionPool, options: PgOptions) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool`` for one call, with :func:`pooler_unsaid`."""
    with pooler_unsaid(options), pool.connection() as conn:
        yield conn


def one_round_trip(conn: psycopg.Connection[Any], options: PgOptions) -> AbstractContextManager[Any]:
    """psycopg's pipeline (the statements sent together, one round trip), except on a connection
    that a pooler in transaction mode shares, where the statements go one by one.

    Leaving a pipeline whose answers have not all arrived yet (a loaded machine), psycopg sends a
    flush request after the final sync. The pooler gave the server connection back to its pool at
    the sync's answer, so the flush takes a server connection again, and nothing answers a flush:
    PgBouncer then keeps that server connection for this client until it next speaks, and every
    other client waits (with one server connection, until PgBouncer's ``query_wait_timeout``
    closes them). Seen with PgBouncer 1.18 and psycopg 3.3."""
    return nullcontext() if options.session_free else conn.pipeline()


@contextmanager
def pooler_unsaid(options: PgOptions) -> Iterator[None]:
    """A prepared statement the server does not know (or knows already) means the URL leads
    through a pooler in transaction mode that duetime was not told of: said in one line with the
    fix, not in psycopg's words."""
    from psycopg import errors

    try:
        yield
    except (errors.DuplicatePreparedStatement, errors.InvalidSqlStatementName) as error:
        raise ConfigurationError(
            f"{options.display}: {one_line(error)}: the URL leads through a pooler in transaction "
            "mode (PgBouncer's pool_mode = transaction?); add pooler=transaction to the URL."
        ) from None


def reach(options: PgOptions) -> None:
    """Connect once, directly, before a pool does: a wrong database, role, password or port then
    fails at once with the server's own words, not after the pool's timeout with its warnings."""
    connect(options, autocommit=True).close()


async def reach_async(options: PgOptions) -> None:
    """:func:`reach` for async callers."""
    import psycopg

    try:
        await (
            await psycopg.AsyncConnection.connect(options.conninfo, autocommit=True, **options.connect_kwargs)
        ).close()
    except psycopg.OperationalError as error:
        raise refused(options, error) from None
    except psycopg.ProgrammingError as error:  # an option's value libpq cannot read
        raise bad_option(options.display, error) from None


def refused(options: PgOptions, error: Exception) -> Exception:
    """A refused connection in the server's own words; PgBouncer's refusal of the start-up option
    that sets the idle-in-transaction limit says how to tell duetime of the pooler."""
    if "timeout expired" in str(error):  # libpq's words for a server that never answered
        from psycopg.conninfo import conninfo_to_dict

        said = conninfo_to_dict(options.conninfo)
        where = f"{said.get('host', 'localhost')}:{said.get('port', 5432)}"
        seconds = float(str(options.connect_kwargs.get("connect_timeout", said.get("connect_timeout", 5))))
        return connection_failed(options.display, no_answer(where, seconds, "PostgreSQL"))
    failed = connection_failed(options.display, error)
    if "unsupported startup parameter" not in str(error):
        return failed
    return ConfigurationError(
        f"{failed}: the URL leads to a pooler (PgBouncer?), which takes no start-up options; add "
        "pooler=transaction to the URL (pooler=session for a pooler in session mode)."
    )


#: The "table" the queue tables are named after (``duetime_queues``, ``duetime_queue_messages``).
QUEUE_TABLES = "duetime"


def channel_of(schema: str, table: str) -> str:
    """A LISTEN/NOTIFY channel name: stable, short, one per table."""
    return "duetime_" + hashlib.sha1(f"{schema}.{table}".encode()).hexdigest()[:20]


def due_payload(due: datetime) -> str:
    """A due time as a store's channel carries it (microseconds since 1970): the one writer of
    the announcement that wakes the store's dispatchers, for schedules and bulk jobs alike."""
    return str(to_micros(due))


def announced_due(payload: str) -> datetime | None:
    """The due time :func:`due_payload` wrote; None for anything else ("look again")."""
    try:
        return from_micros(int(payload))
    except ValueError:
        return None


def announce(conn: Any, names: PgNames, due: datetime) -> None:
    """In ``conn``'s transaction (sent when it commits): a message of ``names``' table is stored
    due at ``due``. The store's bulk loads and the bulk jobs say it this way."""
    conn.execute(names.q["notify"], {"channel": names.channel, "payload": due_payload(due)})


class PgNames:
    """Quoted identifiers and the queries formatted with them, for one table in one schema."""

    def __init__(self, schema: str, table: str) -> None:
        self.schema, self.table = schema, table
        s = quote_identifier(schema)

        def ident(name: str) -> str:
            return quote_identifier(postgres_name(name))

        names = {
            "schema_table": f"{s}.duetime_schema",
            "table": f"{s}.{ident(table)}",
            "index_due": ident(f"{table}_due"),
            "index_claim": ident(f"{table}_claim"),
            "index_destination": ident(f"{table}_destination"),
            "index_failing": ident(f"{table}_failing"),
            "index_group": ident(f"{table}_group"),
            "queues": f"{s}.duetime_queues",
            "presence": f"{s}.duetime_dispatchers",
            "api_keys": f"{s}.duetime_api_keys",
            "records": f"{s}.duetime_records",
            "schedules": f"{s}.duetime_schedules",
            "index_schedules_plan": "duetime_schedules_plan",
            "messages": f"{s}.duetime_queue_messages",
            "index_ready": "duetime_queue_messages_ready",
            "index_waiting": "duetime_queue_messages_waiting",
        }
        self.qualified = names["table"]
        self.quoted_schema = s
        #: What the queue's set-up makes, and the store's (with the queue's): what must be there
        #: for a set-up to have nothing to do.
        self.queue_relations = [
            names["queues"],
            names["messages"],
            f"{s}.{quote_identifier(names['index_ready'])}",
            f"{s}.{quote_identifier(names['index_waiting'])}",
        ]
        #: Each index the set-up makes, by the query that makes it: its qualified name.
        self.indexes = {
            "create_store_due_index": f"{s}.{names['index_due']}",
            "create_store_claim_index": f"{s}.{names['index_claim']}",
            "create_store_destination_index": f"{s}.{names['index_destination']}",
            "create_store_failing_index": f"{s}.{names['index_failing']}",
            "create_store_group_index": f"{s}.{names['index_group']}",
            "create_schedule_plan_index": f"{s}.{quote_identifier(names['index_schedules_plan'])}",
            "create_messages_index": f"{s}.{quote_identifier(names['index_ready'])}",
            "create_messages_waiting_index": f"{s}.{quote_identifier(names['index_waiting'])}",
        }
        self.store_relations = [
            names["schema_table"],
            names["table"],
            names["presence"],
            names["api_keys"],
            names["records"],
            names["schedules"],
            *self.indexes.values(),
            names["queues"],
            names["messages"],
        ]
        # the claims' shared parts are fragments of their own, written once (queries.sql)
        fragments = {name: QUERIES[name].format(**names) for name in ("claimed_and_next", "due_rows")}
        self.q = {
            name: sql.format(**names, **fragments, held=HOLD_TOKEN_SQL) for name, sql in QUERIES.items()
        }
        #: LISTEN/NOTIFY channel: stable, short, one per table.
        self.channel = channel_of(schema, table)
        #: The channel of the schema's queue tables: a NOTIFY with the queue's name as payload
        #: commits with every message put in a queue, and waiting receivers wake on it.
        self.queue_channel = channel_of(schema, QUEUE_TABLES)
        #: pg_advisory_xact_lock key that serializes concurrent set-ups of this schema.
        self.setup_lock = int.from_bytes(
            hashlib.sha1(f"duetime:{schema}".encode()).digest()[:8], "big", signed=True
        )

    def component(self) -> str:
        return f"store:{self.table}"


def all_there(conn: Any, relations: Sequence[str]) -> bool:
    """Whether every table and index named exists (an index whole: one that a build cut short
    left behind is not), read from the catalogue alone. A set-up with nothing to do must not run
    its ``CREATE INDEX IF NOT EXISTS``: that takes a lock on the table before it finds the index
    there, which stalls every dispatcher writing to it (and cancels autovacuum) for as long as the
    set-up waits for a transaction in flight; measured: lateness p99 1.6 s and the tables doubled
    in size at each restart of a dispatcher."""
    row = conn.execute(
        "SELECT bool_and(to_regclass(name) IS NOT NULL AND coalesce(i.indisvalid, true)) "
        "FROM unnest(%(names)s::text[]) AS name LEFT JOIN pg_index i ON i.indexrelid = to_regclass(name)",
        {"names": list(relations)},
    ).fetchone()
    return bool(row and row[0])


#: How often a set-up looks again at an index another set-up is building.
INDEX_BUILD_POLL = 0.5


def build_index_online(conn: Any, index: str, create: str) -> None:
    """Make ``index`` (``create`` is its ``CREATE INDEX IF NOT EXISTS``) on a table in use without
    holding up its writers: built ``CONCURRENTLY``, which never blocks inserts, updates or deletes
    (a plain build blocks them all until it ends: minutes on ten million rows).

    A concurrent build cut short (an error, a cancel, a crash) leaves an index marked not valid,
    which ``IF NOT EXISTS`` would take for done: it is dropped (concurrently too) and built again.
    One that another set-up is building is waited for. ``conn`` is in autocommit."""
    while True:
        state = conn.execute(
            "SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_stat_progress_create_index p "
            "WHERE p.index_relid = i.indexrelid) FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            [index],
        ).fetchone()
        if state is None:
            break
        valid, building = state
        if valid:
            return
        if not building:
            conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}")
            break
        time.sleep(INDEX_BUILD_POLL)
    log.info("building index %s; writes to its table go on meanwhile (millions of rows take minutes)", index)
    started = time.monotonic()
    conn.execute(create.replace("CREATE INDEX IF NOT EXISTS", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
    log.info("built index %s in %.1f s", index, time.monotonic() - started)


def table_for(options: PgOptions, endpoint: str) -> str:
    return table_name(endpoint, options.table)


def decode(row: Sequence[Any]) -> DelayedMessage:
    """A row from a ``RETURNING``/``SELECT`` of (id, destination, due_at, headers, body, failures,
    group)."""
    return DelayedMessage.from_store(
        row[0], row[1], row[2].astimezone(UTC), bytes(row[4]), load_headers(row[3]), row[5], row[6]
    )


def copy_row(m: DelayedMessage) -> tuple[Any, ...]:
    return (
        m.message_id,
        m.destination,
        m.due_at,
        dump_headers(m.headers),
        m.body,
        m.failure_count,
        m.group,
    )


def planner_rows(conn: Any, qualified: str) -> float | None:
    """How many rows PostgreSQL's planner believes the table holds (-1: never analyzed)."""
    found = conn.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [qualified]).fetchone()
    return None if found is None else float(found[0])


#: A load of at least this many rows may leave the planner taking its table for nearly empty.
ANALYZE_AFTER_ROWS = 1_000


def refresh_planner_stats(conn: Any, qualified: str, added: int) -> None:
    """After one load of ``added`` rows into ``qualified`` (committed), ANALYZE the table when
    PostgreSQL's statistics know of fewer rows than that: a new or emptied table filled in one go.

    Until autovacuum gets to it (a minute or more) the planner would take such a table for nearly
    empty and answer the dispatcher's "when is the next one due?" with a scan and sort of the whole
    table instead of one step down the due index: measured at 10,000 rows, 11 ms a question instead
    of 1 ms (and lateness p50 up by as much), growing with the table. A role that may not ANALYZE
    gets a warning from the server and the table waits for autovacuum, as before; any failure here
    is logged and never fails the load, which has committed.
    """
    if added < ANALYZE_AFTER_ROWS:
        return
    import psycopg

    try:
        with conn.transaction():
            known = planner_rows(conn, qualified)
            if known is not None and known < added:
                conn.execute(f"ANALYZE {qualified}")
    except psycopg.Error as error:
        log.warning(
            "refreshing the statistics of %s failed (autovacuum will): %s", qualified, one_line(error)
        )


#: One entry for a queue: (queue, message id, headers JSON, body).
QueueEntry = tuple[str, str, str, bytes]


def enqueue_declared(conn: Any, names: PgNames, entries: Sequence[QueueEntry]) -> set[str]:
    """Insert the entries whose queue is declared, in one statement that also wakes the queues'
    receivers (a dispatcher's move and a queue's send alike; a hundred single inserts cost the
    server more than the rest of a move); the ids that went in."""
    if not entries:
        return set()
    queues, ids, headers, bodies = (list(column) for column in zip(*entries, strict=True))
    params = {
        "queues": queues,
        "ids": ids,
        "headers": headers,
        "bodies": bodies,
        "channel": names.queue_channel,
    }
    return {r[0] for r in conn.execute(names.q["enqueue_declared"], params).fetchall()}
