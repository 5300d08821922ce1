"""Every public input gets a clear error, never a traceback or a hang, and never changes what is
stored: the CLI (in process, through typer's runner, and as a real subprocess for the edge cases
users found) and the Python client, on SQLite and PostgreSQL, driven by hypothesis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from duetime import (
    ConfigurationError,
    DelayedMessage,
    DelayedMessageClient,
    DuetimeError,
    ListQuery,
    SyncDelayedMessageClient,
    TransactionMode,
    open_store,
    open_sync_store,
)
from duetime.cli import app
from tests.conftest import duetime_cmd, run_cli
from tests.services import MARIADB_AT, NATS_AT, PG_AT, RABBITMQ_AT, REDIS_AT, postgres_schema

# Text users type or programs pass: anything, including lone surrogates, NUL and brackets.
anything = st.text(st.characters(codec=None), max_size=40) | st.sampled_from(
    ["[/bold]", "[red]x[/]", "\x00", "\udcff", "inf", "1e400", "99999999999d", "-5s", "nan", ""]
)
edge_times = st.sampled_from(
    [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:00:00-14:00",
        "1969-12-31T23:59:59+00:00",
        "2020-01-01T00:00:00",
        "not a time",
    ]
)
wrong_types: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.datetimes(),
    st.just(datetime(1, 1, 1, tzinfo=UTC)),
    anything,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('bad') / 'bad.db'}"
    else:
        with postgres_schema() as url:
            yield url


@pytest.fixture(scope="module")
def seeded(store_url: str) -> str:
    """A store with one message in it, which no bad input may change."""
    store = open_sync_store(store_url)
    store.setup_infrastructure("duetime")
    client = SyncDelayedMessageClient(store)
    client.schedule("orders", b"keep", delay=3600, message_id="kept")
    store.close()
    return store_url


def snapshot(url: str) -> list[tuple[str, str, datetime, bytes]]:
    store = open_sync_store(url)
    store.initialize("duetime", "at-least-once")  # type: ignore[arg-type]
    try:
        page = store.list(ListQuery(limit=10_000))
        return sorted((m.message_id, m.destination, m.due_at, m.body) for m in page.messages)
    finally:
        store.close()


runner = CliRunner()


def invoke(url: str, *args: str) -> Any:
    return runner.invoke(app, [*args, "--store", url], catch_exceptions=True)


def assert_clean(result: Any) -> None:
    """Exit 0, or 1/2 with an error on one line; never an exception escaping the command but a
    DuetimeError (which ``duetime.cli.main`` prints as one line, exit 1)."""
    if isinstance(result.exception, DuetimeError):
        assert "\n" not in str(result.exception)
        return
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{type(result.exception).__name__}: {result.exception}") from result.exception
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 1:  # duetime's own errors: one line (2 is click's usage block)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    args=st.lists(anything | edge_times, min_size=1, max_size=4),
    command=st.sampled_from(
        [
            ["schedule"],
            ["cancel"],
            ["show"],
            ["reschedule"],
            ["list", "--destination"],
            ["list", "--due-before"],
        ]
    ),
)
def test_cli_takes_anything_without_a_traceback(seeded: str, command: list[str], args: list[str]) -> None:
    before = snapshot(seeded)
    extra: list[str] = []
    if command == ["schedule"]:
        extra = ["--in", args[-1]] if len(args) > 1 else ["--at", args[0]]
    elif command == ["reschedule"]:
        extra = ["--at", args[-1]]
    result = invoke(seeded, *command, args[0], *extra)
    assert_clean(result)
    after = snapshot(seeded)
    if command[0] != "schedule" or result.exit_code != 0:
        kept = [row for row in after if row[0] == "kept"]
        assert kept == [row for row in before if row[0] == "kept"]
    if result.exit_code != 0:
        assert after == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["schedule", "cancel", "get", "reschedule", "list", "schedule_many"]),
    value=wrong_types,
)
def test_client_answers_wrong_input_with_a_duetime_error(seeded: str, method: str, value: Any) -> None:
    before = snapshot(seeded)

    async def call() -> object:
        client = await DelayedMessageClient(open_store(seeded)).open()
        try:
            if method == "schedule":
                return await client.schedule(value, b"x", delay=10)
            if method == "reschedule":
                return await client.reschedule("kept", due_at=value)
            if method == "list":
                return await client.list(destination=value, limit=value if isinstance(value, int) else 5)
            if method == "schedule_many":
                return await client.schedule_many([value])
            return await getattr(client, method)(value)
        finally:
            await client.store.close()

    try:
        asyncio.run(call())
    except DuetimeError:
        assert snapshot(seeded) == before
    else:
        if method in ("schedule", "reschedule"):  # valid after all: undo, so the store stays known
            store = open_sync_store(seeded)
            client = SyncDelayedMessageClient(store)
            for m in client.list(limit=10_000).messages:
                if m.message_id != "kept":
                    client.cancel(m.message_id)
            if method == "reschedule":
                client.reschedule("kept", delay=3600)
            store.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"due_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))},
        {"due_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
        {"delay": float("inf")},
        {"delay": 1e300},
        {"delay": -1},
        {"delay": "ten minutes"},  # text is read as the CLI reads it ("10m" is fine)
        {"message_id": "\udcff"},
        {"message_id": "a\x00b"},
        {"headers": {"k": "\ud800"}},
        {"body": "text, not bytes"},
    ],
)
def test_client_edges(seeded: str, kwargs: dict[str, Any]) -> None:
    store = open_sync_store(seeded)
    client = SyncDelayedMessageClient(store)
    call: dict[str, Any] = {"delay": 10} | kwargs
    if "due_at" in kwargs:
        call.pop("delay")
    body = call.pop("body", b"x")
    try:
        with pytest.raises(DuetimeError) as caught:
            client.schedule("orders", body, **call)
        assert "\n" not in str(caught.value)
        if kwargs == {"delay": -1}:
            assert "-1" in str(caught.value) and "day" not in str(caught.value)
    finally:
        store.close()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, errors="surrogateescape")


@pytest.mark.parametrize(
    "args",
    [
        ["schedule", "orders", "--in", "inf"],
        ["schedule", "orders", "--in", "1e400"],
        ["schedule", "orders", "--in", "99999999999d"],
        ["schedule", "orders", "--at", "0001-01-01T00:00:00+01:00"],
        ["list", "--due-before", "9999-12-31T23:00:00-14:00"],
        ["schedule", "orders", "--id", "a\udcffb", "--in", "1h"],
        ["show", "a\udcffb"],
    ],
)
def test_cli_edges_found_by_users_are_one_line(seeded: str, args: list[str]) -> None:
    done = cli(*args, "--store", seeded)
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr
    if done.returncode == 1:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    "url_option",
    ["claim_timeout=inf", "pool_timeout=1e300", "pool_timeout=1e-300", "claim_timeout=nan"],
)
def test_unbounded_url_numbers_are_refused(url_option: str) -> None:
    with postgres_schema() as url:
        done = cli("stats", "--store", f"{url}&{url_option}")
    assert done.returncode == 1
    assert "must be between" in done.stderr or "must be" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_body_given_as_bytes_that_are_not_utf8_is_kept_byte_for_byte(tmp_path: Path) -> None:
    """`duetime schedule orders $'a\\xffb'`: the shell passes bytes, not text; they are stored as
    passed (they once ended in an internal error), and printed as ``body_hex`` by `show` and
    `recurring show` alike."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    assert cli("setup", "--store", url, "--queue", "orders").returncode == 0
    done = cli("schedule", "orders", "a\udcffb", "--in", "1h", "--id", "raw", "--store", url)
    assert done.returncode == 0, done.stderr
    assert json.loads(cli("show", "raw", "--store", url).stdout)["body_hex"] == b"a\xffb".hex()
    added = cli("recurring", "add", "raw", "orders", "a\udcffb", "--every", "1h", "--store", url)
    assert added.returncode == 0, added.stderr
    shown = json.loads(cli("recurring", "show", "raw", "--store", url).stdout)
    assert shown["body_hex"] == b"a\xffb".hex() and "body" not in shown  # as `show` prints a message's


