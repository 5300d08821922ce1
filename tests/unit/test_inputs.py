"""Bad input at every public entry point: a clear error naming the field and the fix."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import duetime
from duetime import (
    ConfigurationError,
    DelayedDeliverySettings,
    DelayedMessage,
    DelayedMessageClient,
    InvalidMessage,
    SyncDelayedMessageClient,
    TransactionMode,
    UnknownScheme,
    open_store,
    open_transport,
)
from duetime.backends.memory import MemoryStore
from duetime.inputs.durations import parse_duration, parse_time
from duetime.message import new_message_id
from duetime.testing import FakeClock

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_public_surface_is_what_we_mean() -> None:
    assert duetime.__all__ == sorted(duetime.__all__, key=str.lower) or duetime.__all__ == sorted(
        duetime.__all__
    )
    for name in duetime.__all__:
        assert hasattr(duetime, name), name


def test_due_times_are_kept_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    m = DelayedMessage("a", "q", datetime(2030, 1, 1, 12, tzinfo=plus_two))
    assert m.due_at == datetime(2030, 1, 1, 10, tzinfo=UTC) and m.due_at.tzinfo is UTC


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"due_at": datetime(2030, 1, 1)}, "naive"),
        ({"due_at": "2030-01-01"}, "must be a datetime"),
        ({"due_at": datetime(1969, 1, 1, tzinfo=UTC)}, "outside the supported years"),
        ({"message_id": ""}, "message_id must not be empty"),
        ({"message_id": "x" * 251}, "limit is 250"),
        ({"message_id": 5}, r"message_id must be text, got a number \(5\)"),
        ({"destination": "d" * 201}, "limit is 200"),
        ({"destination": "  "}, "destination must not be empty"),
        ({"body": "text"}, "encode text"),
        ({"headers": {"a": 1}}, r"header 'a' must be text, got a number \(1\)"),
        ({"headers": [("a", "b")]}, "headers must be names with text values, got a list"),
        ({"failure_count": -1}, "failure_count"),
    ],
)
def test_invalid_messages_name_the_field(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"message_id": "a", "destination": "q", "due_at": NOW} | kwargs
    with pytest.raises(InvalidMessage, match=message):
        DelayedMessage(**fields)  # type: ignore[arg-type]


def test_limits_are_inclusive() -> None:
    DelayedMessage("x" * 250, "d" * 200, NOW)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"delay": 1, "due_at": NOW}, "exactly one"),
        ({"delay": -1}, "negative"),
        ({"delay": float("nan")}, "finite"),
        ({"delay": float("inf")}, "finite"),
        ({"delay": 10**12}, "too long"),
        ({"delay": True}, "seconds, a timedelta"),
        ({"delay": [5]}, "seconds, a timedelta"),
        ({"delay": "soon"}, "soon"),
    ],
)
def test_create_checks_delay_and_due_time(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidMessage, match=message):
        DelayedMessage.create("q", b"", now=NOW, **kwargs)  # type: ignore[arg-type]


def test_create_with_delay_and_generated_ids() -> None:
    m = DelayedMessage.create("q", b"x", delay=timedelta(seconds=5), now=NOW)
    assert m.due_at == NOW + timedelta(seconds=5)
    ids = [new_message_id() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 36 for i in ids)


def test_headers_are_frozen() -> None:
    m = DelayedMessage("a", "q", NOW, headers={"k": "v"})
    with pytest.raises(TypeError):
        m.headers["k"] = "w"  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("1.5s", 1.5), ("250ms", 0.25), ("10m", 600), ("1h30m", 5400), ("2d", 172800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1h-3m", "-5s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidMessage):
        parse_duration(text)


def test_times_need_an_offset() -> None:
    assert parse_time("2030-01-01T10:00:00+02:00") == datetime(2030, 1, 1, 8, tzinfo=UTC)
    assert parse_time("2030-01-01T10:00:00Z") == datetime(2030, 1, 1, 10, tzinfo=UTC)
    with pytest.raises(InvalidMessage, match="offset"):
        parse_time("2030-01-01T10:00:00")
    with pytest.raises(InvalidMessage, match="ISO 8601"):
        parse_time("next tuesday")


def test_settings_defaults_are_the_seeds() -> None:
    s = DelayedDeliverySettings()
    assert s.number_of_retries == 0
    assert s.time_to_trigger_store_circuit_breaker == timedelta(seconds=30)
    assert s.time_to_trigger_fetch_circuit_breaker == timedelta(seconds=30)
    assert s.time_to_trigger_dispatch_circuit_breaker == timedelta(seconds=30)
    assert s.time_to_wait_before_triggering_critical_error_on_timeout_outages == timedelta(minutes=2)
    assert s.maximum_recovery_failures_per_second == 1
    assert s.transaction_mode is None  # the dispatcher takes the safest its store and transport keep


def test_settings_from_env() -> None:
    s = DelayedDeliverySettings.from_env(
        environ={
            "DUETIME_NUMBER_OF_RETRIES": "7",
            "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER": "45",
            "DUETIME_TRANSACTION_MODE": "exactly-once",
            "DUETIME_ERROR_QUEUE": "dead",
        }
    )
    assert (s.number_of_retries, s.time_to_trigger_fetch_circuit_breaker) == (7, timedelta(seconds=45))
    assert s.transaction_mode is TransactionMode.EXACTLY_ONCE and s.error_queue == "dead"
    with pytest.raises(ConfigurationError, match="DUETIME_NUMBER_OF_RETRIES"):
        DelayedDeliverySettings.from_env(environ={"DUETIME_NUMBER_OF_RETRIES": "many"})
    # a value out of range is said with the variable that gave it, not the Python field
    with pytest.raises(ConfigurationError, match=r"^DUETIME_BATCH_SIZE='0' must be from 1 to 10,000\.$"):
        DelayedDeliverySettings.from_env(environ={"DUETIME_BATCH_SIZE": "0"})


def test_a_flag_of_duetime_run_is_read_as_its_variable_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """`duetime run --lateness-budget 20ms` reads the text as DUETIME_LATENESS_BUDGET=20ms would
    be read, and the flag wins over the variable."""
    from duetime.cli.run import _settings

    monkeypatch.setenv("DUETIME_LATENESS_BUDGET", "5ms")
    assert _settings({"--lateness-budget": None}).lateness_budget == timedelta(milliseconds=5)
    chosen = _settings(
        {"--lateness-budget": "20ms", "--mode": TransactionMode.EXACTLY_ONCE, "--batch-size": 7}
    )
    assert chosen.lateness_budget == timedelta(milliseconds=20)
    assert (chosen.transaction_mode, chosen.batch_size) == (TransactionMode.EXACTLY_ONCE, 7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"number_of_retries": -1}, "number_of_retries"),
        ({"maximum_recovery_failures_per_second": 0}, "maximum_recovery"),
        ({"batch_size": 0}, "batch_size"),
        ({"max_sleep": timedelta(0)}, "max_sleep"),
        ({"error_queue": " "}, "error_queue"),
        ({"transaction_mode": "twice"}, "twice"),
        ({"claim_window": timedelta(seconds=2)}, "claim_window must be from 0 to 1 second"),
        ({"claim_window": timedelta(milliseconds=-1)}, "claim_window must be from 0 to 1 second"),
        (
            {"claim_window": timedelta(milliseconds=800), "claim_timeout": timedelta(seconds=1)},
            "claim_window must be at most half the claim_timeout",
        ),
    ],
)
def test_bad_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DelayedDeliverySettings(**kwargs)  # type: ignore[arg-type]


def test_urls_choose_backends_and_typos_get_a_hint() -> None:
    with pytest.raises(UnknownScheme, match="Did you mean sqlite://"):
        open_store("sqllite:///x.db")
    with pytest.raises(ConfigurationError, match="not a backend URL"):
        open_transport("duetime.db")
    with pytest.raises(ConfigurationError, match="three slashes"):
        open_store("sqlite://host/x.db")
    with pytest.raises(ConfigurationError, match="Unknown SQLite URL option"):
        open_store("sqlite:///x.db?tabel=y")
    with pytest.raises(ConfigurationError, match="names no file"):
        open_store("sqlite:///")
    assert type(open_store("memory://")).__name__ == "MemoryStore"


@pytest.mark.parametrize("endpoint", ["", "bad name", "x" * 101, "../etc", '"; drop table x; --'])
async def test_endpoint_names_are_checked(endpoint: str) -> None:
    with pytest.raises(ConfigurationError, match="not allowed"):
        DelayedMessageClient(MemoryStore(), endpoint=endpoint)


async def test_client_schedules_cancels_and_reschedules() -> None:
    store = MemoryStore()
    await store.setup_infrastructure("app")
    clock = FakeClock(NOW)
    client = await DelayedMessageClient(store, endpoint="app", clock=clock).open()
    m = await client.schedule("orders", b"x", delay=60, headers={"k": "v"})
    assert m.due_at == NOW + timedelta(seconds=60)
    assert await client.reschedule(m.message_id, due_at=NOW + timedelta(hours=1))
    assert (await client.get(m.message_id)).due_at == NOW + timedelta(hours=1)  # type: ignore[union-attr]
    assert [x.message_id for x in (await client.list(destination="orders")).messages] == [m.message_id]
    assert await client.cancel(m.message_id) and not await client.cancel(m.message_id)
    with pytest.raises(InvalidMessage, match="limit"):
        await client.list(limit=0)
    with pytest.raises(InvalidMessage, match="naive"):
        await client.schedule("orders", due_at=datetime(2030, 1, 1))
    with pytest.raises(ConfigurationError, match="async"):
        DelayedMessageClient(store.sync)  # type: ignore[arg-type]


def test_sync_client() -> None:
    store = MemoryStore()
    store.sync.setup_infrastructure("duetime")
    client = SyncDelayedMessageClient(store.sync, clock=FakeClock(NOW))
    m = client.schedule("orders", delay=5)
    assert client.get(m.message_id) == m
    assert client.reschedule(m.message_id, delay=10)
    assert client.cancel(m.message_id)


@pytest.mark.parametrize(
    ("url", "option"),
    [
        ("sqlite:///x.db?claim_timeout=soon", "claim_timeout"),
        ("sqlite:///x.db?watch_interval=0", "watch_interval"),
        ("postgresql://u@h/db?pool_size=many", "pool_size"),
        ("postgresql://u@h/db?pool_timeout=-1", "pool_timeout"),
        ("mysql://u@h/db?poll_interval=fast", "poll_interval"),
        ("redis://h:6379/0?claim_timeout=soon", "claim_timeout"),
    ],
)
def test_bad_numeric_store_url_options_name_the_option(url: str, option: str, tmp_path: object) -> None:
    with pytest.raises(ConfigurationError, match=f"URL option {option}"):
        open_store(url)


@pytest.mark.parametrize(
    ("url", "option"),
    [
        ("redis://h:6379/0?visibility_timeout=later", "visibility_timeout"),
        ("amqp://guest:guest@h/?prefetch=lots", "prefetch"),
    ],
)
def test_bad_numeric_transport_url_options_name_the_option(url: str, option: str) -> None:
    with pytest.raises(ConfigurationError, match=f"URL option {option}"):
        open_transport(url)


def test_mysql_store_before_initialize_says_so_without_connecting() -> None:
    from duetime import StoreNotReady
    from duetime.backends.mysql import SyncMysqlStore

    store = SyncMysqlStore.from_url("mysql://nobody@127.0.0.1:1/db")
    with pytest.raises(StoreNotReady, match="initialize"):
        store.remove_many(["a"])


def test_queue_rows_are_read_without_raising_and_name_their_problem() -> None:
    from duetime.backends.queue_rows import read_headers, received

    headers, problem = read_headers({"n": 5, "bad\ud800": "x\udcff", "ok": "fine"})
    assert headers == {"n": "5", "bad?": "x?", "ok": "fine"}  # every value text, every text valid
    assert problem == "header 'n' is int, not text"  # the first problem is named
    assert read_headers({"bad\ud800": "x"})[1] == "header 'bad?' is not valid UTF-8 text"
    assert read_headers("not json") == (
        {"duetime-unreadable-headers": "not json"},
        "the headers are not JSON",
    )
    assert read_headers("[1]")[1] == "the headers are not a JSON object"
    item = received("q", None, '{"a": "b"}', "text body", "r", 1)
    assert (item.message_id, item.body, item.problem) == ("", b"text body", "the message has no id")
    assert received("q", b"id", b'{"a": "b"}', memoryview(b"x"), "r", 2).problem is None


def test_the_settings_claim_timeout_is_the_lease_unless_the_url_gives_one(tmp_path: Path) -> None:
    from duetime.backends.memory import SyncMemoryStore
    from duetime.backends.sqlite import SqliteStore, SyncSqliteStore
    from duetime.registry import open_store, open_sync_store

    lease = timedelta(seconds=7)
    async_store = open_store(f"sqlite:///{tmp_path}/a.db", claim_timeout=lease)
    url_wins = open_sync_store(f"sqlite:///{tmp_path}/b.db?claim_timeout=3", claim_timeout=lease)
    default = open_sync_store("memory://")
    assert isinstance(async_store, SqliteStore) and isinstance(url_wins, SyncSqliteStore)
    assert isinstance(default, SyncMemoryStore)
    assert async_store.sync.claim_timeout == lease
    assert url_wins.claim_timeout == timedelta(seconds=3)
    assert default.claim_timeout == timedelta(seconds=30)
    async_store.sync.close()
    url_wins.close()


def test_a_store_says_where_it_delivers_by_default() -> None:
    from duetime.registry import default_transport

    assert default_transport("sqlite:///x.db?busy_timeout=5") == "sqlite:///x.db"
    assert default_transport("postgresql://h/db?schema=s") == "postgresql://h/db?schema=s"
    with pytest.raises(ConfigurationError, match="--transport"):
        default_transport("redis://127.0.0.1:6379/0")


def test_only_browsable_queues_are_browsable() -> None:
    from duetime.backends.memory import MemoryTransport
    from duetime.interfaces import BrowsableQueue, ClaimPolicy

    assert isinstance(MemoryTransport(), BrowsableQueue)
    assert isinstance(MemoryStore(), ClaimPolicy) and MemoryStore().parallel_claims


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"delay": "1m"}', "line 1: destination is missing; give it as text."),
        ('{"destination": 5, "delay": "1m"}', "line 1: destination must be text, got a number (5)."),
        ('{"destination": "q", "delay": -1}', "line 1: delay must not be negative, got -1 s"),
        ('{"destination": "q"}', 'line 1: give exactly one of "due_at"'),
        (
            '{"destination": "q", "delay": "1m", "headers": {"a": 1}}',
            "header 'a' must be text, got a number (1)",
        ),
    ],
)
def test_a_bad_json_line_is_explained_in_the_files_terms(line: str, message: str) -> None:
    from duetime.operations.message_files import parse_line

    with pytest.raises(InvalidMessage) as caught:
        parse_line(line, 1, NOW)
    assert message in str(caught.value)
    assert "NoneType" not in str(caught.value) and "str ->" not in str(caught.value)


def test_a_negative_timedelta_reads_as_seconds() -> None:
    from datetime import timedelta

    with pytest.raises(InvalidMessage, match="got -1 s") as caught:
        DelayedMessage.create("q", b"", delay=timedelta(seconds=-1))
    assert "day" not in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("endpoint", 5, "endpoint must be text, got a number (5)."),
        ("endpoint", "two words", "endpoint name 'two words' is not allowed"),
        ("destination", ["q"], "destination must be text, got a list."),
        ("body", 5, "body must be text or bytes, got a number (5)."),
        ("headers", [1], "headers must be a JSON object of text, got a list."),
        ("failure_count", "x", "failure_count must be a whole number"),
        (
            "failure_count",
            1.5,
            "failure_count must be a whole number from 0 to 2,147,483,647, got a number (1.5).",
        ),
        ("failure_count", 10**30, "failure_count must be a whole number from 0 to 2,147,483,647"),
        ("group", 7, "group must be text, got a number (7)."),
        ("id", {"a": 1}, "message id must be text, got an object"),
        ("body_base64", "!!!", "body_base64 must be base64 text"),
    ],
)
def test_a_bulk_json_line_of_the_wrong_type_is_a_reason_not_a_crash_nor_a_conversion(
    field: str, value: object, reason: str
) -> None:
    """bulk import and schedule read JSON Lines whose values may be of any JSON type: a wrong one
    rejects that row with a reason (a number as the body once became that many zero bytes, and an
    endpoint number failed the whole Spark task)."""
    import json

    from duetime.bulk.frames import _json_line, arrow_chunks, check_json

    row = {"endpoint": "e", "id": "m1", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"}
    checked = check_json(_json_line(json.dumps(row | {field: value})), None)
    assert checked[1] is not None and reason in checked[1], checked[1]
    assert next(arrow_chunks([checked])).num_rows == 1  # the rejects still go into Arrow


@pytest.mark.parametrize(("value", "count"), [(3, 3), (3.0, 3), ("3", 3), (None, 0)])
def test_a_bulk_json_line_takes_a_whole_failure_count_however_written(value: object, count: int) -> None:
    import json

    from duetime.bulk.frames import _json_line, check_json

    row = {"endpoint": "e", "id": 42, "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"}
    record, why = check_json(_json_line(json.dumps(row | {"failure_count": value})), None)
    assert why is None and record.failure_count == count and record.message_id == "42"


def test_a_bulk_json_body_in_base64_may_be_broken_into_lines() -> None:
    """Spark's base64 (what an export writes) breaks long bodies into MIME lines of 76."""
    import base64
    import json

    from duetime.bulk.frames import _json_line, check_json

    body = bytes(range(256))
    lines = base64.encodebytes(body).decode().replace("\n", "\r\n")
    row = {"endpoint": "e", "id": "m", "destination": "q", "due_at": "2031-01-01T00:00:00+00:00"}
    record, why = check_json(_json_line(json.dumps(row | {"body_base64": lines})), None)
    assert why is None and record.body == body


