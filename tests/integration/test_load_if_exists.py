"""`duetime load --if-exists` on every store: a file that changes what waits. Keep leaves what is
there, replace puts each line in place of its id's message (a later line of an id wins), debounce
does so with each line's delay counted from now, and a line whose message is being delivered is
named and not stored; a file that breaks the choice's rules stores nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import duetime
from duetime.interfaces import IfExists
from duetime.operations.message_files import load
from tests.conftest import run_cli
from tests.services import store_url


@pytest.fixture(params=["sqlite", "postgresql", "mariadb", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_url(request.param, tmp_path) as url:
        assert run_cli("setup", "--store", url).returncode == 0
        yield url


def _file(path: Path, *lines: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


async def test_a_file_keeps_replaces_or_debounces_what_waits(store: str, tmp_path: Path) -> None:
    first = _file(
        tmp_path / "first.jsonl",
        {"destination": "r", "delay": "1h", "id": "cart-1", "body": "1 item"},
        {"destination": "r", "delay": "1h", "id": "cart-2", "body": "1 item"},
        {"destination": "r", "delay": 0, "id": "cart-3", "body": "due now"},
    )
    later = _file(
        tmp_path / "later.jsonl",
        {"destination": "r", "delay": "2h", "id": "cart-1", "body": "2 items"},
        {"destination": "r", "delay": "2h", "id": "cart-4", "body": "new"},
        {"destination": "r", "delay": "3h", "id": "cart-1", "body": "3 items"},
        {"destination": "r", "delay": "3h", "id": "cart-3", "body": "too late"},
    )
    async with duetime.open_store(store) as s:
        await s.initialize("duetime", duetime.TransactionMode.AT_LEAST_ONCE)
        now = datetime.now(UTC)
        assert (await load(first, s, now)).stored == 3
        [held] = await s.fetch_due(datetime.now(UTC), 10)  # cart-3 is being delivered
        kept = await load(later, s, now, if_exists=IfExists.KEEP)
        assert (kept.stored, kept.skipped_duplicates) == (1, 3)  # only cart-4 is new
        debounced = await load(later, s, datetime.now(UTC), if_exists=IfExists.DEBOUNCE)
        # cart-1 twice (each of its lines), cart-4 once; cart-3 is on its way
        assert (debounced.stored, debounced.replaced, debounced.in_flight) == (0, 3, ["cart-3"])
        one = await s.get("cart-1")
        assert one is not None and one.body == b"3 items"  # the last line of the id
        assert one.due_at - datetime.now(UTC) > timedelta(hours=2, minutes=59)
        assert (await s.get("cart-3")) == held  # being delivered: left as it was
        assert (await s.get("cart-2")) is not None and (await s.get("cart-2")).body == b"1 item"  # type: ignore[union-attr]


def test_the_command_refuses_a_file_that_breaks_the_choice_and_stores_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    wrong = _file(
        tmp_path / "wrong.jsonl",
        {"destination": "r", "due_at": "2030-01-01T00:00:00Z", "id": "a"},
        {"destination": "r", "delay": "1m"},
    )
    done = run_cli("load", str(wrong), "--store", url, "--if-exists", "debounce")
    assert done.returncode == 1
    assert 'line 1: a debounce counts its due time from now, so it takes a "delay"' in done.stderr
    assert 'line 2: --if-exists debounce needs an "id" on every line' in done.stderr
    assert "Traceback" not in done.stderr
    listed = run_cli("list", "--store", url, "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == ""
