"""Passwords never appear in errors or logs; endpoint names with dots work and are quoted."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from duetime import DelayedMessage, DuetimeError, TransactionMode, open_store
from tests.conftest import run_cli
from tests.services import MARIADB, POSTGRES, mariadb_database, postgres_schema, require

SECRET = "s3cret-pw-never-shown"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://nobody:{SECRET}@127.0.0.1:1/test?pool_timeout=1",
        f"mysql://nobody:{SECRET}@127.0.0.1:3306/test",
        f"postgresql://nobody:{SECRET}@127.0.0.1:1/test?schema=bad%20name",
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