def test_postgresql_urls_reach_libpq_whole_or_are_refused_in_one_line() -> None:
    """``postgresql:///db`` (the local socket) lost its ``//`` (urlunsplit drops an empty host);
    an option libpq does not know was an "internal error" at the first connection."""
    from duetime.backends.postgres.connection import PgOptions

    local = PgOptions.from_url("postgresql:///app?schema=shop&sslmode=disable")
    assert local.conninfo.startswith("postgresql:///app?sslmode=disable&connect_timeout=5")
    assert local.schema == "shop"
    with pytest.raises(ConfigurationError, match=r'invalid URI query parameter: "colour".*sslmode'):
        PgOptions.from_url("postgresql://u:secret@db/app?colour=red")
    with pytest.raises(ConfigurationError) as caught:
        PgOptions.from_url("postgresql://u:secret@db/app?colour=red")
    assert "secret" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_postgresql_url_says_what_sits_between_and_where_to_listen() -> None:
    """Behind a pooler in transaction mode: no prepared statements, no start-up options (PgBouncer
    refuses them), lease claims and no LISTEN through the pooler unless the server itself is named;
    every mistake in these options is one line that says what to write."""
    from duetime.backends.postgres.connection import PgOptions

    direct = PgOptions.from_url("postgresql://u:pw@db/app")
    assert (
        direct.connect_kwargs == {} and direct.claims == "lock" and direct.listen_conninfo == direct.conninfo
    )
    assert "idle_in_transaction_session_timeout" in direct.conninfo
    pooled = PgOptions.from_url("postgresql://u:pw@bouncer:6432/app?pooler=transaction")
    assert pooled.connect_kwargs == {"prepare_threshold": None} and pooled.claims == "lease"
    assert pooled.listen_conninfo is None and "options" not in pooled.conninfo and pooled.poll == 0.5
    heard = PgOptions.from_url("postgresql://u:pw@bouncer:6432/app?pooler=transaction&listen=db:5432&poll=2")
    assert heard.listen_conninfo is not None and heard.listen_conninfo.startswith(
        "postgresql://u:pw@db:5432/app?"
    )
    assert heard.poll == 2.0
    session = PgOptions.from_url("postgresql://u:pw@bouncer:6432/app?pooler=session")
    assert session.connect_kwargs == {} and "options" not in session.conninfo and session.claims == "lock"
    for url, said in (
        ("postgresql://u:pw@db/app?pooler=statement", "is not a pooling mode"),
        ("postgresql://u:pw@db/app?pooler=transaction&listen=on", "LISTEN does not work through a pooler"),
        ("postgresql://u:pw@db/app?listen=db:port", "is not an address"),
        ("postgresql://u:pw@db/app?poll=0", "poll must be greater than"),
    ):
        with pytest.raises(ConfigurationError, match=said) as caught:
            PgOptions.from_url(url)
        assert "pw" not in str(caught.value).replace("pooler", "") and "\n" not in str(caught.value)


