"""Bulk jobs under a keyring: what `bulk schedule` and `bulk migrate` write into a store is sealed
as the store's own writer seals it (every store, every write path: COPY, Arrow batches, the move
inside one PostgreSQL database), opened by the store's readers, kept sealed through export and
import; and a Spark task without the driver's keyring writes nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.bulk.export_import import export, import_
from duetime.bulk.migrate import MigrationSpec, migrate
from duetime.bulk.schedule import schedule
from duetime.bulk.sealing import task_sealer
from duetime.encryption import KEY_HEADER, Keyring
from duetime.errors import ConfigurationError
from duetime.message import DelayedMessage
from duetime.registry import open_sync_store
from duetime.settings import ENCRYPTION_KEYS_VARIABLE, TransactionMode
from tests.bulk.test_migrate import store_rows
from tests.conftest import run_cli
from tests.services import postgres_database, postgres_schema, store_url

SECRET = b"SECRET-PAYLOAD"
DUE = datetime(2031, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def keyring(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A keyring for this process and the shared session's tasks (as `spark.executorEnv` gives
    it to a session started with DUETIME_ENCRYPTION_KEYS set), gone from both afterwards."""
    path = tmp_path / "keys.json"
    Keyring.new("first").write(path)
    monkeypatch.setenv(ENCRYPTION_KEYS_VARIABLE, str(path))
    environment = spark.sparkContext.environment
    environment[ENCRYPTION_KEYS_VARIABLE] = str(path)
    try:
        yield path
    finally:
        environment.pop(ENCRYPTION_KEYS_VARIABLE, None)


def as_stored(url: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, DelayedMessage]:
    """The messages as a store without the keyring reads them: what is at rest."""
    with monkeypatch.context() as m:
        m.delenv(ENCRYPTION_KEYS_VARIABLE)
        return store_rows(url, endpoint)