def test_an_id_given_as_bytes_that_are_not_utf8_is_refused_as_not_text(tmp_path: Path) -> None:
    """An id is text every store and broker must carry: `--id $'a\\xff'` is refused in one line
    that says so, for a message and for a schedule alike (not as "control characters")."""
    url = f"sqlite:///{tmp_path / 'i.db'}"
    assert cli("setup", "--store", url, "--queue", "orders").returncode == 0
    for args in (
        ("schedule", "orders", "x", "--in", "1h", "--id", "a\udcff"),
        ("recurring", "add", "a\udcff", "orders", "x", "--every", "1h"),
    ):
        done = cli(*args, "--store", url)
        assert done.returncode == 1, done.stderr
        assert "not valid text" in done.stderr and "invalid UTF-8 byte" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert json.loads(cli("stats", "--store", url, "--json").stdout)["stored"] == 0


def test_ids_with_markup_are_printed_as_they_are(tmp_path: Path) -> None:
    """Stored first, then printed: a printing crash would report a stored message as a failure."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    assert cli("setup", "--store", url).returncode == 0
    done = cli("schedule", "x", "--id", "[/bold]", "--in", "1h", "--store", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[/bold]"
    listed = cli("list", "--store", url)
    assert listed.returncode == 0 and "[/bold]" in listed.stdout, listed.stderr
    assert cli("reschedule", "[/bold]", "--in", "2h", "--store", url).returncode == 0
    cancelled = cli("cancel", "[/bold]", "--store", url)
    assert cancelled.returncode == 0 and "[/bold]" in cancelled.stdout
    missing = cli("cancel", "[red]gone[/]", "--store", url)
    assert missing.returncode == 1 and "[red]gone[/]" in missing.stderr


async def test_receive_without_waiting_on_rabbitmq() -> None:
    from tests.services import RABBITMQ, require

    require(RABBITMQ)
    queue = f"empty.{os.getpid()}"
    missing = await asyncio.to_thread(cli, "queues", "receive", queue, "--wait", "0", "--transport", RABBITMQ)
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert (await asyncio.to_thread(cli, "queues", "declare", queue, "--transport", RABBITMQ)).returncode == 0
    empty = await asyncio.to_thread(cli, "queues", "receive", queue, "--wait", "0", "--transport", RABBITMQ)
    assert empty.returncode == 0 and "0 received" in empty.stderr, empty.stderr
    from duetime.backends.rabbitmq import RabbitMqTransport

    transport = RabbitMqTransport.from_url(RABBITMQ)
    await transport.delete(queue)
    await transport.close()


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (
            ["stats", "--store", f"postgresql://postgres@{PG_AT}/nosuchdb"],
            'database "nosuchdb" does not exist',
        ),
        (
            ["stats", "--store", f"postgresql://nosuchrole@{PG_AT}/test"],
            'role "nosuchrole" does not exist',
        ),
        (["stats", "--store", "postgresql://postgres@127.0.0.1:1/test"], "Connection refused"),
        (["stats", "--store", f"mysql://root@{MARIADB_AT}/nosuchdb"], "Unknown database"),
        (["stats", "--store", "mysql://root@127.0.0.1:1/test"], "Can't connect"),
        (["stats", "--store", "redis://127.0.0.1:1/0"], "Connection refused"),
        (["setup", "--store", "redis://:wrong@127.0.0.1:1/0"], "Connection refused"),
        (["queues", "declare", "q", "--transport", f"amqp://guest:wrong@{RABBITMQ_AT}/"], "ACCESS_REFUSED"),
        (
            ["queues", "declare", "q", "--transport", f"amqp://guest:guest@{RABBITMQ_AT}/nosuchvhost"],
            "the vhost 'nosuchvhost' exists",
        ),
        (["queues", "declare", "q", "--transport", "amqp://guest:guest@127.0.0.1:1/"], "Connect call failed"),
        (["queues", "declare", "q", "--transport", "redis://127.0.0.1:1/0"], "Connect call failed"),
        (["queues", "declare", "q", "--transport", "nats://127.0.0.1:1"], "Connect call failed"),
    ],
)
def test_a_server_that_cannot_be_reached_is_one_line(args: list[str], reason: str) -> None:
    started = time.monotonic()
    done = cli(*args)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot connect to ") and reason in line, line
    assert "wrong" not in line  # the password is never shown
    assert " object at 0x" not in line  # a library's repr of a protocol frame means nothing here
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--store", "{redis}/99"],
        ["setup", "--store", "{redis}/99"],
        ["queues", "declare", "q", "--transport", "{redis}/99"],
        ["queues", "declare", "q", "--transport", "celery+{redis}/99"],
        ["queues", "declare", "q", "--transport", "dramatiq+{redis}/99"],
        ["run", "--burst", "--no-front-door", "--transport", "celery+{redis}/99"],
        ["run", "--burst", "--no-front-door", "--transport", "dramatiq+{redis}/99"],
    ],
)
def test_a_redis_database_the_server_does_not_have_is_one_line(tmp_path: Path, args: list[str]) -> None:
    """redis-py answers a database number past the server's with a bare ResponseError; a
    dispatcher used to retry it as an outage for ever. It is a wrong URL: said once, at once."""
    from urllib.parse import urlsplit

    from tests.services import REDIS, require

    require(REDIS)
    server = urlsplit(REDIS)._replace(path="").geturl()
    store = f"sqlite:///{tmp_path / 'd.db'}"
    assert cli("setup", "--store", store).returncode == 0
    done = cli(*(a.format(redis=server) for a in args), env={"DUETIME_STORE": store})
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot connect to ") and "no such database" in last, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("scheme", ["redis", "celery+redis", "dramatiq+redis"])
def test_a_redis_database_that_is_not_a_number_is_refused(scheme: str) -> None:
    """redis-py would quietly use database 0 for ``/orders``."""
    done = cli("queues", "declare", "q", "--transport", f"{scheme}://{REDIS_AT}/orders")
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "names database 'orders'" in line and "is a number" in line, line


@pytest.mark.parametrize("where", ["sqlite", "POSTGRES", "REDIS", "NATS", "RABBITMQ"])
def test_receiving_from_a_queue_nobody_declared_is_one_line(tmp_path: Path, where: str) -> None:
    """A typo in the queue's name waited and said "0 received" (SQL queues), or was an internal
    error (Redis: NOGROUP; NATS: stream not found)."""
    from tests import services

    url = f"sqlite:///{tmp_path / 'q.db'}"
    if where == "sqlite":
        assert cli("setup", "--store", url).returncode == 0
    else:
        url = getattr(services, where)
        services.require(url)
    queue = f"nobody.declared.{os.getpid()}"
    done = cli("queues", "receive", queue, "--wait", "0", "--transport", url)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"Queue '{queue}' does not exist on " in line and f"duetime queues declare {queue}" in line, line


@pytest.mark.parametrize("where", ["REDIS", "NATS"])
async def test_a_consumer_of_an_undeclared_queue_is_told_so(where: str) -> None:
    """The transports themselves, for code that consumes without the CLI."""
    from duetime import DestinationNotFound, open_transport
    from tests import services

    url = getattr(services, where)
    services.require(url)
    transport = open_transport(url)
    await transport.start()
    try:
        with pytest.raises(DestinationNotFound, match="declare it first"):
            await transport.receive(f"nobody.declared.{os.getpid()}", 1, 0)  # type: ignore[attr-defined]
    finally:
        await transport.close()


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("garbage", "Cannot write a delivery log to 'garbage'; use jsonl:/folder"),
        ("jsonl:", "Name a folder for the delivery log"),
        ("jsonl:{file}", "it is a file; name a folder"),
        ("jsonl:{file}/sub", "Not a directory; name a folder duetime can create and write to"),
        ("sqlite:///{file}", "is not a SQLite database"),
        (f"postgresql://postgres@{PG_AT}/test?foo=1", 'invalid URI query parameter: "foo"'),
        (f"postgresql://postgres@{PG_AT}/nosuchdb", 'database "nosuchdb" does not exist'),
    ],
)
def test_a_delivery_log_that_cannot_be_kept_is_one_line(tmp_path: Path, spec: str, said: str) -> None:
    """A file where the folder should be was an internal error (FileExistsError); a database log
    was reached only at the first delivery, then a warning at every batch."""
    if spec.startswith("postgresql"):
        from tests.services import POSTGRES, require

        require(POSTGRES)
    store = f"sqlite:///{tmp_path / 'd.db'}"
    (tmp_path / "afile").write_text("some text, not a database " * 5)
    done = cli("run", "--burst", "--store", store, "--delivery-log", spec.format(file=tmp_path / "afile"))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and said in line, line


@pytest.mark.parametrize("what", ["folder", "not sqlite", "cannot be made"])
@pytest.mark.parametrize(
    "command", [["setup", "--store"], ["stats", "--store"], ["run", "--burst", "--transport"]]
)
def test_a_sqlite_url_naming_a_folder_or_another_kind_of_file_is_one_line(
    tmp_path: Path, what: str, command: list[str]
) -> None:
    """Both were internal errors ("unable to open database file", "file is not a database"), and a
    dispatcher retried such a transport for 30 s as an outage before stopping as critical."""
    target = tmp_path if what != "cannot be made" else Path("/proc/duetime.db")  # a folder no one can write
    if what == "not sqlite":
        target = tmp_path / "notes.txt"
        target.write_text("not a database, but some text long enough to fill SQLite's header " * 3)
    store = f"sqlite:///{tmp_path / 'ok.db'}"
    assert cli("setup", "--store", store).returncode == 0
    started = time.monotonic()
    done = cli(*command, f"sqlite:///{target}", env={"DUETIME_STORE": store})
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    said = {
        "folder": "is a folder, not a SQLite file",
        "not sqlite": "is not a SQLite database",
        "cannot be made": "Cannot open the SQLite file /proc/duetime.db"
        if command[0] != "stats"
        else "There is no SQLite store at /proc/duetime.db",  # stats looks for the file first
    }[what]
    assert said in line, line
    assert time.monotonic() - started < 20
    if what == "not sqlite":
        assert target.read_text().startswith("not a database")  # left as it was


def test_the_demo_refuses_sizes_it_cannot_check() -> None:
    done = cli("demo", "--messages", "10000000000")
    assert done.returncode == 2 and "from 1 to 1,000,000" in " ".join(done.stderr.split())


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"redis://{REDIS_AT}/0?colour=red", "has an option the Redis client does not take"),
        (f"nats://{NATS_AT}?colour=red", "Unknown NATS URL option(s) ['colour']"),
        (f"amqp://guest:guest@{RABBITMQ_AT}/?colour=red", "Unknown RabbitMQ URL option(s) ['colour']"),
        # aiormq read both as 0: heartbeats off (a partition unnoticed), a connect that never waits
        (f"amqp://guest:guest@{RABBITMQ_AT}/?heartbeat=1O", "heartbeat='1O' must be a whole number"),
        (f"amqp://guest:guest@{RABBITMQ_AT}/?timeout=soon", "timeout='soon' must be a whole number"),
        (
            f"amqp://guest:guest@{RABBITMQ_AT}/?auth=kerberos",
            "auth='kerberos' must be one of plain, external",
        ),
        (
            f"amqp://guest:guest@{RABBITMQ_AT}/?max_message_size=16MB",
            "max_message_size='16MB' must be a whole number from 1 to 536870912",
        ),
    ],
)
def test_a_transport_url_option_nobody_takes_is_one_line(url: str, said: str) -> None:
    """Redis: redis-py passed it to its connection, a TypeError ("internal error"); NATS and
    RabbitMQ: dropped without a word (or, for RabbitMQ, a value read as 0)."""
    from tests.services import NATS, RABBITMQ, REDIS, require

    require({"redis": REDIS, "nats": NATS, "amqp": RABBITMQ}[url.split(":")[0]])
    done = cli("queues", "declare", "q", "--transport", url)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert said in line, line


def test_a_run_that_fails_to_start_closes_what_it_opened(tmp_path: Path, monkeypatch: Any) -> None:
    """The delivery log is refused after the store and transport are open: both are closed (a
    store's thread and connection were left to the process's exit)."""
    import duetime.cli.run as run_command

    closed: list[str] = []
    real_store, real_transport = run_command.open_store, run_command.open_transport

    def closing(kind: str, opened: Any) -> Any:
        close = opened.close

        async def recorded() -> None:
            closed.append(kind)
            await close()

        opened.close = recorded
        return opened

    monkeypatch.setattr(run_command, "open_store", lambda *a, **k: closing("store", real_store(*a, **k)))
    monkeypatch.setattr(
        run_command, "open_transport", lambda *a, **k: closing("transport", real_transport(*a, **k))
    )
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert cli("setup", "--store", url).returncode == 0
    (tmp_path / "a-file").write_text("")
    result = runner.invoke(app, ["run", "--store", url, "--delivery-log", f"jsonl:{tmp_path / 'a-file'}"])
    assert result.exit_code == 1 and "Cannot keep the delivery log" in result.stderr, result.stderr
    assert sorted(closed) == ["store", "transport"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # MariaDB's client waited for ever for a greeting PostgreSQL never sends
        (["stats", "--store", f"mysql://root@{PG_AT}/test"], f"no answer from {PG_AT} within 5 s; is it a MariaDB or MySQL server"),
        # Redis read NATS's greeting as a protocol error: "internal error" with the server's bytes
        (["stats", "--store", f"redis://{NATS_AT}/0"], f"{NATS_AT} does not answer as Redis does"),
        (["queues", "declare", "q", "--transport", f"redis://{NATS_AT}/0"], "does not answer as Redis does"),
        # said "TimeoutError"
        (["queues", "declare", "q", "--transport", f"amqp://guest:guest@{REDIS_AT}/?connect_timeout=2"],
         f"no answer from {REDIS_AT} within 2 s; is it a RabbitMQ server"),
        (["queues", "declare", "q", "--transport", f"nats://{RABBITMQ_AT}"], f"no answer from {RABBITMQ_AT} within 5 s; is it a NATS server"),
    ],
)  # fmt: skip
def test_a_url_at_another_kind_of_server_is_one_line(args: list[str], said: str) -> None:
    from tests.services import MARIADB, NATS, POSTGRES, RABBITMQ, REDIS, require

    for service in (POSTGRES, NATS, REDIS, RABBITMQ, MARIADB):
        require(service)
    started = time.monotonic()
    done = cli(*args)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot connect to ") and said in line, line
    assert time.monotonic() - started < 20


@contextlib.contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """Files and folders nobody may change, root included (``chattr +i``): how a root test
    meets what a user meets with a file or folder another user owns."""
    subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


def test_a_sqlite_file_this_user_may_only_read_is_one_line_on_writes(tmp_path: Path) -> None:
    """It opened and read fine, then every write was "internal error (OperationalError: attempt
    to write a readonly database)"."""
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    assert cli("setup", "--store", url).returncode == 0
    assert cli("schedule", "orders", "x", "--in", "1h", "--id", "kept", "--store", url).returncode == 0
    with immutable(tmp_path / "ro.db"):
        listed = cli("list", "--store", url)  # reading is still fine
        assert listed.returncode == 0 and "kept" in listed.stdout, listed.stderr
        for args in (
            ["schedule", "orders", "x", "--in", "1h"],
            ["cancel", "kept"],
            ["reschedule", "kept", "--in", "2h"],
            ["setup"],
            ["run", "--burst"],
        ):
            done = cli(*args, "--store", url)
            assert done.returncode == 1, (args, done.stderr)
            [line] = done.stderr.strip().splitlines()
            assert line == (
                f"error: Cannot write the SQLite file {tmp_path / 'ro.db'} (attempt to write a readonly "
                "database); check that this user may write it and its folder (SQLite keeps -wal and -shm "
                "files beside it)."
            ), (args, line)
    assert "kept" in cli("list", "--store", url).stdout  # nothing lost


