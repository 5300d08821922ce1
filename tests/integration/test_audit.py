"""The audit trail as its users make it: every change typed at the command line (on every store),
made through the HTTP API or by a Python client given an actor, is one entry with its actor, in
order; what changed nothing is not recorded; `duetime audit list | export | prune` read and keep
it. The dashboard's side is in test_dashboard.py (a real browser)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import duetime
from duetime.audit import Actor, AuditQuery, Via
from duetime.cli import app
from duetime.encryption import Keyring
from duetime.errors import DuetimeError
from tests.conftest import run_cli
from tests.integration.http_api import Api, make_key, serving
from tests.services import store_url

HOSTILE = "<img src=x onerror=alert(1)> ops é"
runner = CliRunner()


def typed(url: str, *args: str, actor: str = HOSTILE, env: dict[str, str] | None = None) -> str:
    """A command as a user types it, its output; it must succeed."""
    done = runner.invoke(app, [*args, "--store", url], env={"DUETIME_ACTOR": actor, **(env or {})})
    assert done.exit_code == 0, f"duetime {' '.join(args)}: {done.output}{done.exception!r}"
    return done.stdout


def exported(url: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in typed(url, "audit", "export").splitlines()]


@pytest.fixture(params=["sqlite", "postgresql", "mariadb", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_url(request.param, tmp_path) as url:
        assert run_cli("setup", "--store", url).returncode == 0
        yield url


def test_every_change_typed_at_the_command_line_is_recorded_once_with_its_actor(
    store: str, tmp_path: Path
) -> None:
    url = store
    lines = tmp_path / "carts.jsonl"
    lines.write_text(
        json.dumps({"destination": "q", "delay": "1h", "id": "a1", "body": "from a file"}) + "\n"
    )
    past = (datetime.now(UTC) - timedelta(hours=3)).isoformat()
    recent = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    steps: list[tuple[list[str], str | None]] = [
        (["schedule", "q", "a", "--in", "1h", "--id", "a1"], None),  # a new message changes nothing
        (["reschedule", "a1", "--in", "2h"], "reschedule"),
        (["schedule", "q", "b", "--in", "1h", "--id", "a1", "--if-exists", "replace"], "replace"),
        (["schedule", "q", "c", "--in", "1h", "--id", "a1", "--if-exists", "keep"], None),
        (["schedule", "q", "d", "--in", "10m", "--id", "a1", "--if-exists", "debounce"], "debounce"),
        (["load", str(lines), "--if-exists", "replace"], "replace"),
        (["cancel", "a1"], "cancel"),
        (["schedule", "q", "g", "--in", "1h", "--group", "order-7"], None),
        (["cancel", "--group", "order-7", "--yes"], "cancel-group"),
        (["schedule", "gone", "x", "--in", "1h", "--id", "gone-1"], None),
        (["cancel", "--destination", "gone", "--yes"], "cancel"),
        (["limits", "set", "q", "--rate", "5/s"], "limit-set"),
        (["limits", "remove", "q"], "limit-remove"),
        (["destinations", "pause", "q", "--reason", "INC-1"], "pause"),
        (["destinations", "resume", "q"], "resume"),
        (["recurring", "add", "r1", "q", "tick", "--every", "1h", "--start", past], "schedule-add"),
        (["recurring", "change", "r1", "--every", "30m"], "schedule-change"),
        (["recurring", "pause", "r1"], "schedule-pause"),
        (["recurring", "resume", "r1"], "schedule-resume"),
        (["recurring", "trigger", "r1"], "schedule-trigger"),
        (["recurring", "backfill", "r1", past, recent], "schedule-backfill"),
        (["recurring", "remove", "r1"], "schedule-remove"),
        (["webhooks", "add", "billing", "https://billing.example.com/hooks?token=tok-5f1e"], "webhook-add"),
        (["webhooks", "rotate", "billing"], "webhook-rotate"),
        (["webhooks", "remove", "billing"], "webhook-remove"),
        (["api-keys", "create", "ops", "--scope", "read"], "api-key-create"),
        (["api-keys", "revoke", "ops"], "api-key-revoke"),
    ]
    printed = [typed(url, *args) for args, _ in steps]
    refused = runner.invoke(app, ["cancel", "no-such-message", "--store", url])
    assert refused.exit_code == 1  # nothing changed: nothing recorded
    entries = exported(url)
    assert [e["action"] for e in entries] == [action for _, action in steps if action]
    assert {(e["actor"], e["via"]) for e in entries} == {(HOSTILE, "cli")}
    by = {e["action"]: e for e in entries}
    assert by["cancel-group"]["target"] == "order-7" and by["cancel-group"]["detail"] == "1 cancelled"
    assert by["schedule-change"]["detail"] == "changed when"
    assert by["limit-set"]["detail"] == "5/s" and by["pause"]["detail"] == "INC-1"
    assert by["replace"]["target"] == "carts.jsonl" and by["replace"]["ids"] == ["a1"]
    key_secret = printed[-2].strip().splitlines()[-1]
    hook_secret = printed[-5].strip().splitlines()[-1]
    for secret in ("tok-5f1e", key_secret, hook_secret):  # a webhook's query and secrets stay out
        assert secret not in json.dumps(entries)
    assert [e["ids"] for e in entries if e["action"] == "cancel"] == [["a1"], ["gone-1"]]

    newest = typed(url, "audit", "list", "--json", "--limit", "2", "--action", "webhook-add")
    assert [json.loads(line)["action"] for line in newest.splitlines()] == ["webhook-add"]
    assert "more:" not in typed(url, "audit", "list")  # 21 entries fit the first page of 50
    assert typed(url, "audit", "prune", "--older-than", "0s").startswith(f"forgot {len(entries)} entries")
    [pruned] = exported(url)
    assert pruned["action"] == "audit-prune"  # a prune is a change too
    for bad in (["list", "--action", "nope"], ["list", "--since", "yesterday"], ["list", "--after", "zz"],
                ["prune", "--older-than", "soon"]):  # fmt: skip
        refused = runner.invoke(app, ["audit", *bad, "--store", url])
        # a DuetimeError of one line is what `duetime` prints as `error: ...`, exit 1
        assert isinstance(refused.exception, DuetimeError) and "\n" not in str(refused.exception), bad
    assert len(exported(url)) == 1  # nothing of it changed anything


def test_an_error_queue_retry_and_discard_and_a_key_rotation_are_recorded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    keys = tmp_path / "keys.json"
    Keyring.new("first").write(str(keys))
    env = {"DUETIME_ENCRYPTION_KEYS": str(keys), "DUETIME_ACTOR": HOSTILE}

    def ran(*args: str) -> None:  # each its own process, as typed (a process reads the keyring once a second)
        done = run_cli(*args, "--store", url, env=env)
        assert done.returncode == 0, done.stderr

    ran("setup")
    for i in range(3):
        ran("schedule", "never-declared", f"m{i}", "--in", "0", "--id", f"m{i}")
    ran("run", "--burst")  # all three dead-lettered
    ran("errors", "retry", "m0", "--in", "1h")
    ran("errors", "discard", "m1", "m2", "--yes")
    Keyring.read(str(keys)).with_new_key("second").write(str(keys))
    ran("keys", "rotate")
    ran("keys", "retire", "first")
    entries = exported(url)
    assert [(e["action"], e["target"], e["ids"]) for e in entries] == [
        ("retry", "error queue", ["m0"]),
        ("discard", "error queue", ["m1", "m2"]),
        ("key-rotate", "second", []),
        ("key-retire", "first", []),
    ]


def test_the_http_api_records_each_change_as_its_key_from_its_address(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    key = make_key(url, "billing")
    reader = make_key(url, "reader", "read")
    typed(url, "schedule", "nowhere", "x", "--in", "0", "--id", "lost")
    assert run_cli("run", "--burst", "--store", url).returncode == 0  # dead-lettered
    with serving(url, tmp_path) as port, Api(port, key) as api:

        def call(method: str, path: str, body: Any = None, status: int = 200) -> Any:
            answer = api.call(method, path, body)
            assert answer.status == status, answer.body
            return answer.body

        call("POST", "/v1/messages", {"destination": "q", "delay": "1h", "id": "m1"}, 201)
        call("POST", "/v1/messages", {"destination": "q", "delay": "1h", "id": "m1", "if_exists": "replace"})
        call("PATCH", "/v1/messages/m1", {"delay": "2h"})
        call("DELETE", "/v1/messages/m1", status=204)
        call("DELETE", "/v1/messages/m1", status=404)  # nothing changed: nothing recorded
        call("POST", "/v1/messages", {"destination": "q", "delay": "1h", "group": "g"}, 201)
        call("DELETE", "/v1/groups/g/messages")
        call("POST", "/v1/messages", {"destination": "old", "delay": "1h", "id": "o1"}, 201)
        call("DELETE", "/v1/destinations/old/messages")
        call("POST", "/v1/schedules", {"id": "s1", "destination": "q", "every": "1h"}, 201)
        call("PATCH", "/v1/schedules/s1", {"every": "2h"})
        call("POST", "/v1/schedules/s1/pause")
        call("POST", "/v1/schedules/s1/resume")
        call("POST", "/v1/schedules/s1/trigger")
        call("DELETE", "/v1/schedules/s1")
        call("PUT", "/v1/limits/q", {"rate": "5/s"})
        call("DELETE", "/v1/limits/q", status=204)
        call("POST", "/v1/destinations/q/pause", {"reason": "INC-2"}, 204)
        call("POST", "/v1/destinations/q/resume", status=204)
        call("POST", "/v1/errors/retry", {"ids": ["lost"], "delay": "1h"})
        made_keys = call("GET", "/v1/audit?action=api-key-create")["entries"]
        assert [(e["target"], e["via"]) for e in made_keys] == [("reader", "cli"), ("billing", "cli")]
        page = call("GET", "/v1/audit?limit=100&actor=key:billing")
        actions = [e["action"] for e in reversed(page["entries"])]
        assert actions == [
            "replace", "reschedule", "cancel", "cancel-group", "cancel", "schedule-add", "schedule-change",
            "schedule-pause", "schedule-resume", "schedule-trigger", "schedule-remove", "limit-set",
            "limit-remove", "pause", "resume", "retry",
        ]  # fmt: skip
        assert {(e["actor"], e["via"], e["origin"]) for e in page["entries"]} == {
            ("key:billing", "http-api", "127.0.0.1")
        }
        first = call("GET", "/v1/audit?limit=3&action=cancel")
        assert [e["target"] for e in first["entries"]] == ["old", "m1"] and first["next_cursor"] is None
        assert call("GET", "/v1/audit?limit=2")["next_cursor"] is not None
        assert api.call("GET", "/v1/audit?action=nope").status == 400
    with serving(url, tmp_path) as port, Api(port, reader) as other:
        assert other.call("GET", "/v1/audit").status == 403  # it names keys and addresses


async def test_a_python_client_records_its_changes_only_when_given_an_actor(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    async with duetime.connect(url) as quiet:
        await quiet.schedule("q", b"x", delay=timedelta(hours=1), message_id="p1")
        assert await quiet.cancel("p1")
        job = quiet.acting_as(Actor("nightly-job", Via.PYTHON, "batch-host"))
        await job.schedule("q", b"x", delay=timedelta(hours=1), message_id="p2")
        assert await job.reschedule("p2", delay=timedelta(hours=2))
        assert await job.cancel("p2")
        assert not await job.cancel("p2")
        entries, _ = await quiet.store.audit_entries(AuditQuery(oldest_first=True))  # type: ignore[attr-defined]
    assert [(e.actor, e.via, e.origin, e.action) for e in entries] == [
        ("nightly-job", "python", "batch-host", "reschedule"),
        ("nightly-job", "python", "batch-host", "cancel"),
    ]
    with duetime.connect_sync(url) as blocking:
        job_sync = blocking.acting_as(Actor("sync-job"))
        job_sync.schedule("q", b"x", delay=timedelta(hours=1), message_id="p3")
        assert job_sync.cancel("p3")
        page, _ = blocking.store.audit_entries(AuditQuery(limit=1))  # type: ignore[attr-defined]
    assert [(e.actor, e.action, e.target) for e in page] == [("sync-job", "cancel", "p3")]
