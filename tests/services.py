"""The real servers and programs tests use (``scripts/services.py`` installs and starts them, and
says where through the ``DUETIME_TEST_*`` variables). One that does not answer, or is not
installed, skips the test on a developer's machine and fails it in CI (CI=true): CI must never
pass by skipping."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
MARIADB = os.environ.get("DUETIME_TEST_MARIADB", "mysql://root@127.0.0.1:3306/test")


def _missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message + " - python3 scripts/services.py installs and starts it")
    pytest.skip(message)


def require(url: str) -> None:
    """The test needs the server at ``url``: skip (fail in CI) when it does not answer."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=2).close()
    except OSError as error:
        _missing(f"{parts.scheme} at {parts.hostname}:{parts.port} does not answer ({error})")


def require_program(program: str, package: str) -> str:
    """The test runs ``program`` (from Debian's ``package``): its path, or skip (fail in CI)."""
    import shutil

    found = shutil.which(program)
    if found is None:
        _missing(f"{program} is not installed (Debian's {package} package)")
    return str(found)


def require_java() -> None:
    """Spark needs Java 17 or later on PATH (or JAVA_HOME)."""
    import re
    import subprocess

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        said = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        said = ""
    found = re.search(r'version "(\d+)', said)
    if not found or int(found.group(1)) < 17:
        _missing(
            "Java 17 or newer is not installed (Debian's default-jre-headless package), which Spark needs"
        )


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def with_option(url: str, **options: str) -> str:
    joiner = "&" if "?" in url else "?"
    return url + joiner + "&".join(f"{k}={v}" for k, v in options.items())


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A PostgreSQL URL bound to a fresh schema of this test's own, dropped afterwards."""
    import psycopg

    require(POSTGRES)
    schema = unique("t")
    try:
        yield with_option(POSTGRES, schema=schema)
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def postgres_database() -> Iterator[str]:
    """A PostgreSQL URL of a fresh database of this test's own, dropped afterwards.

    For tests that need VACUUM to reclaim what they delete: VACUUM keeps every row an open
    transaction of the same database might still see, and other tests' transactions run in the
    shared database at any moment (a schema of one's own does not help)."""
    import psycopg

    require(POSTGRES)
    name = unique("duetime_t")
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(POSTGRES)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def mariadb_connection(url: str, autocommit: bool = True) -> Any:
    """A PyMySQL connection to the database of ``url`` (a test's own, from :func:`mariadb_database`)."""
    import pymysql

    at = urlsplit(url)
    return pymysql.connect(
        host=at.hostname or "127.0.0.1",
        port=at.port or 3306,
        user=unquote(at.username or "root"),
        password=unquote(at.password or ""),
        database=at.path.lstrip("/"),
        autocommit=autocommit,
    )


@contextmanager
def mariadb_database() -> Iterator[str]:
    """A MariaDB URL of a fresh database of this test's own, dropped afterwards."""
    import pymysql

    require(MARIADB)
    parts = urlsplit(MARIADB)
    name = unique("duetime_t")

    def admin() -> pymysql.connections.Connection[pymysql.cursors.Cursor]:
        return pymysql.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            autocommit=True,
        )

    with admin() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with admin() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")


RABBITMQ = os.environ.get("DUETIME_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
REDIS = os.environ.get("DUETIME_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS = os.environ.get("DUETIME_TEST_NATS", "nats://127.0.0.1:4222")
MQTT = os.environ.get("DUETIME_TEST_MQTT", "mqtt://127.0.0.1:1883")


def host_port(url: str) -> str:
    """``127.0.0.1:5432`` of a server URL: for a test that writes its own URL to the same server
    (another database, a wrong password), wherever scripts/services.py put it."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


PG_AT = host_port(POSTGRES)
MARIADB_AT = host_port(MARIADB)
REDIS_AT = host_port(REDIS)
RABBITMQ_AT = host_port(RABBITMQ)
NATS_AT = host_port(NATS)


def free_port() -> int:
    """A TCP port nothing listens on right now (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    """Poll ``check`` every 0.2 s until it answers something true (returned), or fail naming ``what``."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what}")


def delete_redis_keys(prefix: str) -> None:
    """Remove what a test wrote to the shared Redis under ``prefix``."""
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@contextmanager
def store_url(kind: str, folder: Path) -> Iterator[str]:
    """A URL of a store of ``kind`` (sqlite, postgresql, mariadb, redis) of this test's own: a
    file in ``folder``, a schema, a database or a key prefix, removed afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'store.db'}"
    elif kind == "redis":
        require(REDIS)
        prefix = unique("store") + ":"
        try:
            yield with_option(REDIS, prefix=prefix)
        finally:
            delete_redis_keys(prefix)
    else:
        with postgres_schema() if kind == "postgresql" else mariadb_database() as url:
            yield url


def delete_rabbitmq_queues(*queues: str) -> None:
    """Remove queues a test declared on the shared RabbitMQ."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
    finally:
        connection.close()


def shown(url: str) -> str:
    """``url`` as a command given it prints it: redacted, and every secret of it scrubbed from
    the rest (a password that is also the user name, as RabbitMQ's ``guest:guest``, hides both)."""
    from duetime.inputs.urls import redact, secrets_in

    text = redact(url)
    for secret in sorted(secrets_in(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


TYPESCRIPT = Path(__file__).parent / "clients" / "typescript"


def typescript_tools() -> Path:
    """The ``node_modules`` of ``tests/clients/typescript`` (openapi-typescript, openapi-fetch,
    TypeScript, tsx), installed from its lock file once per lock file into /var/tmp: Node 20 and
    npm's registry are all it needs."""
    import hashlib
    import shutil
    import subprocess

    require_program("npm", "npm")
    lock = (TYPESCRIPT / "package-lock.json").read_bytes()
    home = Path("/var/tmp") / f"duetime-npm-{hashlib.sha256(lock).hexdigest()[:12]}"
    modules = home / "node_modules"
    if not (modules / ".bin" / "tsx").exists():
        work = Path(f"{home}.{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(TYPESCRIPT / name, work / name)
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=work, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            _missing(f"npm ci of tests/clients/typescript failed: {done.stderr.strip()[-500:]}")
        try:
            work.rename(home)
        except OSError:  # another worker finished first: theirs is as good
            shutil.rmtree(work, ignore_errors=True)
    return modules
