"""Behind PgBouncer in transaction pooling mode (Debian's 1.18), where a server connection serves
another client after every transaction: everything duetime does against PostgreSQL works through
it with ``pooler=transaction``, and leaves nothing on the server connections it shared."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

import duetime
from duetime import ConfigurationError, ReceivedMessage
from duetime.backends.postgres import SyncPostgresQueue
from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.services import POSTGRES, free_port, postgres_schema, until, with_option
from tests.topology.servers import pgbouncer, stop

pytestmark = [pytest.mark.topology, pytest.mark.timeout(400)]


def _ok(*args: str, timeout: float = 60) -> str:
    done = run_cli(*args, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_pooler_duetime_was_not_told_of_is_one_line_that_says_what_to_add() -> None:
    """PgBouncer refuses the start-up option that sets the server's idle-in-transaction limit;
    where it is told to ignore it, psycopg prepares a statement on the server after five runs and
    PgBouncer then hands that server connection to another client, whose own statement of the
    same name collides (one server connection in the pool makes it happen every time). Either way
    one line says to add ``pooler=transaction``."""
    with postgres_schema() as pg, pgbouncer(pool_size=1) as strict:
        refused = run_cli("setup", "--store", strict.url(pg), "--endpoint", "orders")
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (
            "unsupported startup parameter" in refused.stderr and "add pooler=transaction" in refused.stderr
        )
    with postgres_schema() as pg, pgbouncer(pool_size=1, ignore="options") as bouncer:
        url = bouncer.url(pg)
        _ok("setup", "--store", url, "--endpoint", "orders")
        with (
            pytest.raises(ConfigurationError) as collided,
            duetime.connect_sync(url, endpoint="orders") as first,
            duetime.connect_sync(url, endpoint="orders") as second,
        ):
            for i in range(20):
                first.schedule("orders", b"first", delay="1h", message_id=f"a{i}")
                second.schedule("orders", b"second", delay="1h", message_id=f"b{i}")
        said = str(collided.value)
        assert "pooler in transaction mode" in said and "add pooler=transaction" in said, said
        assert len(said.splitlines()) == 1


def test_a_flush_after_the_sync_keeps_pgbouncers_server_for_a_silent_client() -> None:
    """Why duetime sends nothing through psycopg's pipeline behind a pooler: a pipeline left with
    answers still to come ends with a flush request after its sync (psycopg's way to fetch
    them). PgBouncer gave the server connection back at the sync's answer; the flush takes it
    again, and as nothing answers a flush it stays with that client until the client speaks, while
    every other client waits (with one server connection, until PgBouncer's query_wait_timeout
    closes them)."""
    with pgbouncer(pool_size=1) as bouncer:
        url = bouncer.url(POSTGRES)
        with (
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as silent,
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as other,
        ):
            # answered in full, up to its sync: PgBouncer takes the server back. (A pipeline here
            # made the test depend on the machine's speed: on a busy one the pipeline's own exit
            # came late and sent the flush itself, and SELECT 2 waited out query_wait_timeout.)
            silent.execute("SELECT 1")
            assert other.execute("SELECT 2").fetchone() == (2,)  # the server went back at the sync
            silent.pgconn.send_flush_request()  # what a late pipeline's exit adds after its sync
            assert silent.pgconn.flush() == 0
            answered: list[object] = []
            waiting = threading.Thread(target=lambda: answered.append(other.execute("SELECT 3").fetchone()))
            waiting.start()
            waiting.join(3)
            assert answered == [], "PgBouncer no longer holds a server for a flush: the rule may go"
            silent.execute("SELECT 4")  # the silent client speaks: the server is free again
            waiting.join(10)
            assert answered == [(3,)]


def test_everything_works_through_pgbouncer_and_leaves_no_session_behind(tmp_path: Path) -> None:
    """One server connection for everyone (the strictest pool): producers on threads, the
    exactly-once dispatcher with its front door, the PostgreSQL queue's consumer, `stats`, the
    dashboard and a bulk export, all through PgBouncer. Every message arrives once, none early;
    afterwards the server connection holds no prepared statement, no LISTEN and no setting."""
    with postgres_schema() as pg, pgbouncer(pool_size=1) as bouncer:
        url = with_option(bouncer.url(pg), pooler="transaction", poll="0.2")
        _ok("setup", "--store", url, "--endpoint", "shop", "--queue", "orders")
        log = tmp_path / "run.log"
        run = spawn_run(duetime_cmd("run", "--front-door", "--store", url, "--endpoint", "shop"), log)
        try:
            wait_until_serving(log)
            errors: list[BaseException] = []

            def produce(n: int) -> None:
                try:
                    with duetime.connect_sync(url, endpoint="shop") as client:
                        for i in range(50):
                            client.schedule(
                                "orders", f"{n}-{i}".encode(), delay=f"{i % 3}s", message_id=f"p{n}-{i}"
                            )
                except BaseException as error:
                    errors.append(error)

            producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
            for producer in producers:
                producer.start()
            # the front door: envelopes on the endpoint's timeouts queue, stored and sent when due
            for i in range(5):
                _ok("send-delayed", "orders", "door", "--in", "1s", "--id", f"d{i}", "--endpoint", "shop",
                    "--transport", url)  # fmt: skip
            for producer in producers:
                producer.join(60)
            assert not errors, errors
            got: dict[str, int] = {}
            with SyncPostgresQueue.from_url(url) as queue:
                deadline = time.monotonic() + 60
                batch: list[ReceivedMessage] = []
                while len(got) < 205 and time.monotonic() < deadline:
                    # the last batch is acknowledged in the same statement
                    batch = queue.receive("orders", 100, wait=1.0, done=batch)
                    for m in batch:
                        got[m.message_id] = got.get(m.message_id, 0) + 1
                assert queue.receive("orders", 100, wait=1.0, done=batch) == []  # nothing more: none twice
            sent = {f"p{n}-{i}" for n in range(4) for i in range(50)} | {f"d{i}" for i in range(5)}
            assert set(got) == sent, (sorted(sent - set(got)), log.read_text()[-3000:])
            assert set(got.values()) == {1}, "a message arrived twice"
            stats = json.loads(_ok("stats", "--store", url, "--endpoint", "shop", "--json"))
            assert stats["stored"] == 0, stats
        finally:
            stop(run)
        assert run.returncode == 0, log.read_text()[-3000:]
        _dashboard_answers(url, tmp_path)
        exported = run_cli(
            "bulk", "export", "--from", url, "--to", f"parquet:{tmp_path / 'out'}", timeout=240
        )
        assert exported.returncode == 0, exported.stderr
        # what every client left on the one server connection they all shared
        with psycopg.connect(bouncer.url(POSTGRES), autocommit=True, prepare_threshold=None) as conn:
            left = conn.execute(
                "SELECT (SELECT count(*) FROM pg_prepared_statements), "
                "(SELECT count(*) FROM pg_listening_channels()), current_setting('enable_sort'), "
                "current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
        assert left == (0, 0, "on", "0"), left
        assert "unsupported startup parameter" not in bouncer.log()


def _dashboard_answers(url: str, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        import subprocess

        board = subprocess.Popen(
            duetime_cmd("dashboard", "--store", url, "--endpoint", "shop", "--port", str(port)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        page = until(lambda: _get(f"http://127.0.0.1:{port}/"), 60, "the dashboard through PgBouncer")
        assert "shop" in page
        assert _get(f"http://127.0.0.1:{port}/errors") is not None
    finally:
        stop(board)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def test_wakeups_through_a_pooler_poll_or_listen_on_the_server_itself(tmp_path: Path) -> None:
    """Behind a pooler a dispatcher cannot LISTEN through it: by default it asks every ``poll``
    seconds, so a message another process stores for now arrives within that; with
    ``listen=HOST:PORT`` (the server itself) it is woken as without a pooler. Both delivery modes
    run through the pooler."""
    with postgres_schema() as pg, pgbouncer(pool_size=4) as bouncer:
        server = pg.split("@", 1)[1].split("/", 1)[0]
        # then at-least-once with lease claims (the default behind a pooler), and with lock claims,
        # whose transaction sets the idle-in-transaction limit itself
        for option, bound, mode in (
            (dict(poll="1"), 2.0, "exactly-once"),
            (dict(listen=server), 1.0, "at-least-once"),
            (dict(listen=server, claims="lock"), 1.0, "at-least-once"),
        ):
            endpoint = f"w{uuid.uuid4().hex[:6]}"
            url = with_option(bouncer.url(pg), pooler="transaction", **option)
            _ok("setup", "--store", url, "--endpoint", endpoint, "--queue", "orders")
            log = tmp_path / f"{endpoint}.log"
            run = spawn_run(duetime_cmd("run", "--store", url, "--endpoint", endpoint, "--mode", mode), log)
            try:
                wait_until_serving(log)
                time.sleep(1.5)  # asleep: nothing stored, the next look a minute away
                lateness = []
                # the consumer on the server itself: only the dispatcher's wake-up is measured
                with (
                    duetime.connect_sync(url, endpoint=endpoint) as client,
                    SyncPostgresQueue.from_url(pg) as queue,
                ):
                    for i in range(3):
                        sent = time.monotonic()
                        client.schedule("orders", b"now", delay="0s", message_id=f"{endpoint}-{i}")
                        got = queue.receive("orders", 10, wait=10)
                        lateness.append(time.monotonic() - sent)
                        assert [m.message_id for m in got] == [f"{endpoint}-{i}"]
                        queue.acknowledge(got)
                        time.sleep(0.7)
                assert max(lateness) < bound, (option, lateness)
            finally:
                stop(run)


def test_session_pooling_keeps_listen_and_needs_only_the_start_up_options_left_out(tmp_path: Path) -> None:
    """In session mode a client keeps its server connection, so prepared statements, LISTEN and
    session settings work; only the start-up ``options`` parameter is refused, and one line says
    to add ``pooler=session``. With it: stored, woken by NOTIFY through the pooler, delivered
    exactly once, none early."""
    with postgres_schema() as pg, pgbouncer(pool_size=20, mode="session") as bouncer:
        refused = run_cli("setup", "--store", bouncer.url(pg), "--endpoint", "shop")
        assert refused.returncode != 0 and "pooler=session" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        url = with_option(bouncer.url(pg), pooler="session")
        _ok("setup", "--store", url, "--endpoint", "shop", "--queue", "orders")
        log = tmp_path / "run.log"
        run = spawn_run(
            duetime_cmd("run", "--store", url, "--endpoint", "shop", "--mode", "exactly-once"), log
        )
        try:
            wait_until_serving(log)
            time.sleep(1)  # asleep on LISTEN, with nothing due for a minute
            with duetime.connect_sync(url, endpoint="shop") as client:
                for i in range(30):
                    client.schedule("orders", f"{i}".encode(), delay="1s", message_id=f"s{i}")
            late: list[float] = []
            got: dict[str, int] = {}
            with SyncPostgresQueue.from_url(url) as queue:
                deadline = time.monotonic() + 30
                while len(got) < 30 and time.monotonic() < deadline:
                    batch = queue.receive("orders", 100, wait=1.0)
                    now = time.time()
                    for m in batch:
                        got[m.message_id] = got.get(m.message_id, 0) + 1
                        late.append(now - datetime.fromisoformat(m.headers["duetime-due-at"]).timestamp())
                    queue.acknowledge(batch)
            assert set(got) == {f"s{i}" for i in range(30)} and set(got.values()) == {1}, got
            assert min(late) > -0.05, min(late)  # none early
            assert max(late) < 1.0, max(late)  # woken by NOTIFY, not by its one-minute nap
        finally:
            stop(run)
        assert run.returncode == 0, log.read_text()[-3000:]
