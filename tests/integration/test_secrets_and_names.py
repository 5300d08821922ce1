"""Passwords never appear in errors or logs; endpoint names with dots work and are quoted."""

from __future__ import annotations

import concurrent.futures
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime import DelayedMessage, DuetimeError, TransactionMode, open_store
from tests.conftest import run_cli
from tests.services import (
    MARIADB,
    MARIADB_AT,
    PG_AT,
    POSTGRES,
    RABBITMQ,
    REDIS_AT,
    mariadb_database,
    postgres_schema,
    require,
)

SECRET = "s3cret-pw-never-shown"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://nobody:{SECRET}@127.0.0.1:1/test?pool_timeout=1",
        f"mysql://nobody:{SECRET}@{MARIADB_AT}/test",
        f"postgresql://nobody:{SECRET}@127.0.0.1:1/test?schema=bad%20name",
        f"redis://:{SECRET}@127.0.0.1:1/0",
        f"redis://:{SECRET}@{REDIS_AT}/15?prefix=never-set-up:",  # answers: "no store at …"
    ],
)
def test_cli_errors_never_show_the_password(url: str) -> None:
    require(POSTGRES)
    require(MARIADB)
    result = run_cli("list", "--store", url, "--limit", "1", timeout=60)
    assert result.returncode != 0
    assert SECRET not in result.stdout + result.stderr


async def test_store_errors_and_logs_never_show_the_password(caplog: pytest.LogCaptureFixture) -> None:
    require(POSTGRES)
    caplog.set_level(logging.DEBUG)
    store = open_store(f"postgresql://nobody:{SECRET}@127.0.0.1:1/test?pool_timeout=1")
    with pytest.raises(Exception) as caught:
        await store.initialize("x", TransactionMode.AT_LEAST_ONCE)
    await store.close()
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert SECRET not in caplog.text
    assert SECRET not in repr(store.options)  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])
def test_endpoint_names_with_dots_are_quoted(backend: str) -> None:
    context = postgres_schema() if backend == "postgres" else mariadb_database()
    with context as url:
        from duetime import open_sync_store

        store = open_sync_store(url)
        store.setup_infrastructure("orders.timeouts")
        store.initialize("orders.timeouts", TransactionMode.AT_LEAST_ONCE)
        store.store(DelayedMessage("a", "orders", datetime.now(UTC) + timedelta(hours=1)))
        assert store.get("a") is not None
        store.close()
        with pytest.raises(DuetimeError, match="not allowed"):
            open_sync_store(url).setup_infrastructure('x"; DROP TABLE y; --')


@pytest.mark.parametrize("backend", ["postgres", "mariadb"])
def test_setup_from_several_processes_at_once(backend: str) -> None:
    import subprocess

    from tests.conftest import duetime_cmd

    context = postgres_schema() if backend == "postgres" else mariadb_database()
    with context as url:
        procs = [
            subprocess.Popen(
                duetime_cmd("setup", "--store", url, "--endpoint", "race"), stderr=subprocess.PIPE, text=True
            )
            for _ in range(4)
        ]
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""


def test_cli_on_postgres_end_to_end() -> None:
    import json

    with postgres_schema() as url:

        def cli(*args: str) -> str:
            result = run_cli(*args, "--store", url, timeout=60)
            assert result.returncode == 0, result.stderr
            return result.stdout

        cli("setup", "--queue", "orders")
        cli("schedule", "orders", "hello", "--in", "0s", "--id", "p1")
        cli("schedule", "typo", "lost", "--in", "0s", "--id", "p2")
        assert "forwarded 1, to the error queue 1" in cli("run", "--burst", "--mode", "exactly-once")
        received = [
            json.loads(line) for line in cli("queues", "receive", "orders", "--wait", "0.2").splitlines()
        ]
        assert [m["id"] for m in received] == ["p1"]
        assert json.loads(cli("errors", "list", "--json").splitlines()[0])["id"] == "p2"
        cli("errors", "retry", "p2", "--to", "orders")
        cli("run", "--burst")
        assert [
            json.loads(x)["id"] for x in cli("queues", "receive", "orders", "--wait", "0.2").splitlines()
        ] == ["p2"]
        stats = json.loads(cli("stats", "--json"))
        assert stats["stored"] == 0 and stats["queues"] == {"error": 0, "orders": 0}


