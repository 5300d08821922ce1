"""The receivers' deduplication helpers on the real Redis and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
import redis

from duetime.backends.postgres.dedup import PostgresDeduplicator
from duetime.backends.redis.dedup import RedisDeduplicator
from tests.services import REDIS, postgres_schema, require


def test_redis_deduplicator() -> None:
    require(REDIS)
    client = redis.Redis.from_url(REDIS)
    dedup = RedisDeduplicator(
        client, prefix=f"duetime-dedup-{uuid.uuid4().hex[:8]}:", ttl=timedelta(seconds=30)
    )
    assert dedup.first_time("m1") is True
    assert dedup.first_time("m1") is False
    assert dedup.first_time("m2") is True
    dedup.forget("m1")
    assert dedup.first_time("m1") is True
    assert 0 < client.ttl(dedup.prefix + "m1") <= 30
    client.delete(*client.keys(dedup.prefix + "*"))
    client.close()


def test_postgres_deduplicator_commits_with_the_work() -> None:
    with postgres_schema() as url:
        schema = url.split("schema=")[1]
        base = url.split("?")[0]
        dedup = PostgresDeduplicator(schema=schema)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            dedup.setup(conn)
            with pytest.raises(RuntimeError), conn.transaction():  # the work fails: the mark rolls back
                assert dedup.first_time(conn, "m1") is True
                raise RuntimeError("handler failed")
            with conn.transaction():
                assert dedup.first_time(conn, "m1") is True  # redelivery handled
            with conn.transaction():
                assert dedup.first_time(conn, "m1") is False  # and the next one skipped
            assert dedup.prune(conn, timedelta(0)) == 1
