"""Recurring schedules on every store, as they run in production: many schedules ticking every
second under three `duetime run` processes, one of them killed with SIGKILL and started again
twice. Every planned tick arrives: exactly once where the store moves messages exactly-once
(SQLite, PostgreSQL), at least once with its stable id otherwise (MariaDB, Redis); none early."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import duetime
from duetime.interfaces import ReceivedMessage
from duetime.recurring import every
from duetime.recurring.schedule import PLANNED_HEADER, tick_id
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.integration.consumer import RecordingConsumer
from tests.services import REDIS, mariadb_database, postgres_schema, require, with_option

#: The suite's size. DUETIME_RECURRING_FULL=1 runs the size the feature is held to: 200 schedules
#: for a minute (about a minute and a half a store).
FULL = os.environ.get("DUETIME_RECURRING_FULL") == "1"
SCHEDULES = 200 if FULL else 100
#: Ticks from the first to the last, a second apart (the window the dispatchers are killed in).
SPAN = 60 if FULL else 20
ENDPOINT = "tick"
QUEUE = "ticks"


@dataclass
class World:
    store: str
    transport: str | None
    exactly_once: bool
    consumer: RecordingConsumer


class _Broker:
    """A blocking receive over an async transport (a consumer thread of its own)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.t: Any = duetime.open_transport(url)
        self.loop.run_until_complete(self.t.start())

    def receive(self, queue: str, max_messages: int = 100, wait: float = 0.1) -> list[ReceivedMessage]:
        return list(self.loop.run_until_complete(self.t.receive(queue, max_messages, wait)))

    def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int:
        return int(self.loop.run_until_complete(self.t.acknowledge(list(messages))))

    def close(self) -> None:
        self.loop.run_until_complete(self.t.close())
        self.loop.close()


@contextlib.contextmanager
def world(kind: str, tmp_path: Path) -> Iterator[World]:
    if kind == "sqlite":
        db = tmp_path / "s.db"
        yield World(f"sqlite:///{db}", None, True, RecordingConsumer(db, QUEUE))
    elif kind == "postgresql":
        from duetime.backends.postgres import SyncPostgresQueue

        with postgres_schema() as url:
            yield World(url, None, True, RecordingConsumer(lambda: SyncPostgresQueue.from_url(url), QUEUE))
    else:
        require(REDIS)
        broker = f"{REDIS}?mode=stream&prefix=duetime-rec-{uuid.uuid4().hex[:8]}:"
        consumer = RecordingConsumer(lambda: _Broker(broker), QUEUE)
        if kind == "mariadb":
            with mariadb_database() as url:
                yield World(with_option(url, claim_timeout="5"), broker, False, consumer)
        else:
            prefix = f"duetime-rec-store-{uuid.uuid4().hex[:8]}:"
            yield World(with_option(REDIS, prefix=prefix, claim_timeout="5"), broker, False, consumer)


def _run(w: World, log: Path) -> subprocess.Popen[bytes]:
    extra = [] if w.transport is None else ["--transport", w.transport]
    return spawn_run(duetime_cmd("run", "--store", w.store, "--endpoint", ENDPOINT, *extra), log)


@pytest.mark.timeout(200 + 2 * SPAN)
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mariadb", "redis"])
def test_every_planned_tick_arrives_under_three_dispatchers_one_killed_twice(
    kind: str, tmp_path: Path
) -> None:
    with world(kind, tmp_path) as w:
        extra = [] if w.transport is None else ["--transport", w.transport]
        setup = run_cli("setup", "--store", w.store, "--endpoint", ENDPOINT, "--queue", QUEUE, *extra)
        assert setup.returncode == 0, setup.stderr
        # ticks from a whole second a little ahead (the dispatchers start meanwhile) for SPAN s
        first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
        last = first + timedelta(seconds=SPAN)
        with duetime.connect_sync(w.store, endpoint=ENDPOINT) as client:
            for i in range(SCHEDULES):
                client.add_recurring(f"s{i}", QUEUE, b"tick", when=every("1s", start=first, end=last))
        expected = {
            tick_id(f"s{i}", first + timedelta(seconds=k)) for i in range(SCHEDULES) for k in range(SPAN + 1)
        }
        w.consumer.start()
        logs = [tmp_path / f"run{n}.log" for n in range(5)]
        runs = [_run(w, logs[n]) for n in range(3)]
        try:
            for n in range(3):
                wait_until_serving(logs[n])
            for restart, at in (
                (3, SPAN * 7 // 20),
                (4, SPAN * 14 // 20),
            ):  # kill -9 the first, start another, twice
                time.sleep(max(0.0, (first + timedelta(seconds=at) - datetime.now(UTC)).total_seconds()))
                runs[0].send_signal(signal.SIGKILL)
                runs[0].wait(10)
                runs[0] = _run(w, logs[restart])
            deadline = time.monotonic() + SPAN + 60
            while not expected <= set(w.consumer.ids()) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)  # a doubled tick would come now
        finally:
            for run in runs:
                run.send_signal(signal.SIGTERM)
            for run in runs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.wait(30)
            w.consumer.halt.set()
            w.consumer.join(10)
        ids = w.consumer.ids()
        said = "".join(log.read_text(errors="replace")[-1500:] for log in logs if log.exists())
        missing = expected - set(ids)
        assert not missing, (len(missing), sorted(missing)[:5], said)
        assert set(ids) <= expected  # no tick outside the window
        if w.exactly_once:
            doubled = [i for i in set(ids) if ids.count(i) > 1]
            assert doubled == [], doubled[:5]
        assert w.consumer.early() == []


def test_ticks_carry_the_schedule_and_the_planned_time_and_missed_ticks_follow_the_policy(
    tmp_path: Path,
) -> None:
    """No dispatcher ran for ten minutes of a schedule ticking every minute: the tick stored ahead
    before it went away arrives late, and of the eight it missed only the latest is sent
    (catch-up "latest"); the seven left out are counted and logged. Ticks say which schedule and
    which planned time."""
    from duetime import TransactionMode, open_sync_store
    from duetime.backends.sqlite import SyncSqliteQueue
    from duetime.recurring.schedule import new_schedule

    store = f"sqlite:///{tmp_path / 's.db'}"
    assert run_cli("setup", "--store", store, "--queue", QUEUE).returncode == 0
    then = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10, seconds=30)
    with open_sync_store(store) as sync:
        sync.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        away = new_schedule("away", QUEUE, every("1m", start=then, catch_up="latest"), then, body=b"x")
        sync.add_schedule(away, then)  # made then; the tick at +1 min was stored ahead at once
    burst = run_cli("run", "--burst", "--store", store)
    assert burst.returncode == 0, burst.stderr
    assert "8 tick(s) of 1 schedule(s) missed while no dispatcher ran" in burst.stderr, burst.stderr
    assert ": away (8)" in burst.stderr and "behind" not in burst.stderr, burst.stderr
    with SyncSqliteQueue(tmp_path / "s.db") as queue:
        got = queue.receive(QUEUE, 100, wait=0.5)
    assert {m.headers["duetime-schedule"] for m in got} == {"away"}
    planned = sorted(datetime.fromisoformat(m.headers[PLANNED_HEADER]) for m in got)
    assert planned == [then + timedelta(minutes=1), then + timedelta(minutes=10)], planned
    with duetime.connect_sync(store) as client:
        assert client.recurring("away").ticks_missed == 8


