"""The store contract on every store that needs no server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from duetime import TransactionMode
from duetime.backends.memory import MemoryStore
from duetime.backends.sqlite import SqliteStore, SyncSqliteStore
from duetime.testing.store_contract import ENDPOINT, StoreContract, msg, now
from tests.services import mariadb_database, postgres_schema


class TestMemoryStore(StoreContract):
    next_due_in_claim = True

    @pytest.fixture
    def shared(self) -> MemoryStore:
        return MemoryStore()

    @pytest.fixture
    def make_store(self, shared: MemoryStore) -> Callable[[], MemoryStore]:
        return lambda: shared

    @pytest.fixture
    def make_sync_store(self, shared: MemoryStore) -> Callable[[], object]:
        return lambda: shared.sync


class TestSqliteStore(StoreContract):
    next_due_in_claim = True

    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/store.db"

    @pytest.fixture
    def make_store(self, url: str) -> Callable[[], SqliteStore]:
        return lambda: SqliteStore.from_url(url)

    @pytest.fixture
    def make_sync_store(self, url: str) -> Callable[[], SyncSqliteStore]:
        return lambda: SyncSqliteStore.from_url(url)


class TestPostgresStore(StoreContract):
    next_due_in_claim = True

    @pytest.fixture
    def url(self) -> Iterator[str]:
        with postgres_schema() as url:
            yield url

    @pytest.fixture
    def make_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.postgres import PostgresStore

        return lambda: PostgresStore.from_url(url)

    @pytest.fixture
    def make_sync_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.postgres import SyncPostgresStore

        return lambda: SyncPostgresStore.from_url(url)

    async def test_claim_expires_after_claim_timeout(self, store: object) -> None:  # type: ignore[override]
        """Lock claims (the default) end with their transaction: when the claimer settles, dies,
        or sits on them past the claim time (the server ends its session). Shown in real time
        with a 1 s claim time; the lease form of this test runs in TestPostgresLeaseStore."""
        from duetime.backends.postgres import SyncPostgresStore

        del store
        with postgres_schema() as url:
            holder = SyncPostgresStore.from_url(url + "&claim_timeout=1")
            other = SyncPostgresStore.from_url(url + "&claim_timeout=1")
            try:
                holder.setup_infrastructure(ENDPOINT)
                for s in (holder, other):
                    s.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
                t = now()
                holder.store(msg(1, t))
                assert [m.message_id for m in holder.fetch_due(t, 10)] == ["m-00001"]
                assert other.fetch_due(now(), 10) == []  # held: skipped, not waited for
                time.sleep(1.5)  # the holder froze: the server ends its session after the claim time
                assert [m.message_id for m in other.fetch_due(now(), 10)] == ["m-00001"]
            finally:
                other.close()
                holder.close()

    async def test_a_claim_that_takes_a_lapsed_lease_reads_no_lapsed_time(  # type: ignore[override]
        self, store: object
    ) -> None:
        """Lock claims have no lease to lapse (TestPostgresLeaseStore runs the lease form): a
        batch this store still holds is left out of the next due time read with a later claim,
        which counts it from when it would be freed, as next_due does."""
        from duetime.interfaces import ClaimsWithNextDue
        from duetime.testing.store_contract import SyncSide

        # SyncSide supplies the calls through __getattr__, which isinstance() against a Protocol
        # does not see since Python 3.12
        assert isinstance(store, (ClaimsWithNextDue, SyncSide))
        t = now()
        later = t + timedelta(minutes=5)
        await store.store_many([msg(1, t), msg(2, later)])  # type: ignore[attr-defined]
        assert len(await store.fetch_due(t, 10)) == 1  # type: ignore[attr-defined]
        claimed = await store.fetch_due_and_next(t, 10)
        assert claimed.messages == [] and claimed.next_due is not None and claimed.next_due.at is not None
        asked = await store.next_due()  # type: ignore[attr-defined]
        assert asked is not None and t < claimed.next_due.at < later
        assert abs((claimed.next_due.at - asked).total_seconds()) < 1


class TestPostgresLeaseStore(TestPostgresStore):
    """The same contract with ``claims=lease``: the lease column instead of held row locks."""

    @pytest.fixture
    def url(self) -> Iterator[str]:
        with postgres_schema() as url:
            yield url + "&claims=lease"

    test_claim_expires_after_claim_timeout = StoreContract.test_claim_expires_after_claim_timeout
    test_a_claim_that_takes_a_lapsed_lease_reads_no_lapsed_time = (
        StoreContract.test_a_claim_that_takes_a_lapsed_lease_reads_no_lapsed_time
    )


class TestMariadbStore(StoreContract):
    next_due_in_claim = True

    @pytest.fixture
    def url(self) -> Iterator[str]:
        with mariadb_database() as url:
            yield url

    @pytest.fixture
    def make_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.mysql import MysqlStore

        return lambda: MysqlStore.from_url(url)

    @pytest.fixture
    def make_sync_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.mysql import SyncMysqlStore

        return lambda: SyncMysqlStore.from_url(url)


class TestRedisStore(StoreContract):
    next_due_in_claim = True

    @pytest.fixture
    def url(self) -> Iterator[str]:
        import uuid

        import redis

        from tests.services import REDIS, require

        require(REDIS)
        prefix = f"duetime-store-{uuid.uuid4().hex[:8]}:"
        yield f"{REDIS}?prefix={prefix}"
        client = redis.Redis.from_url(REDIS)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()

    @pytest.fixture
    def make_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.redis import RedisStore

        return lambda: RedisStore.from_url(url)

    @pytest.fixture
    def make_sync_store(self, url: str) -> Callable[[], object]:
        from duetime.backends.redis import SyncRedisStore

        return lambda: SyncRedisStore.from_url(url)

    @pytest.mark.parametrize("whole", [10_000, 1], ids=["members-read-whole", "due-times-walked"])
    def test_a_group_lists_alike_read_whole_or_walked(
        self, url: str, whole: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A small group is listed from its members, a large one by walking the due times and
        asking Redis which are members: both give the same pages, filters and cursors."""
        from duetime import ListQuery
        from duetime.backends.redis import SyncRedisStore
        from duetime.backends.redis import store as redis_store

        monkeypatch.setattr(redis_store, "GROUP_READ_WHOLE", whole)
        store = SyncRedisStore.from_url(url)
        try:
            store.setup_infrastructure(ENDPOINT)
            store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
            t = now() + timedelta(hours=1)
            group = 'saga: "a" \\ b'
            store.store_many(
                [
                    msg(i, t + timedelta(seconds=i), "a" if i % 3 else "b", group=group if i % 2 else None)
                    for i in range(40)
                ]
            )
            seen, after = [], None
            while True:
                page = store.list(ListQuery(group=group, limit=7, after=after))
                seen += [m.message_id for m in page.messages]
                if page.next_cursor is None:
                    break
                after = page.next_cursor
            assert seen == [f"m-{i:05d}" for i in range(1, 40, 2)]
            window = ListQuery(group=group, destination="b", due_after=t + timedelta(seconds=10), limit=100)
            assert [m.message_id for m in store.list(window).messages] == [
                "m-00015",
                "m-00021",
                "m-00027",
                "m-00033",
                "m-00039",
            ]
            assert store.list(ListQuery(group="nobody", limit=10)).messages == []
        finally:
            store.close()

    def test_a_batch_settles_in_one_call(self, url: str) -> None:
        """Removing or releasing a dispatcher's batch is one script call, not one a message (a
        burst of 20,000 made 20,000 round trips to settle)."""
        from duetime.backends.redis import SyncRedisStore

        store = SyncRedisStore.from_url(url)
        try:
            store.setup_infrastructure(ENDPOINT)
            store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
            t = now()
            store.store_many([msg(i, t) for i in range(50)])
            calls: list[object] = []
            script = store._change_script
            store._change_script = lambda **kw: calls.append(kw) or script(**kw)
            claimed = store.fetch_due(t, 50)
            assert store.release([m.message_id for m in claimed[:20]] + ["gone"]) == 20
            assert store.remove_many([m.message_id for m in claimed[20:]] + ["gone"]) == 30
            assert len(calls) == 2 and store.counts(t).total == 20
        finally:
            store.close()