def test_a_delivery_log_folder_this_user_may_not_write_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert cli("setup", "--store", url).returncode == 0
    (tmp_path / "log").mkdir()
    with immutable(tmp_path / "log"):
        done = cli("run", "--burst", "--store", url, "--delivery-log", f"jsonl:{tmp_path / 'log'}")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: Cannot keep the delivery log in {tmp_path / 'log'}: this user may not write there; "
        "name a folder duetime can write to."
    )


@pytest.mark.parametrize("where", ["sqlite", "REDIS", "RABBITMQ"])
async def test_queues_receive_keeps_every_byte_of_a_body(tmp_path: Path, where: str) -> None:
    """A binary body was decoded with replacement characters and then acknowledged: 50,000,000
    random bytes came out as 47,366,564 characters, gone from the queue."""
    import base64

    from duetime import DelayedMessage, open_transport
    from tests import services

    url = f"sqlite:///{tmp_path / 'q.db'}"
    if where == "sqlite":
        assert cli("setup", "--store", url).returncode == 0
    else:
        url = getattr(services, where)
        services.require(url)
    queue = f"bytes.{os.getpid()}.{where.lower()}"
    binary = os.urandom(100_000) + b"\xff\xfe\x00"
    text = "héllo, wörld ✓".encode()
    transport = open_transport(url)
    await transport.start()
    try:
        await transport.declare(queue)
        sent = [DelayedMessage.create(queue, body, delay=0) for body in (binary, text, binary[:5000])]
        assert await transport.send_batch(sent) == [None, None, None]
    finally:
        await transport.close()
    done = await asyncio.to_thread(
        cli, "queues", "receive", queue, "--count", "2", "--wait", "2", "--transport", url
    )
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["encoding"] == "base64" and base64.b64decode(first["body"]) == binary
    assert second["encoding"] == "text" and second["body"].encode() == text
    raw = await asyncio.to_thread(
        subprocess.run,
        duetime_cmd("queues", "receive", queue, "--raw", "--wait", "2", "--transport", url),
        capture_output=True,
        timeout=60,
    )
    assert raw.returncode == 0 and raw.stdout == binary[:5000], raw.stderr
    refused = cli("queues", "receive", queue, "--raw", "--count", "3", "--transport", url)
    assert refused.returncode == 2 and "--raw writes one body alone" in refused.stderr


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_a_redis_that_may_evict_what_the_store_keeps_is_refused(tmp_path: Path, policy: str) -> None:
    """On a Redis with ``maxmemory 3mb`` and ``allkeys-lru``, 4,000 schedules answered OK and 773
    messages were left, the schema key evicted too. A private redis-server, never the shared one."""
    import redis

    with private_redis(tmp_path, "3mb", policy) as url:
        for args in (["setup"], ["check"], ["run", "--burst"], ["stats"]):
            done = cli(*args, "--store", url, *([] if args == ["setup"] else ["--transport", url]))
            assert done.returncode == 1, (args, done.stdout, done.stderr)
            [line] = done.stderr.strip().splitlines()
            assert f"maxmemory-policy {policy}" in line and "noeviction" in line, line
        client = redis.Redis.from_url(url)
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
        assert cli("setup", "--store", url).returncode == 0
        assert cli("check", "--store", url, "--transport", url).returncode == 0