def test_recurring_commands_as_a_user_types_them(tmp_path: Path) -> None:
    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, cwd=tmp_path)
        assert (done.returncode == 0) == ok, (args, done.stdout, done.stderr)
        return done

    cli("setup", "--queue", "invoices")
    added = cli(
        "recurring", "add", "inv", "invoices", "{}", "--cron", "0 9 * * MON-FRI", "--zone", "Europe/Paris"
    )
    assert "added inv: 0 9 * * MON-FRI in Europe/Paris -> invoices (active); next tick" in added.stdout
    nxt = cli("recurring", "next", "inv", "-n", "2").stdout.splitlines()
    assert len(nxt) == 2 and all(line.split()[1].endswith(("+01:00", "+02:00")) for line in nxt)
    for args, said in (
        (
            ("recurring", "add", "x", "q", "--cron", "0 0 30 2 *"),
            "never fires: no month it names (2) has the days it names (30)",
        ),
        (("recurring", "add", "x", "q", "--every", "0s"), "at least 1 s"),
        (
            ("recurring", "add", "x", "q", "--cron", "0 9 * * *", "--zone", "Mars/Olympus"),
            "Unknown time zone",
        ),
        (("recurring", "add", "x", "q"), "Say when"),
        (("recurring", "add", "inv", "q", "--every", "1m"), "exists"),
        (("recurring", "pause", "nope"), "No schedule 'nope'"),
        (("recurring", "change", "inv", "--catch-up", "some"), "--catch-up is one of"),
    ):
        refused = cli(*args, ok=False)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "x" not in cli("recurring", "list").stdout.split()  # nothing stored by a refusal
    cli("recurring", "pause", "inv")
    assert '"state": "paused"' in cli("recurring", "show", "inv").stdout
    cli("recurring", "resume", "inv")
    changed = cli("recurring", "change", "inv", "--cron", "30 8 * * *")
    assert "30 8 * * * in Europe/Paris" in changed.stdout
    assert cli("recurring", "trigger", "inv").stdout.strip().endswith("+trigger")
    assert (
        "stored 1 tick(s)"
        in cli("recurring", "backfill", "inv", "2026-01-05T00:00:00Z", "2026-01-05T12:00:00Z").stdout
    )
    assert "removed inv and 3 stored tick(s)" in cli("recurring", "remove", "inv").stdout
    assert "no recurring schedules" in cli("recurring", "list").stderr


def test_a_long_list_of_schedules_streams_in_plain_columns(tmp_path: Path) -> None:
    """100,000 schedules took `recurring list` 482 s and 567 MB: every page was kept, then drawn as
    one table, whose layout measures every cell. Pages are now printed as they are read; a list
    of more than a page is plain columns with the header once."""
    from duetime import TransactionMode, open_sync_store
    from duetime.recurring.schedule import new_schedule

    store = f"sqlite:///{tmp_path / 's.db'}"
    assert run_cli("setup", "--store", store, "--queue", QUEUE).returncode == 0
    now = datetime.now(UTC)
    with open_sync_store(store) as sync:
        sync.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        for i in range(620):
            sync.add_schedule(new_schedule(f"s{i:04d}", QUEUE, every("1h"), now), now)
    listed = run_cli("recurring", "list", "--store", store)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 621 and lines[0].split()[:2] == ["id", "destination"]
    assert [line.split()[0] for line in lines[1:]] == [f"s{i:04d}" for i in range(620)]
    as_json = run_cli("recurring", "list", "--store", store, "--json").stdout.splitlines()
    assert len(as_json) == 620
