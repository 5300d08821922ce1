"""Encryption at rest against the real parts: what the database files and a PostgreSQL dump hold,
what `duetime run` delivers (exactly-once into the store's own queue, at-least-once to RabbitMQ),
a tampered row and a missing key on their way to the error queue, and a key rotation of a busy
PostgreSQL store with a kill -9 half-way, while a dispatcher delivers."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime.encryption import KEY_HEADER, Keyring, sealer_from_environment
from duetime.interfaces import SyncSealingStore
from duetime.message import DelayedMessage
from duetime.registry import open_sync_store
from duetime.settings import DEFAULT_ENDPOINT, TransactionMode
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.services import RABBITMQ, delete_rabbitmq_queues, store_url, unique

SECRET = b"SECRET-PAYLOAD"


def ok(*args: str, timeout: float = 120) -> str:
    done = run_cli(*args, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def keyring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A keyring made by the command, named for this test and every process it starts."""
    path = tmp_path / "keys.json"
    ok("keys", "new", str(path), "--id", "first")
    monkeypatch.setenv("DUETIME_ENCRYPTION_KEYS", str(path))
    return path


def secret_messages(count: int, due: datetime, prefix: str = "m") -> list[DelayedMessage]:
    """Messages whose bodies and header values hold SECRET, binary bytes among them."""
    return [
        DelayedMessage(
            f"{prefix}-{i:05d}",
            "orders",
            due,
            SECRET + f"-{i}".encode() + bytes([0, 255, i % 256]),
            {"card": f"SECRET-CARD-{i}", "duetime-note": "readable"},
        )
        for i in range(count)
    ]