def test_an_eviction_policy_switched_under_a_running_store_stops_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy switched while the store runs lost 4,000 acknowledged messages without a word: it
    was read once, at the start. Now it is read again while the store is used; the next store
    call fails with the reason (a dispatcher's store breaker trips on it and says why)."""
    import redis

    from duetime.backends.redis import store as redis_store

    monkeypatch.setattr(redis_store, "POLICY_CHECK_SECONDS", 0.2)
    with private_redis(tmp_path, "50mb", "noeviction") as url:
        store = redis_store.SyncRedisStore.from_url(url)
        store.setup_infrastructure("e")
        store.initialize("e", TransactionMode.AT_LEAST_ONCE)
        store.store(DelayedMessage.create("orders", b"kept", delay=timedelta(hours=1)))
        client = redis.Redis.from_url(url)
        client.config_set("maxmemory-policy", "allkeys-lru")
        time.sleep(0.3)
        for call in (
            lambda: store.store(DelayedMessage.create("orders", b"x", delay=timedelta(hours=1))),
            lambda: store.fetch_due(datetime.now(UTC), 10),
        ):
            with pytest.raises(ConfigurationError, match="maxmemory-policy allkeys-lru"):
                call()
        client.config_set("maxmemory-policy", "noeviction")
        store.store(DelayedMessage.create("orders", b"again", delay=timedelta(hours=1)))
        client.close()
        store.close()


async def test_the_front_door_acknowledges_nothing_a_redis_switched_to_evicting_may_drop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the policy looked at every 30 s, and 2,104 front-door messages acknowledged (gone from
    their queue) meanwhile into a store that then evicted them. The store is asked again, now,
    before each acknowledgement: with eviction switched on, nothing is acknowledged."""
    import redis

    from duetime import Dispatcher, FrontDoor
    from duetime.backends.redis import RedisStore
    from duetime.backends.redis import store as redis_store
    from duetime.backends.sqlite import SqliteQueueTransport, SyncSqliteQueue
    from duetime.nservicebus.frontdoor import envelope_headers

    monkeypatch.setattr(redis_store, "POLICY_CHECK_SECONDS", 3600.0)  # the store's own look: once
    with private_redis(tmp_path, "50mb", "noeviction") as url:
        queue_file = tmp_path / "door.db"
        sender = SyncSqliteQueue(queue_file)
        sender.declare("door.timeouts")
        store = RedisStore.from_url(url)
        receiver = SqliteQueueTransport(queue_file)
        dispatcher = Dispatcher(store, receiver, endpoint="door")
        await store.setup_infrastructure("door")
        await dispatcher.start()
        door = FrontDoor(dispatcher, receiver, wait=0.1)
        client = redis.Redis.from_url(url)
        client.config_set("maxmemory-policy", "allkeys-lru")  # just after the store's own look
        now = datetime.now(UTC)
        sender.send(
            [
                DelayedMessage(
                    f"f{i}", "door.timeouts", now, b"x", envelope_headers("orders", now + timedelta(hours=1))
                )
                for i in range(5)
            ]
        )
        working = asyncio.create_task(door.run())
        await asyncio.sleep(1.5)
        assert sender.depth("door.timeouts") == 5  # not acknowledged: received again once fixed
        client.config_set("maxmemory-policy", "noeviction")
        for _ in range(100):
            if sender.depth("door.timeouts") == 0:
                break
            await asyncio.sleep(0.1)
        assert sender.depth("door.timeouts") == 0 and door.stored >= 5
        dispatcher.stop()
        await asyncio.wait_for(working, 30)
        client.close()
        sender.close()
        await store.close()
        await receiver.close()


@contextlib.contextmanager
def private_redis(folder: Path, maxmemory: str, policy: str) -> Iterator[str]:
    """A redis-server of the test's own on a free port (never the shared one), with a memory
    limit and an eviction policy; its URL."""
    import shutil

    import redis

    from tests.services import free_port, until

    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed (Debian's redis-server package)")
    port = free_port()
    settings = {"port": str(port), "bind": "127.0.0.1", "save": "", "appendonly": "no", "dir": str(folder)}
    settings |= {"maxmemory": maxmemory, "maxmemory-policy": policy}
    process = subprocess.Popen(
        [server, *(part for name, value in settings.items() for part in (f"--{name}", value))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        until(lambda: _answers(client), 20, "the private redis-server")
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def _answers(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


def test_an_error_queue_shared_by_endpoints_belongs_to_each_for_its_own_failures(tmp_path: Path) -> None:
    """Endpoint A listed, retried and discarded B's failures, and `errors retry --endpoint A` moved
    B's message into A's store."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    for endpoint in ("a", "b"):
        assert cli("setup", "--store", url, "--endpoint", endpoint).returncode == 0
        done = cli(
            "schedule", "nowhere", f"from {endpoint}", "--in", "0", "--store", url, "--endpoint", endpoint
        )
        assert done.returncode == 0, done.stderr
        burst = cli("run", "--burst", "--store", url, "--endpoint", endpoint)
        assert burst.returncode == 0, burst.stderr

    def listed(endpoint: str) -> list[dict[str, Any]]:
        done = cli("errors", "list", "--json", "--store", url, "--endpoint", endpoint)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    a, b = listed("a"), listed("b")
    assert [m["headers"]["duetime-error-endpoint"] for m in a] == ["a"]
    assert [m["headers"]["duetime-error-endpoint"] for m in b] == ["b"]
    theirs = b[0]["id"]
    refused = cli("errors", "retry", theirs, "--store", url, "--endpoint", "a")
    assert refused.returncode == 1
    assert f"{theirs} failed in endpoint 'b', not 'a': give --endpoint b" in refused.stderr
    refused = cli("errors", "discard", theirs, "--yes", "--store", url, "--endpoint", "a")
    assert refused.returncode == 1 and "nothing was done" in refused.stderr
    assert cli("errors", "discard", "--all", "--yes", "--store", url, "--endpoint", "a").returncode == 0
    assert listed("a") == [] and [m["id"] for m in listed("b")] == [theirs]
    shown = cli("show", theirs, "--store", url, "--endpoint", "a")
    assert shown.returncode != 0  # never moved into A's store
    back = cli("errors", "retry", "--all", "--yes", "--in", "1h", "--store", url, "--endpoint", "b")
    assert back.returncode == 0 and "sent 1 back" in back.stdout, back.stderr
    assert cli("show", theirs, "--store", url, "--endpoint", "b").returncode == 0
    assert listed("b") == []


def test_a_full_disk_under_a_sqlite_store_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """It was "internal error (OperationalError: database or disk is full) … a duetime bug"."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a small tmpfs (as root): {mounted.stderr!r}")
    try:
        url = f"sqlite:///{folder / 'd.db'}"
        assert cli("setup", "--store", url).returncode == 0
        small = cli("schedule", "orders", "fits", "--in", "1h", "--store", url)
        assert small.returncode == 0, small.stderr
        body = tmp_path / "body.bin"
        body.write_bytes(os.urandom(300_000))
        done = cli("schedule", "orders", "--body-file", str(body), "--in", "1h", "--store", url)
        assert done.returncode == 1
        [line] = done.stderr.strip().splitlines()
        assert f"The disk holding the SQLite file {folder / 'd.db'} is full" in line, line
        assert "internal error" not in line and "bytes free" in line
        listed = cli("list", "--json", "--store", url)  # what was stored before is all there
        assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 1, listed.stderr
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_redis_out_of_memory_is_one_line(tmp_path: Path) -> None:
    with private_redis(tmp_path, "2mb", "noeviction") as url:
        assert cli("setup", "--store", url).returncode == 0
        body = tmp_path / "body.bin"
        body.write_bytes(os.urandom(600_000))
        said = ""
        for _ in range(10):
            done = cli("schedule", "orders", "--body-file", str(body), "--in", "1h", "--store", url)
            if done.returncode != 0:
                said = done.stderr
                break
        [line] = said.strip().splitlines()
        assert "is out of memory" in line and "maxmemory" in line and "internal error" not in line, line


def test_list_all_streams_page_by_page_and_show_caps_what_a_terminal_gets(tmp_path: Path) -> None:
    """`list --all` as a table gathered everything before printing (1M messages: past 300 s at
    2 GB, nothing printed); `show` of a message with 1M headers took 54 s and 4 GB."""
    from duetime import DelayedMessage, TransactionMode, open_sync_store

    url = f"sqlite:///{tmp_path / 'big.db'}"
    assert cli("setup", "--store", url).returncode == 0
    store = open_sync_store(url)
    store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    heavy = DelayedMessage.create(
        "orders",
        "é".encode() * 100_000,
        delay=timedelta(hours=1),
        headers={f"h{i:04}": "v" for i in range(300)},
    )
    store.store_many(
        [heavy, *(DelayedMessage.create("orders", b"x", delay=timedelta(hours=2)) for _ in range(4))]
    )
    store.close()
    listed = cli("list", "--all", "--limit", "2", "--store", url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("destination") == 3  # a table a page, printed as each page comes
    assert "5 shown" in listed.stdout
    shown = cli("show", heavy.message_id, "--store", url)
    assert shown.returncode == 0, shown.stderr
    assert '"h0199"' in shown.stdout and '"h0200"' not in shown.stdout
    assert "not shown: 100 more headers and 68,928 more bytes of the body" in " ".join(shown.stderr.split())
    whole = cli("show", heavy.message_id, "--json", "--store", url)
    row = json.loads(whole.stdout)
    assert len(row["headers"]) == 300 and row["body"].encode() == heavy.body


async def test_errors_list_looks_at_a_bounded_part_of_a_huge_error_queue_and_says_so(tmp_path: Path) -> None:
    """A listing read every message of the error queue (on a broker: read and put back) to find
    one endpoint's failures; it looks at the first 10,000 and says so."""
    from duetime import DelayedMessage, open_transport
    from duetime.error_headers import ERROR_ENDPOINT

    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert cli("setup", "--store", url).returncode == 0
    transport = open_transport(url)
    await transport.start()
    try:
        await transport.declare("error")
        failures = [
            DelayedMessage.create("error", b"", delay=0, headers={ERROR_ENDPOINT: "duetime"})
            for _ in range(10_003)
        ]
        assert await transport.send_batch(failures) == [None] * len(failures)
    finally:
        await transport.close()
    done = await asyncio.to_thread(cli, "errors", "list", "--limit", "3", "--store", url)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert (
        "3 shown of 10,000 failed in endpoint 'duetime' in error queue 'error' among the first 10,000 of its 10,003"
        in said
    )


def test_the_rabbitmq_max_message_size_option_is_the_limit_schedule_checks(tmp_path: Path) -> None:
    """``?max_message_size=`` (RabbitMQ 4 allows 16 MiB by default): a body over it is refused
    by `schedule` before it is stored."""
    from tests import services

    services.require(services.RABBITMQ)
    store = f"sqlite:///{tmp_path / 's.db'}"
    assert cli("setup", "--store", store).returncode == 0
    body = tmp_path / "body.bin"
    body.write_bytes(b"x" * 5000)
    url = services.RABBITMQ + ("&" if "?" in services.RABBITMQ else "?") + "max_message_size=4096"
    done = cli(
        "schedule", "orders", "--body-file", str(body), "--in", "1h", "--store", store, "--transport", url
    )
    assert done.returncode == 1
    assert "its body is 5,000 bytes, over the broker's max_message_size of 4,096" in " ".join(
        done.stderr.split()
    )
    assert cli("list", "--json", "--store", store).stdout == ""


def test_run_with_a_wrong_broker_password_never_says_it_is_dispatching(tmp_path: Path) -> None:
    """`run` printed "dispatching … Ctrl-C to stop" before failing on a wrong broker password: the
    line now waits for the store to answer and the transport to connect."""
    from tests.services import RABBITMQ, require

    require(RABBITMQ)
    wrong = RABBITMQ.replace("guest:guest@", "guest:wrong@")
    done = subprocess.run(
        duetime_cmd("run", "--transport", wrong), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert "dispatching" not in done.stderr and "ACCESS_REFUSED" in done.stderr, done.stderr


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never says a word: a dead server behind a proxy."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["stats", "--store", "postgresql://postgres@127.0.0.1:{port}/test"], "PostgreSQL"),
        (["stats", "--store", "mysql://root@127.0.0.1:{port}/test"], "MariaDB or MySQL"),
        (["stats", "--store", "redis://127.0.0.1:{port}/0"], "Redis"),
        (["queues", "declare", "q", "--transport", "amqp://guest:guest@127.0.0.1:{port}/?connect_timeout=2"], "RabbitMQ"),
        (["queues", "declare", "q", "--transport", "nats://127.0.0.1:{port}"], "NATS"),
    ],
)  # fmt: skip
def test_a_server_that_never_answers_is_the_same_line_for_every_kind(
    args: list[str], kind: str, silent_port: int
) -> None:
    """A dead PostgreSQL behind a proxy said "connection timeout expired", Redis "Timeout reading
    from socket", a deadline "(network partition or overload?)": one wording for all of them."""
    done = cli(*(arg.replace("{port}", str(silent_port)) for arg in args))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"no answer from 127.0.0.1:{silent_port}" in line and f"is it a {kind} server" in line, line


