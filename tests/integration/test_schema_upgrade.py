"""A store set up by duetime before group keys (schema version 1) is refused with the command that
upgrades it, and `setup` upgrades it in place: every stored message stays, groups work after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, ListQuery, StoreNotReady, TransactionMode
from tests.conftest import sqlite_file
from tests.services import (
    REDIS,
    mariadb_connection,
    mariadb_database,
    postgres_database,
    postgres_schema,
    require,
    with_option,
)

pytestmark = pytest.mark.slow
ENDPOINT = "upgrade"


def _sqlite(tmp_path: Path) -> Iterator[tuple[Callable[[], Any], Callable[[], None]]]:
    from duetime.backends.sqlite import SyncSqliteStore

    path = tmp_path / "old.db"

    def downgrade() -> None:
        with sqlite_file(path) as conn:
            conn.execute('DROP INDEX "upgrade.delayed_group"')
            conn.execute('ALTER TABLE "upgrade.delayed" DROP COLUMN group_key')
            conn.execute("UPDATE duetime_schema SET version = 1")

    yield (lambda: SyncSqliteStore(path)), downgrade


def _postgres(tmp_path: Path) -> Iterator[tuple[Callable[[], Any], Callable[[], None]]]:
    import psycopg

    from duetime.backends.postgres import SyncPostgresStore

    with postgres_database() as database:  # its index builds wait for no other test's transactions
        url = with_option(database, schema="old")
        schema = "old"

        def downgrade() -> None:
            with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
                conn.execute(f'ALTER TABLE "{schema}"."upgrade.delayed" DROP COLUMN group_key')
                conn.execute(f'UPDATE "{schema}".duetime_schema SET version = 1')

        yield (lambda: SyncPostgresStore.from_url(url)), downgrade


def _mariadb(tmp_path: Path) -> Iterator[tuple[Callable[[], Any], Callable[[], None]]]:
    from duetime.backends.mysql import SyncMysqlStore

    with mariadb_database() as url:

        def downgrade() -> None:
            store = SyncMysqlStore.from_url(url)
            store._execute("ALTER TABLE `upgrade.delayed` DROP COLUMN group_key", ())
            store._execute("UPDATE duetime_schema SET version = 1", ())
            store.close()

        yield (lambda: SyncMysqlStore.from_url(url)), downgrade


def _redis(tmp_path: Path) -> Iterator[tuple[Callable[[], Any], Callable[[], None]]]:
    import redis

    from duetime.backends.redis import SyncRedisStore
    from tests.services import unique

    require(REDIS)
    prefix = unique("duetime-upgrade") + ":"
    client = redis.Redis.from_url(REDIS)

    def downgrade() -> None:
        client.set(f"{prefix}{ENDPOINT}:schema", 1)

    try:
        yield (lambda: SyncRedisStore.from_url(f"{REDIS}?prefix={prefix}")), downgrade
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture(params=[_sqlite, _postgres, _mariadb, _redis], ids=["sqlite", "postgres", "mariadb", "redis"])
def old_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Callable[[], Any], Callable[[], None]]]:
    yield from request.param(tmp_path)


def test_setup_upgrades_a_version_1_store_in_place(
    old_store: tuple[Callable[[], Any], Callable[[], None]],
) -> None:
    make, downgrade = old_store
    due = datetime.now(UTC) + timedelta(hours=1)
    first = make()
    first.setup_infrastructure(ENDPOINT)
    first.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    first.store(DelayedMessage("kept", "orders", due, b"old", {"k": "v"}))
    first.close()
    downgrade()
    store = make()
    with pytest.raises(StoreNotReady, match=r"older duetime \(schema version 1\).*duetime setup"):
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    store.setup_infrastructure(ENDPOINT)
    store.setup_infrastructure(ENDPOINT)  # idempotent after the upgrade
    store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    assert store.get("kept") == DelayedMessage("kept", "orders", due, b"old", {"k": "v"})
    store.store(DelayedMessage("new", "orders", due, b"new", group="saga-1"))
    assert [m.message_id for m in store.list(ListQuery(group="saga-1")).messages] == ["new"]
    assert store.cancel_group("saga-1") == 1
    assert store.get("kept") is not None
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb"])
def test_setup_changes_nothing_of_a_table_of_its_name_that_is_not_a_store(kind: str, tmp_path: Path) -> None:
    """Another program's table called like the store's: setup said so only after adding its
    group column (and, on MariaDB, failed on a key it could not build). Now one line, and the table
    is as it was."""
    from contextlib import ExitStack

    from tests.conftest import run_cli, sqlite_file

    with ExitStack() as stack:
        if kind == "sqlite":
            path = tmp_path / "theirs.db"
            url = f"sqlite:///{path}"
            with sqlite_file(path) as conn:
                conn.execute('CREATE TABLE "duetime.delayed" (id INTEGER, note TEXT)')

            def columns() -> set[str]:
                with sqlite_file(path) as conn:
                    return {r[1] for r in conn.execute("PRAGMA table_info('duetime.delayed')")}
        elif kind == "postgresql":
            import psycopg

            url = stack.enter_context(postgres_schema())
            base, schema = url.split("?")[0], url.split("schema=", 1)[1]
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                conn.execute(f'CREATE TABLE "{schema}"."duetime.delayed" (id integer, note text)')

            def columns() -> set[str]:
                with psycopg.connect(base) as conn:
                    rows = conn.execute(
                        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = 'duetime.delayed'",
                        [schema],
                    ).fetchall()
                return {r[0] for r in rows}
        else:
            url = stack.enter_context(mariadb_database())

            def mariadb(sql: str) -> list[Any]:
                conn = mariadb_connection(url)
                try:
                    with conn.cursor() as cur:
                        cur.execute(sql)
                        return list(cur.fetchall())
                finally:
                    conn.close()

            mariadb("CREATE TABLE `duetime.delayed` (id INT, note TEXT)")

            def columns() -> set[str]:
                return {r[0] for r in mariadb("SHOW COLUMNS FROM `duetime.delayed`")}

        done = run_cli("setup", "--store", url)
        said = done.stderr.strip()
        assert done.returncode == 1 and len(said.splitlines()) == 1, said
        assert "exists but is not a duetime store" in said and "give duetime another table" in said, said
        assert columns() == {"id", "note"}  # nothing added
