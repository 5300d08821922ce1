"""A local SparkSession shared by the bulk tests, and legacy tables to migrate from."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from duetime.bulk_interfaces import SqlDatabase
from duetime.registry import open_sql_database
from tests.services import require_java

try:
    import pyspark  # noqa: F401
except ModuleNotFoundError:  # a developer without the extra skips; CI must never pass by skipping
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("pip install 'duetime[spark]'", allow_module_level=True)


@pytest.fixture(scope="session", autouse=True)
def _java() -> None:
    """Every bulk test runs Spark, which needs Java: one line when it is missing, not a gateway error."""
    require_java()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from duetime.bulk.spark_session import spark_session

    session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@contextmanager
def spark_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """The shared session with ``settings`` for a while, then as it was (other tests share it)."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def timeout_rows(
    count: int, *, start: datetime | None = None, destination: str = "orders"
) -> list[tuple[Any, ...]]:
    """Rows in NServiceBus's TimeoutData layout, due from ``start`` on, one second apart."""
    base = (start or datetime.now(UTC) + timedelta(hours=1)).replace(tzinfo=None)
    return [
        (
            uuid.uuid4(),
            destination,
            uuid.uuid4(),
            f"state {i}".encode() + bytes([i % 256]),
            base + timedelta(seconds=i, microseconds=i),
            json.dumps({"NServiceBus.MessageId": str(i), "Ünïcode": "✓"}),
            "4.1.0",
        )
        for i in range(count)
    ]


def create_timeoutdata(url: str, table: str, rows: Sequence[tuple[Any, ...]]) -> SqlDatabase:
    db = open_sql_database(url + ("&" if "?" in url else "?") + f"layout=timeoutdata&table={table}")
    with db.session() as conn:
        db.ensure_schema(conn)
        db.execute(conn, db.query("create_timeoutdata", table=db.qualified(table)))
        if db.dialect == "mysql":
            rows = [(str(r[0]), r[1], None if r[2] is None else str(r[2]), *r[3:]) for r in rows]
        db.executemany(conn, f"INSERT INTO {db.qualified(table)} VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)
    return db


def create_msmq(url: str, table: str, rows: Sequence[tuple[Any, ...]]) -> SqlDatabase:
    db = open_sql_database(url + ("&" if "?" in url else "?") + f"layout=msmq&table={table}")
    with db.session() as conn:
        db.ensure_schema(conn)
        db.execute(conn, db.query("create_msmq", table=db.qualified(table)))
        db.executemany(conn, f"INSERT INTO {db.qualified(table)} VALUES (%s, %s, %s, %s, %s, %s)", rows)
    return db


def table_rows(db: SqlDatabase, table: str, order: str) -> list[tuple[Any, ...]]:
    with db.session() as conn:
        rows = db.execute(conn, f"SELECT * FROM {db.qualified(table)} ORDER BY {db.quote(order)}").fetchall()
    return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]


def count(db: SqlDatabase, table: str) -> int:
    with db.session() as conn:
        return int(db.execute(conn, f"SELECT COUNT(*) FROM {db.qualified(table)}").fetchone()[0])


def store_planner_rows(url: str, endpoint: str) -> float:
    """How many rows PostgreSQL's planner believes the endpoint's store table holds (-1: never
    analyzed): a table a bulk job filled from empty must not look empty to it."""
    from duetime.backends.postgres import SyncPostgresStore
    from duetime.backends.postgres.connection import planner_rows

    store = SyncPostgresStore.from_url(url)
    try:
        with store.pool.connection() as conn:
            return planner_rows(conn, store.names_for(endpoint).qualified) or 0.0
    finally:
        store.close()