def test_urls_of_clusters_name_each_server() -> None:
    """One URL for a cluster: the nodes of a RabbitMQ cluster, the servers of a NATS one, the
    sentinels of a Redis master (with the master's name and database in the path)."""
    from duetime.backends._redis_database import SentinelTarget, check_database
    from duetime.backends.nats.transport import NatsTransport
    from duetime.backends.rabbitmq.transport import RabbitMqTransport

    rabbit = RabbitMqTransport.from_url("amqp://u:pw@a:5672,b:5673,c/vh?queue_type=quorum")
    assert [u.split("?")[0] for u in rabbit.urls] == [
        "amqp://u:pw@a:5672/vh",
        "amqp://u:pw@b:5673/vh",
        "amqp://u:pw@c/vh",
    ]
    assert rabbit.queue_type == "quorum"
    nats = NatsTransport.from_url("nats://a:4222,b:4223?replicas=3")
    assert nats.servers == ["nats://a:4222", "nats://b:4223"] and nats.replicas == 3
    with pytest.raises(ConfigurationError, match="1 to 5 copies"):
        NatsTransport.from_url("nats://a:4222?replicas=7")
    target = SentinelTarget.of("redis+sentinel://:pw@s1:26379,s2/mymaster/3")
    assert target.sentinels == [("s1", 26379), ("s2", 26379)] and target.service == "mymaster"
    assert (target.database, target.password) == (3, "pw")
    with pytest.raises(ConfigurationError, match="names no master"):
        check_database("redis+sentinel://s1:26379")