def store_all(url: str, messages: list[DelayedMessage]) -> None:
    store = open_sync_store(url)
    try:
        store.initialize(DEFAULT_ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        for i in range(0, len(messages), 1000):
            store.store_many(messages[i : i + 1000])
    finally:
        store.close()


def at_rest(kind: str, url: str, folder: Path) -> bytes:
    """Everything the store's database holds, as bytes: the SQLite files, or a PostgreSQL dump of
    the test's schema (bytea and json as the dump writes them)."""
    if kind == "sqlite":
        return b"".join(p.read_bytes() for p in folder.glob("store.db*"))
    schema = url.rsplit("schema=", 1)[-1].split("&")[0]
    dump = subprocess.run(
        [shutil.which("pg_dump") or "pg_dump", "--schema", schema, url.split("?")[0]],
        capture_output=True,
        check=True,
    )
    return dump.stdout


def holds_secret(data: bytes) -> bool:
    """Whether ``data`` holds the secret as text, as hex (a dump's bytea) or in base64."""
    return any(
        form in data
        for form in (SECRET, b"SECRET-CARD", SECRET.hex().encode(), base64.b64encode(SECRET)[:16])
    )


def sent_headers(line: dict[str, object]) -> dict[str, str]:
    """A received message's headers without the due time duetime adds on its way out."""
    headers = line["headers"]
    assert isinstance(headers, dict)
    return {k: v for k, v in headers.items() if k != "duetime-due-at"}


def received(*args: str, count: int) -> list[dict[str, object]]:
    out = ok("queues", "receive", *args, "--count", str(count), "--wait", "60")
    return [json.loads(line) for line in out.splitlines()]


@contextmanager
def dispatcher(folder: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    log = folder / f"run-{time.monotonic_ns()}.log"
    run = spawn_run(duetime_cmd("run", *args), log)
    try:
        wait_until_serving(log)
        yield run
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_nothing_at_rest_is_plaintext_and_the_exactly_once_move_delivers_exact_bytes(
    kind: str, keyring: Path, tmp_path: Path
) -> None:
    """The store's rows and its own queue's rows hold no plaintext (the file, the WAL, a dump);
    the consumer gets every byte as sent; a row changed at rest reaches the consumer as what it
    is (a problem naming the key), never as garbled plaintext."""
    if kind == "postgresql" and shutil.which("pg_dump") is None:
        pytest.fail("pg_dump is missing (Debian's postgresql-client)")
    with store_url(kind, tmp_path) as url:
        ok("setup", "--store", url)
        ok("queues", "declare", "orders", "--store", url)
        due = datetime.now(UTC) + timedelta(seconds=4)
        sent = secret_messages(50, due)
        store_all(url, sent)
        tamper(kind, url, tmp_path, "m-00007")
        assert not holds_secret(at_rest(kind, url, tmp_path))
        with dispatcher(tmp_path, "--store", url):
            got = received("orders", "--store", url, count=50)
        assert not holds_secret(at_rest(kind, url, tmp_path))  # nothing was left behind in plaintext
    by_id = {line["id"]: line for line in got}
    assert sorted(by_id) == [m.message_id for m in sent]
    for m in sent:
        line = by_id[m.message_id]
        if m.message_id == "m-00007":
            assert "does not authenticate" in str(line["problem"]) and KEY_HEADER in line["headers"]  # type: ignore[operator]
            continue
        assert "problem" not in line and line["encoding"] == "base64"
        assert base64.b64decode(str(line["body"])) == m.body
        assert sent_headers(line) == dict(m.headers)


def flipped(body: bytes) -> bytes:
    """``body`` with one bit of its last byte changed."""
    return bytes(body[:-1]) + bytes([body[-1] ^ 1])


def tamper(kind: str, url: str, folder: Path, message_id: str) -> None:
    """Change one byte of a stored body, as someone with write access to the database would."""
    if kind == "sqlite":
        from tests.conftest import sqlite_file

        with sqlite_file(folder / "store.db") as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
                if {"claim_token", "body"} <= columns:
                    row = conn.execute(
                        f'SELECT body FROM "{table}" WHERE message_id = ?', (message_id,)
                    ).fetchone()
                    if row is not None:
                        changed = flipped(row[0])
                        conn.execute(
                            f'UPDATE "{table}" SET body = ? WHERE message_id = ?', (changed, message_id)
                        )
                        return
        raise AssertionError(f"no stored {message_id}")
    import psycopg

    schema = url.rsplit("schema=", 1)[-1].split("&")[0]
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = %s AND column_name = 'claim_token'",
            (schema,),
        ).fetchall()
        for (table,) in tables:
            row = conn.execute(
                f'SELECT body FROM "{schema}"."{table}" WHERE message_id = %s', (message_id,)
            ).fetchone()
            if row is not None:
                changed = flipped(row[0])
                conn.execute(
                    f'UPDATE "{schema}"."{table}" SET body = %s WHERE message_id = %s', (changed, message_id)
                )
                return
    raise AssertionError(f"no stored {message_id}")


def test_at_least_once_delivers_plaintext_and_what_does_not_open_goes_to_the_error_queue_with_why(
    keyring: Path, tmp_path: Path
) -> None:
    """PostgreSQL to RabbitMQ: the broker gets plaintext byte for byte; a tampered row and one
    sealed with a key this keyring lacks go to the error queue still sealed, each with the reason,
    and nothing else is held up."""
    destination, errors = unique("enc_orders"), unique("enc_error")
    try:
        with store_url("postgresql", tmp_path) as url:
            ok("setup", "--store", url)
            ok("queues", "declare", destination, errors, "--transport", RABBITMQ)
            due = datetime.now(UTC) + timedelta(seconds=3)
            sent = [m.with_changes(destination=destination) for m in secret_messages(40, due)]
            store_all(url, sent)
            tamper("postgresql", url, tmp_path, "m-00003")
            other = tmp_path / "other.json"
            Keyring.new("elsewhere").write(other)
            os.environ["DUETIME_ENCRYPTION_KEYS"] = str(other)  # a producer with another keyring
            try:
                store_all(
                    url, [DelayedMessage("lost-key", destination, due, SECRET, {"card": "SECRET-CARD"})]
                )
            finally:
                os.environ["DUETIME_ENCRYPTION_KEYS"] = str(keyring)
            env = ("--transport", RABBITMQ, "--error-queue", errors)
            with dispatcher(tmp_path, "--store", url, *env):
                got = received(destination, "--transport", RABBITMQ, count=39)
                failed = received(errors, "--transport", RABBITMQ, count=2)
    finally:
        delete_rabbitmq_queues(destination, errors)
    assert sorted(line["id"] for line in got) == [m.message_id for m in sent if m.message_id != "m-00003"]
    for line in got:
        m = next(x for x in sent if x.message_id == line["id"])
        assert base64.b64decode(str(line["body"])) == m.body and sent_headers(line) == dict(m.headers)
    why = {str(line["id"]): line["headers"]["duetime-error-message"] for line in failed}  # type: ignore[index]
    assert set(why) == {"m-00003", "lost-key"}
    assert "does not authenticate" in why["m-00003"]
    assert "'elsewhere', which the keyring does not hold" in why["lost-key"]
    for line in failed:
        assert KEY_HEADER in line["headers"] and not holds_secret(base64.b64decode(str(line["body"])))  # type: ignore[operator]


#: The rotation case: messages waiting an hour (rotated while nothing touches them) and messages
#: falling due while the rotation runs (a dispatcher claims and moves them meanwhile).
WAITING = int(os.environ.get("DUETIME_ROTATE_SIZE", "20000"))
FALLING_DUE = 2000


def test_a_rotation_of_a_busy_store_killed_half_way_loses_nothing_and_leaves_every_message_readable(
    keyring: Path, tmp_path: Path
) -> None:
    with store_url("postgresql", tmp_path) as url:
        ok("setup", "--store", url)
        ok("queues", "declare", "orders", "--store", url)
        now = datetime.now(UTC)
        waiting = secret_messages(WAITING, now + timedelta(hours=1), "w")
        falling = [
            m.with_changes(due_at=now + timedelta(seconds=5 + 20 * i / FALLING_DUE))
            for i, m in enumerate(secret_messages(FALLING_DUE, now, "d"))
        ]
        store_all(url, waiting + falling)
        ok("keys", "new", str(keyring), "--id", "second")
        with dispatcher(tmp_path, "--store", url):
            rotating = subprocess.Popen(
                duetime_cmd("keys", "rotate", "--store", url, "--batch", "200"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            time.sleep(4)
            rotating.send_signal(signal.SIGKILL)
            rotating.wait(10)
            out = ok("keys", "rotate", "--store", url, timeout=max(600, WAITING / 200))
            assert "sealed again" in out
            counts = Counter[str]()
            for line in ok("keys", "list", "--count", "--store", url, "--json").splitlines():
                item = json.loads(line)
                counts[item["id"]] = item["messages"]
            # what a dispatcher held at the moment is left for the next run; the rest is rotated
            assert counts["second"] >= WAITING and counts["second"] + counts["first"] <= WAITING + FALLING_DUE
            got = received("orders", "--store", url, count=FALLING_DUE)
        store = open_sync_store(url)
        try:
            store.initialize(DEFAULT_ENDPOINT, TransactionMode.AT_LEAST_ONCE)
            assert isinstance(store, SyncSealingStore)
            left = Counter[str]()
            after = None
            while True:
                step = store.reseal(after, 1000, look_only=True)
                left.update(step.by_key)
                if step.after is None:
                    break
                after = step.after
            assert dict(left) == {"second": WAITING}
            for m in waiting[:: max(1, WAITING // 200)]:
                assert store.get(m.message_id) == m
        finally:
            store.close()
    ids = [line["id"] for line in got]
    assert len(ids) == len(set(ids)) == FALLING_DUE and "problem" not in str(got)
    for line in got:
        i = int(str(line["id"]).split("-")[1])
        assert base64.b64decode(str(line["body"])) == falling[i].body


def test_the_keys_commands_teach_and_refuse_in_one_line(keyring: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ok("setup", "--store", url)
    for args, said in [
        (("keys", "retire", "first"), "primary"),
        (("keys", "use", "nope"), "no key 'nope'"),
        (("keys", "new", str(keyring), "--id", "first"), "has a key 'first' already"),
        (("keys", "new", str(keyring), "--id", "bad id!"), "letters, digits"),
        (("keys", "list", str(tmp_path / "missing.json")), "does not exist; make one with"),
    ]:
        done = run_cli(*args, "--store", url) if args[1] == "retire" else run_cli(*args)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, (
            args,
            done.stderr,
        )
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = run_cli("keys", "rotate", "--store", url, env={"DUETIME_ENCRYPTION_KEYS": ""})
    assert (
        done.returncode != 0
        and "set DUETIME_ENCRYPTION_KEYS" in done.stderr
        and "Traceback" not in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    (tmp_path / "broken.json").write_text("{not json")
    done = run_cli("keys", "list", str(tmp_path / "broken.json"))
    assert done.returncode != 0 and "not a keyring (not JSON)" in done.stderr
    ok("schedule", "orders", "SECRET", "--in", "1h", "--id", "x", "--store", url)
    ok("keys", "new", str(keyring), "--id", "second", "--standby")
    assert (
        json.loads(ok("keys", "list", "--json").splitlines()[0])["primary"] is True
    )  # first is still primary
    ok("keys", "use", "second")
    done = run_cli("keys", "retire", "first", "--store", url)
    assert done.returncode != 0 and "1 stored messages or schedules are sealed with first" in done.stderr
    ok("keys", "rotate", "--store", url)
    ok("keys", "retire", "first", "--store", url)
    assert json.loads(ok("show", "x", "--json", "--store", url))["body"] == "SECRET"
    done = run_cli("show", "x", "--store", url, env={"DUETIME_ENCRYPTION_KEYS": ""})
    assert done.returncode == 0 and "encrypted with key second" in done.stderr and "SECRET" not in done.stdout
    assert (keyring.stat().st_mode & 0o777) == 0o600


def test_a_sealed_route_delivers_sealed_bytes_the_consumer_opens_exactly(
    keyring: Path, tmp_path: Path
) -> None:
    """`--route 'X=sealed:amqp://…'`: that route's messages reach RabbitMQ sealed (the broker holds
    no plaintext) and open with the keyring to the bytes sent; the default route delivers plaintext."""
    sealed_q, plain_q = unique("enc_sealed"), unique("enc_plain")
    try:
        with store_url("postgresql", tmp_path) as url:
            ok("setup", "--store", url)
            ok("queues", "declare", sealed_q, plain_q, "--transport", RABBITMQ)
            due = datetime.now(UTC) + timedelta(seconds=2)
            sent = [m.with_changes(destination=sealed_q) for m in secret_messages(10, due, "s")]
            sent += [m.with_changes(destination=plain_q) for m in secret_messages(5, due, "p")]
            store_all(url, sent)
            route = f"{sealed_q}=sealed:{RABBITMQ}"
            with dispatcher(tmp_path, "--store", url, "--transport", RABBITMQ, "--route", route):
                sealed = received(sealed_q, "--transport", RABBITMQ, count=10)
                plain = received(plain_q, "--transport", RABBITMQ, count=5)
    finally:
        delete_rabbitmq_queues(sealed_q, plain_q)
    sealer = sealer_from_environment()
    assert sealer is not None
    by_id = {m.message_id: m for m in sent}
    for line in sealed:
        body, headers = base64.b64decode(str(line["body"])), sent_headers(line)
        assert headers[KEY_HEADER].startswith("first ") and not holds_secret(body)
        assert not any("SECRET" in v for v in headers.values())
        m = by_id[str(line["id"])]
        assert sealer.open_parts(m.message_id, sealed_q, body, headers) == (m.body, dict(m.headers))
    for line in plain:
        m = by_id[str(line["id"])]
        assert base64.b64decode(str(line["body"])) == m.body and sent_headers(line) == dict(m.headers)
