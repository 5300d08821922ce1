"""An audit entry keeps what a careless or hostile caller gave as plain text of bounded size."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime

import pytest

from duetime import client
from duetime.audit import DETAIL_MOST, IDS_KEPT, NAME_MOST, Action, Actor, AuditEntry, AuditQuery, Via, made
from duetime.errors import ConfigurationError


def test_an_entry_keeps_the_first_ids_and_says_how_many_there_were() -> None:
    entry = made(
        Actor("ada"), Action.CANCEL, "orders", ids=[f"m{i}" for i in range(250)], detail="250 cancelled"
    )
    assert entry.ids == tuple(f"m{i}" for i in range(IDS_KEPT))
    assert entry.detail == f"250 cancelled; 250 messages, the first {IDS_KEPT} listed"
    assert AuditEntry.from_json(entry.to_json()) == entry


def test_names_and_details_are_one_line_of_bounded_size_and_markup_stays_text() -> None:
    actor = Actor("eve\n\x1b[31m<script>x</script>" + "y" * 500, Via.DASHBOARD, "10.0.0.1\r\nforged: line")
    entry = made(actor, Action.PAUSE, "q\x00", detail="d" * 5000)
    assert "\n" not in entry.actor and "\x1b" not in entry.actor and "<script>" in entry.actor
    assert len(entry.actor) == NAME_MOST and entry.actor.endswith("…")
    assert entry.origin == "10.0.0.1  forged: line" and entry.target == "q "
    assert len(entry.detail) == DETAIL_MOST


def test_an_actor_needs_a_name_and_an_action_is_one_of_the_words() -> None:
    with pytest.raises(ConfigurationError, match="needs a name"):
        Actor("  ")
    with pytest.raises(
        ConfigurationError, match="not an action the audit trail records; give one of: cancel"
    ):
        Action.of("delete-everything")


def test_keys_sort_as_the_entries_happened() -> None:
    early = made(Actor("a"), Action.CANCEL, "x", at=datetime(2026, 1, 1, 9, 0, 0, 5, tzinfo=UTC))
    late = made(Actor("a"), Action.CANCEL, "x", at=datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC))
    assert early.key < late.key and early.key.startswith("20260101T090000.000005Z-")


class _Trail:
    """An audit store that fails, or never answers, when asked to keep an entry."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    async def audit(self, entry: AuditEntry) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        raise ConnectionError("server closed the connection\nunexpectedly")

    async def audit_entries(self, query: object) -> tuple[list[AuditEntry], str | None]:
        return [], None

    async def prune_audit(self, before: datetime) -> int:
        return 0


@pytest.mark.parametrize(
    "store", [_Trail(hang=False), _Trail(hang=True), object()], ids=["fails", "hangs", "none"]
)
async def test_an_entry_the_store_cannot_take_goes_to_the_log_whole_and_the_change_stands(
    store: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "RECORD_WITHIN", 0.05)
    entry = made(Actor("ada"), Action.CANCEL, "m-1", ids=["m-1"])
    with caplog.at_level(logging.ERROR, logger="duetime.audit"):
        await client.record(store, entry)  # never raises: the change it records was made
    [line] = caplog.records
    assert line.getMessage().startswith("audit: the change was made but its entry could not be stored (")
    assert line.getMessage().endswith(entry.to_json()) and "\n" not in line.getMessage()


async def test_a_kept_entry_is_logged_with_the_whole_entry_for_json_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from duetime.backends.memory import MemoryStore
    from duetime.observability.logs import JsonFormatter
    from duetime.settings import TransactionMode

    store = MemoryStore()
    await store.setup_infrastructure("e")
    await store.initialize("e", TransactionMode.AT_LEAST_ONCE)
    entry = made(Actor("ada", Via.CLI, "host-1"), Action.PAUSE, "billing", detail="INC-7")
    with caplog.at_level(logging.INFO, logger="duetime.audit"):
        await client.record(store, entry)
    [line] = caplog.records
    assert json.loads(JsonFormatter().format(line))["audit"] == entry.as_json()
    assert (await store.audit_entries(AuditQuery()))[0] == [entry]
