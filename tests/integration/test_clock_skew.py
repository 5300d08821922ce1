"""A dispatcher whose host clock is wrong follows the store server's clock (Debian's faketime).

With the host clock 2 h ahead a PostgreSQL message was delivered an hour early while the
database's clock was right; with 45 s between two MariaDB dispatchers, the one ahead took the
other's claims (30 s leases) and delivered their messages a second time.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime import DelayedMessage, TransactionMode, open_sync_store
from tests.conftest import duetime_cmd, run_cli
from tests.services import (
    REDIS,
    delete_redis_keys,
    mariadb_database,
    postgres_schema,
    require,
    require_program,
)

pytestmark = pytest.mark.slow

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def skewed(offset: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A `duetime` command on a host whose wall clock is ``offset`` off (monotonic time untouched)."""
    require_program("faketime", "faketime")
    if not LIBFAKETIME.exists():
        pytest.fail(
            f"faketime is installed but {LIBFAKETIME} is not: apt-get install --reinstall libfaketime"
        )
    env = os.environ | {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }
    return subprocess.run(duetime_cmd(*args), capture_output=True, text=True, timeout=120, env=env)


def test_a_host_two_hours_ahead_delivers_nothing_early() -> None:
    with postgres_schema() as url:
        assert run_cli("setup", "--store", url, "-q", "orders").returncode == 0
        store = open_sync_store(url)
        store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        try:
            later = DelayedMessage.create("orders", b"in an hour", delay=timedelta(hours=1))
            now = DelayedMessage.create("orders", b"now", delay=0)
            store.store_many([later, now])
            done = skewed("+2h", "run", "--burst", "--store", url)
            assert done.returncode == 0, done.stderr
            assert store.get(now.message_id) is None  # due: delivered
            assert store.get(later.message_id) is not None  # an hour early by the host's clock
            assert re.search(r"this host's clock is 7(199|200|201)\.\d s ahead of the store's", done.stderr)
            checked = skewed("+2h", "check", "--store", url)
            assert checked.returncode == 0, checked.stderr
            assert re.search(r"this host's clock is 7(199|200|201)\.\d s ahead", checked.stdout), (
                checked.stdout
            )
            assert "NTP" in checked.stdout
        finally:
            store.close()


def test_a_dispatcher_45_seconds_ahead_never_takes_another_ones_claims() -> None:
    require(REDIS)
    prefix = f"skew-{uuid.uuid4().hex[:8]}:"
    transport = f"{REDIS}?mode=list&prefix={prefix}"
    with mariadb_database() as url:
        assert run_cli("setup", "--store", url).returncode == 0
        assert run_cli("queues", "declare", "orders", "--transport", transport).returncode == 0
        store = open_sync_store(url)
        store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        try:
            messages = [DelayedMessage.create("orders", f"m{i}".encode(), delay=0) for i in range(20)]
            store.store_many(messages)
            held = store.fetch_due(datetime.now(UTC), 10)  # a dispatcher on a right clock, mid-send
            assert len(held) == 10
            done = skewed("+45s", "run", "--burst", "--store", url, "--transport", transport)
            assert done.returncode == 0, done.stderr
            for m in held:  # its lease has 30 s to run by the database's clock: not taken
                assert store.get(m.message_id) is not None, "a claim was taken from the other dispatcher"
            free = [m for m in messages if m.message_id not in {h.message_id for h in held}]
            assert all(store.get(m.message_id) is None for m in free)
            assert re.search(r"this host's clock is 4[456]\.\d s ahead", done.stderr), done.stderr
        finally:
            store.close()
            delete_redis_keys(prefix)
