"""The bulk contract (``duetime.testing.bulk_contract``) on every store bulk jobs write, each
opened through the registry as bulk opens it; and the stores without a bulk writer (the memory
store, a store of one's own such as the ``dbm`` example) refused by name, in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from duetime.bulk_interfaces import KeyedBulkRows, SqlDatabase
from duetime.errors import ConfigurationError
from duetime.interfaces import SyncDelayedMessageStore
from duetime.registry import SQL_DATABASES, open_keyed_bulk_rows, open_sql_database, open_sync_store
from duetime.testing.bulk_contract import KeyedBulkContract, SqlBulkContract
from tests.services import store_url


class _SqlStore(SqlBulkContract):
    kind = ""

    @pytest.fixture
    def url(self, tmp_path: Path) -> Iterator[str]:
        with store_url(self.kind, tmp_path) as url:
            yield url

    @pytest.fixture
    def database(self, url: str) -> SqlDatabase:
        return open_sql_database(url)

    @pytest.fixture
    def store(self, url: str) -> Iterator[SyncDelayedMessageStore]:
        store = open_sync_store(url)
        yield store
        store.close()


class TestSqliteBulk(_SqlStore):
    kind = "sqlite"


class TestPostgresBulk(_SqlStore):
    kind = "postgresql"


class TestMariaDbBulk(_SqlStore):
    kind = "mariadb"


class TestRedisBulk(KeyedBulkContract):
    @pytest.fixture
    def url(self, tmp_path: Path) -> Iterator[str]:
        with store_url("redis", tmp_path) as url:
            yield url

    @pytest.fixture
    def rows(self, url: str) -> KeyedBulkRows:
        return open_keyed_bulk_rows(url)

    @pytest.fixture
    def store(self, url: str) -> Iterator[SyncDelayedMessageStore]:
        store = open_sync_store(url)
        yield store
        store.close()


@pytest.mark.parametrize(
    "url", ["memory://", "dbm:///tmp/delayed.dbm", "redis://127.0.0.1/0", "mongodb://h/db"]
)
def test_a_url_that_is_no_sql_database_is_refused_by_name(url: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_sql_database(url)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(url.split("/")[0])  # the URL it was given, never a guess
    assert "sqlite" not in SQL_DATABASES.get(url.partition(":")[0], "")


@pytest.mark.parametrize("url", ["memory://", "dbm:///tmp/delayed.dbm"])
def test_bulk_says_in_one_line_that_a_store_without_a_bulk_writer_is_not_written(url: str) -> None:
    from duetime.bulk.targets import open_store_target, open_target

    for opening in (open_target, open_store_target):
        with pytest.raises(ConfigurationError) as caught:
            opening(url)
        assert "\n" not in str(caught.value)
        assert "is not a store bulk jobs can write into" in str(caught.value)