async def test_connect_used_as_the_client_says_how_to_get_one() -> None:
    import duetime

    pending = duetime.connect("memory://")
    with pytest.raises(ConfigurationError, match=r"`client = await duetime.connect\(url\)`.*client.schedule"):
        await pending.schedule("orders", b"x", delay=1)  # type: ignore[attr-defined]
    assert (
        not hasattr(pending, "schedule") and getattr(pending, "_repr_html_", None) is None
    )  # tools still ask
    async with pending as client:  # and it still works as meant
        assert (await client.schedule("orders", b"x", delay=1)).destination == "orders"


def test_a_blocking_store_where_an_async_one_belongs_or_the_reverse_is_one_line(tmp_path: Path) -> None:
    """The runtime-checkable Protocols compare method names only: a sync client given an async
    store scheduled nothing (one RuntimeWarning about a coroutine never awaited was the sign)."""
    from duetime import (
        ConfigurationError,
        DelayedMessageClient,
        Dispatcher,
        SyncDelayedMessageClient,
        open_store,
        open_sync_store,
        open_transport,
    )

    url = f"sqlite:///{tmp_path}/mix.db"
    wrong: list[tuple[Callable[[], Any], Callable[[Any], object], str, str]] = [
        (
            lambda: open_store(url),
            lambda store: SyncDelayedMessageClient(store),
            "() is blocking, but SqliteStore's is async",
            "open_sync_store",
        ),
        (
            lambda: open_sync_store(url),
            lambda store: DelayedMessageClient(store),
            "must be an async DelayedMessageStore, got SyncSqliteStore",
            "open_store",
        ),
        (
            lambda: open_sync_store(url),
            lambda store: Dispatcher(store, open_transport("memory://")),
            "must be an async DelayedMessageStore, got SyncSqliteStore",
            "open_store",
        ),
    ]
    for opened, given_to, said, hint in wrong:
        store = opened()
        with pytest.raises(ConfigurationError) as refused:
            given_to(store)
        result = store.close()
        if inspect.isawaitable(result):
            asyncio.run(result)
        text = str(refused.value)
        assert said in text and hint in text and "\n" not in text, text