def test_a_token_or_a_password_option_appears_in_no_output(tmp_path: Any) -> None:
    """A NATS token URL was printed whole by `run`'s start line, `schedule`'s warning, `check`,
    `stats --json` and the live-dispatchers table; a `?password=` by `check`; a URL a slash short
    whole in its error."""
    from tests.services import NATS

    require(NATS)
    require(POSTGRES)
    token = "tok3n-never-shown"
    nats = NATS.replace("nats://", f"nats://{token}@")
    store = f"sqlite:///{tmp_path}/s.db"
    outputs = []
    for args in (
        ["setup", "--store", store],
        ["schedule", "orders", "hello", "--in", "1h", "--store", store, "--transport", nats],
        ["check", "--store", store, "--transport", nats],
        ["run", "--burst", "--store", store, "--transport", nats],
        ["stats", "--json", "--store", store, "--transport", nats],
        ["stats", "--store", store, "--transport", nats],
        ["check", "--store", f"{POSTGRES}?password={SECRET}"],
        ["check", "--store", f"postgresql:/nobody:{SECRET}@127.0.0.1:1/test"],
        ["list", "--store", f"postgresql://nobody:{SECRET}@[::1/test"],
    ):
        done = run_cli(*args, timeout=60)
        outputs.append((args[0], done.returncode, done.stdout + done.stderr))
    for command, _, said in outputs:
        assert token not in said and SECRET not in said, (command, said)
        assert "Traceback" not in said, (command, said)
    assert outputs[2][1] == 0 and "***@" in outputs[2][2]  # check still names the server
    # the live-dispatchers table shows where a running dispatcher delivers: without the token
    import subprocess

    from tests.conftest import duetime_cmd
    from tests.services import until

    running = subprocess.Popen(
        duetime_cmd("run", "--store", store, "--transport", nats),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        shown = until(
            lambda: (lambda out: out if '"status": "live"' in out else None)(
                run_cli("stats", "--json", "--store", store, "--transport", nats).stdout
            ),
            30,
            "a live dispatcher in stats",
        )
        assert token not in shown and "***@" in shown, shown
        table = run_cli("stats", "--store", store, "--transport", nats).stdout
        assert token not in table, table
    finally:
        running.terminate()
        log, _ = running.communicate(timeout=30)
    assert token not in log and "***@" in log, log  # its start line


def _secret_forms() -> list[tuple[str, str, list[str]]]:
    """(option, URL, the secret's pieces) for every form a secret takes: separators in a password
    (drivers disagree where it ends), an option name percent-encoded, a keyword connection string,
    a URL with no scheme, MariaDB's ``pwd``, a transport's password."""
    host, port = PG_AT.rsplit(":", 1)
    return [
        (
            "--store",
            f"postgresql://postgres:Zqpw#ab12/cd34?ef56@{PG_AT}/test",
            ["Zqpw", "ab12", "cd34", "ef56"],
        ),
        ("--store", f"postgresql://postgres:Zqpw?secret55@{PG_AT}/test", ["Zqpw", "secret55"]),
        ("--store", f"postgresql://postgres@{PG_AT}/test?%70assword=ZqSecret1", ["ZqSecret1"]),
        ("--store", f"host={host} port={port} password=ZqSecret2 dbname=test", ["ZqSecret2"]),
        ("--store", f"postgresql//postgres:ZqSecret3@{PG_AT}/test", ["ZqSecret3"]),
        ("--store", f"mysql://root@{MARIADB_AT}/test?pwd=ZqSecret4", ["ZqSecret4"]),
        (
            "--transport",
            RABBITMQ.replace(":guest@", ":Zqab#cd12/ef34?gh56@"),
            ["Zqab", "cd12", "ef34", "gh56"],
        ),
    ]


@pytest.mark.parametrize("form", range(7))
def test_no_form_of_a_secret_reaches_any_output(form: int, tmp_path: Any) -> None:
    """Each command that shows a URL (its text and JSON, its log in both formats, its errors):
    whatever the form, no piece of the secret is printed, and nothing is an internal error."""
    require(POSTGRES)
    require(MARIADB)
    option, url, pieces = _secret_forms()[form]
    other = ["--store", f"sqlite:///{tmp_path}/s.db"] if option == "--transport" else []
    if other:
        run_cli("setup", *other)
    commands = (
        ["check"],
        ["list", "--limit", "1"],
        ["stats", "--json"],
        ["schedule", "orders", "hello", "--in", "1h"],
        ["run", "--burst"],
        ["run", "--burst", "--log-format", "json"],
    )
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:  # each waits on its own process
        done = list(pool.map(lambda args: run_cli(*args, option, url, *other, timeout=60), commands))
    said = [(args, result.stdout + result.stderr) for args, result in zip(commands, done, strict=True)]
    for args, text in said:
        assert not [piece for piece in pieces if piece in text], (args, text)
        assert "Traceback" not in text and "duetime bug" not in text, (args, text)


def test_the_dashboard_pages_show_no_form_of_a_secret() -> None:
    """The header names the store and the transport; an error page quotes a driver."""
    import subprocess
    import urllib.request

    from tests.conftest import duetime_cmd
    from tests.services import free_port, until

    require(POSTGRES)
    require(RABBITMQ)
    with postgres_schema() as url:
        assert run_cli("setup", "--store", url).returncode == 0
        store = f"{url}&%70assword=ZqDashSecret1"  # PostgreSQL here trusts: the password is unused
        transport = RABBITMQ.rstrip("/") + "/?sslkey=ZqDashSecret2"
        port = free_port()
        board = subprocess.Popen(
            duetime_cmd("dashboard", "--store", store, "--transport", transport, "--port", str(port)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def page(path: str) -> str | None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                        return str(answer.read().decode())
                except OSError:
                    return None

            pages = [
                until(lambda p=path: page(p), 30, path) for path in ("/", "/messages", "/errors", "/metrics")
            ]
        finally:
            board.terminate()
            _, log = board.communicate(timeout=30)
        for text in [*pages, log]:
            assert "ZqDashSecret" not in text, text
        assert "%70assword=***" in pages[0], pages[0]