def test_hostile_lines_of_a_load_file_each_get_their_reason(seeded: str, tmp_path: Path) -> None:
    """A lone surrogate in a body or a header name (JSON allows "\\ud800"), and a line nested a
    hundred thousand levels deep, a number of 5,000 digits: each was an internal error; now each is its line's problem, the
    whole file is listed and nothing is stored. Headers over the size limit are such a problem too."""
    lines = [
        '{"destination": "orders", "body": "x\\ud800", "delay": "1h"}',
        '{"destination": "orders", "body": "ok", "delay": "1h", "headers": {"h\\udc80": "v"}}',
        '{"destination": "orders", "body": ' + "[" * 100_000 + "]" * 100_000 + ', "delay": "1h"}',
        '{"destination": "orders", "body": "fine", "delay": "1h"}',
        '{"destination": "orders", "delay": "1h", "headers": {'
        + ",".join(f'"h{i}":""' for i in range(50_000))
        + "}}",
        '{"destination": "orders", "body": "x", "delay": ' + "9" * 5000 + "}",
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = cli("list", "--json", "--store", seeded).stdout
    done = cli("load", str(path), "--store", seeded)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "duetime bug" not in done.stderr
    assert "line 1: body holds something that is not valid text" in done.stderr, done.stderr
    assert "line 2: header 'h\\udc80' holds something that is not valid text" in done.stderr, done.stderr
    assert "line 3: nested too deeply to read" in done.stderr, done.stderr
    assert "line 5: the headers are 588,891 bytes (as JSON); the limit is 262,144" in done.stderr, done.stderr
    assert "line 6: a number of 5,000 digits (at most 40)" in done.stderr, done.stderr
    assert cli("list", "--json", "--store", seeded).stdout == before  # nothing stored


@pytest.mark.parametrize("option", ["--store", "--transport"])
def test_a_url_with_an_ipv6_address_not_closed_is_one_line(seeded: str, option: str) -> None:
    url = "postgresql://u:Zqpw@[::1/db" if option == "--store" else "amqp://u:Zqpw@[::1/"
    done = cli("check", *(["--store", seeded] if option == "--transport" else []), option, url)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Invalid IPv6 URL" in said and "[::1]:5432" in said, said
    assert "duetime bug" not in said and "Zqpw" not in said and len(said.strip().splitlines()) == 1, said


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_a_database_user_short_of_a_privilege_is_told_which_in_one_line(backend: str) -> None:
    """Was "internal error … this is a duetime bug" with the SQL text, from every command."""
    from urllib.parse import urlsplit

    from tests.services import MARIADB, POSTGRES, mariadb_database, unique

    user, password = unique("dt_nopriv"), "Zq-nopriv-pw"
    if backend == "postgresql":
        import psycopg

        context: Any = postgres_schema()
    else:
        import pymysql

        context = mariadb_database()
    with context as url:
        assert cli("setup", "--store", url).returncode == 0
        parts = urlsplit(url)
        limited = parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}").geturl()
        if backend == "postgresql":
            admin: Any = psycopg.connect(POSTGRES, autocommit=True)
            admin.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
            drop = f"DROP OWNED BY {user}; DROP ROLE {user}"
        else:
            admin = pymysql.connect(
                host=parts.hostname,
                port=parts.port,
                user=urlsplit(MARIADB).username or "root",
                password=urlsplit(MARIADB).password or "",
                autocommit=True,
            )
            admin.cursor().execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'")
            admin.cursor().execute(
                f"GRANT SELECT ON `{parts.path.strip('/')}`.* TO '{user}'@'%'"
            )  # reads only
            drop = f"DROP USER '{user}'@'%'"
        try:
            schedule = ["schedule", "orders", "hi", "--in", "1h"]
            every = [["list"], ["stats"], schedule, ["run", "--burst"], ["setup"]]
            for args in every if backend == "postgresql" else [schedule, ["setup"]]:  # it may read
                done = cli(*args, "--store", limited)
                said = done.stdout + done.stderr
                assert done.returncode == 1 and len(said.strip().splitlines()) == 1, (args, said)
                assert "refused" in said and "Database privileges" in said, (args, said)
                assert "duetime bug" not in said and password not in said, (args, said)
        finally:
            for statement in drop.split("; "):
                if backend == "postgresql":
                    admin.execute(statement)
                else:
                    admin.cursor().execute(statement)
            admin.close()


def test_a_suggested_command_quotes_what_came_from_someone_else(tmp_path: Path) -> None:
    """`schedule`'s warning printed `duetime queues declare a b;$(x)`: pasted, a shell would run
    `x`. Each word is now quoted where it needs it; the command gives back the name whole."""
    import shlex

    store = f"sqlite:///{tmp_path}/q.db"
    assert cli("setup", "--store", store).returncode == 0
    name = "a b;$(touch pwned)`x`"
    done = cli("schedule", name, "hi", "--in", "1h", "--store", store)
    assert done.returncode == 0, done.stderr
    suggested = done.stderr.split("Declare it with `", 1)[1].rsplit("`", 1)[0]
    assert shlex.split(suggested) == ["duetime", "queues", "declare", name], suggested