def test_a_missing_extra_is_one_kind_of_error_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every missing extra is a MissingExtra naming what needs it and the pip line (it was said
    seven ways, most of them a plain ConfigurationError)."""
    import sys

    from duetime import MissingExtra, open_transport

    for module in [m for m in sys.modules if m == "nats" or m.startswith(("nats.", "duetime.backends.nats"))]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "nats", None)  # as if nats-py were not installed
    with pytest.raises(MissingExtra) as missing:
        open_transport("nats://127.0.0.1:4222")
    said = str(missing.value)
    assert "needs the 'nats' library: pip install 'duetime[nats]'." in said and "\n" not in said
    assert (
        str(MissingExtra.of("Metrics", "metrics"))
        == "Metrics needs the metrics extra: pip install 'duetime[metrics]'."
    )


def test_one_cursor_form_and_one_reader_of_a_users_time() -> None:
    """The CLI wrote a page's cursor `a~b` and the dashboard `a|b`; the CLI required an offset on
    a time and the dashboard assumed UTC by its own rule. One form, one reader."""
    from duetime.inputs.durations import parse_time
    from duetime.interfaces import cursor_text, read_cursor

    at = datetime(2030, 1, 2, 3, 4, 5, 600_000, tzinfo=UTC)
    assert read_cursor(cursor_text((at, "id~with|marks"))) == (at, "id~with|marks")
    with pytest.raises(ConfigurationError, match="not a place in the listing"):
        read_cursor(f"{at.isoformat()}|x")
    assert parse_time("2030-01-02T03:04", naive_is_utc=True) == datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    with pytest.raises(InvalidMessage, match="no UTC offset"):
        parse_time("2030-01-02T03:04")