def sealed_at_rest(rows: dict[str, DelayedMessage]) -> bool:
    return bool(rows) and all(
        KEY_HEADER in m.headers and SECRET not in m.body and "SECRET" not in m.headers["card"]
        for m in rows.values()
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb", "redis"])
def test_bulk_schedule_seals_every_row_it_stores_and_the_store_opens_them(
    spark: Any, keyring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    rows = [(f"s{i}", "orders", DUE, SECRET + bytes([i, 0, 255]), {"card": f"SECRET-{i}"}) for i in range(40)]
    frame = spark.createDataFrame(
        rows, "id string, destination string, due_at timestamp, body binary, headers map<string,string>"
    ).repartition(2)
    with store_url(kind, tmp_path) as url:
        done = schedule(spark, frame, url, endpoint="sealed", job="sealed-1")
        assert (done.stored, done.rejected) == (40, 0)
        assert sealed_at_rest(as_stored(url, "sealed", monkeypatch))
        opened = store_rows(url, "sealed")
        assert {m.message_id: (m.body, dict(m.headers)) for m in opened.values()} == {
            r[0]: (r[3], r[4]) for r in rows
        }


def test_bulk_migrate_seals_in_one_database_across_databases_and_from_files(
    spark: Any, keyring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The three ways rows reach a PostgreSQL store: a move inside one database (which otherwise
    never passes a row through Python), COPY from another database, and Arrow batches from files;
    and an export of the sealed store, imported again, stays sealed and opens."""
    messages = [
        DelayedMessage(
            f"m{i}", "orders", DUE + timedelta(seconds=i), SECRET + bytes([i]), {"card": f"SECRET-{i}"}
        )
        for i in range(30)
    ]
    with postgres_schema() as plain, postgres_database() as elsewhere, postgres_schema() as other:
        for source, target in ((plain, plain + "&table=moved"), (elsewhere, other)):
            with monkeypatch.context() as m:
                m.delenv(ENCRYPTION_KEYS_VARIABLE)  # a store written before the keyring existed
                store = open_sync_store(source)
                store.setup_infrastructure("legacy")
                store.initialize("legacy", TransactionMode.AT_LEAST_ONCE)
                store.store_many(messages)
                store.close()
            result = migrate(spark, MigrationSpec(source, target, "legacy"))
            assert result.inserted == 30, result
            assert sealed_at_rest(as_stored(target, "legacy", monkeypatch)), target
            assert {k: v.body for k, v in store_rows(target, "legacy").items()} == {
                x.message_id: x.body for x in messages
            }
        out = tmp_path / "export"
        assert export(spark, other, f"parquet:{out}", "legacy").rows == 30
        assert SECRET not in b"".join(p.read_bytes() for p in out.glob("part-*"))  # kept as sealed
        again = other + "&table=imported"
        assert import_(spark, f"parquet:{out}", again).inserted == 30
        # --decrypt: the rows opened where the keyring holds their key, the others as stored
        stranger = tmp_path / "stranger.json"
        Keyring.new("stranger").write(stranger)
        with monkeypatch.context() as m:
            m.setenv(ENCRYPTION_KEYS_VARIABLE, str(stranger))
            store = open_sync_store(other)
            store.initialize("legacy", TransactionMode.AT_LEAST_ONCE)
            store.store(DelayedMessage("theirs", "orders", DUE, SECRET, {}))
            store.close()
        opened = export(spark, other, f"jsonl:{tmp_path / 'opened'}", "legacy", decrypt=True)
        assert (opened.rows, opened.still_sealed) == (31, 1)
        lines = [
            json.loads(x) for p in (tmp_path / "opened").glob("part-*") for x in p.read_text().splitlines()
        ]
        bodies = {line["message_id"]: line for line in lines}
        assert {k: base64.b64decode(v["body_base64"]) for k, v in bodies.items() if k != "theirs"} == {
            x.message_id: x.body for x in messages
        }
        assert base64.b64decode(bodies["theirs"]["body_base64"]) != SECRET
        assert "stranger" in bodies["theirs"]["headers"]
        assert sealed_at_rest(as_stored(again, "legacy", monkeypatch))
        assert {k: v.body for k, v in store_rows(again, "legacy").items()} == {
            x.message_id: x.body for x in messages
        }


def test_a_task_without_the_drivers_keyring_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENCRYPTION_KEYS_VARIABLE, raising=False)
    assert task_sealer(None) is None  # nobody has a keyring: rows go as they are
    with pytest.raises(ConfigurationError, match=r"a Spark task has no keyring.*spark\.executorEnv"):
        task_sealer("first")
    other = tmp_path / "other.json"
    Keyring.new("another").write(other)
    monkeypatch.setenv(ENCRYPTION_KEYS_VARIABLE, str(other))
    with pytest.raises(ConfigurationError, match="does not hold key 'first'"):
        task_sealer("first")
    assert task_sealer(None) is not None  # a keyring here seals, whatever the driver had
    rotated = tmp_path / "rotated.json"
    Keyring.new("first").with_new_key("second").write(rotated)
    monkeypatch.setenv(ENCRYPTION_KEYS_VARIABLE, str(rotated))
    sealer = task_sealer("first")  # rotated since the driver read it: its key is still there
    assert sealer is not None and sealer.keyring.primary == "second"


@pytest.mark.slow
@pytest.mark.timeout(300)  # a Spark of its own, started by the command
def test_bulk_schedule_as_a_user_runs_it_seals_with_the_keyring_the_variable_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DUETIME_ENCRYPTION_KEYS=keys.json duetime bulk schedule …`: a path relative to where the
    command runs reaches Spark's tasks, which seal every row; `bulk export --decrypt` opens them."""
    Keyring.new("first").write(tmp_path / "keys.json")
    lines = [
        {"id": f"u{i}", "destination": "orders", "due_at": "2031-03-01T09:00:00Z", "body": f"SECRET-PAYLOAD {i}",
         "headers": {"card": f"SECRET-{i}"}}
        for i in range(20)
    ]  # fmt: skip
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli(
        "bulk", "schedule", "jsonl:rows.jsonl", "--to", "sqlite:///s.db", "--endpoint", "e", "--job", "j",
        cwd=tmp_path, timeout=240, env={ENCRYPTION_KEYS_VARIABLE: "keys.json"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    url = f"sqlite:///{tmp_path / 's.db'}"
    monkeypatch.setenv(ENCRYPTION_KEYS_VARIABLE, str(tmp_path / "keys.json"))
    assert sealed_at_rest(as_stored(url, "e", monkeypatch))
    assert {k: v.body for k, v in store_rows(url, "e").items()} == {
        line["id"]: line["body"].encode() for line in lines
    }
    # and back out, opened, as the encryption page says: every row, none left sealed
    out = run_cli(
        "bulk", "export", "--from", "sqlite:///s.db", "--to", "jsonl:opened", "--decrypt",
        cwd=tmp_path, timeout=240, env={ENCRYPTION_KEYS_VARIABLE: "keys.json"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "20 messages written to" in out.stdout and "still encrypted" not in out.stdout, out.stdout
    exported = [
        json.loads(x) for p in (tmp_path / "opened").glob("part-*") for x in p.read_text().splitlines()
    ]
    assert sorted(base64.b64decode(e["body_base64"]).decode() for e in exported) == sorted(
        line["body"] for line in lines
    )
