"""The ``duetime`` command as a user runs it: a real subprocess on a real SQLite file."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import run_cli, sqlite_file


def test_help_teaches_every_command(cli) -> None:  # type: ignore[no-untyped-def]
    top = cli("--help").stdout
    for command in (
        "demo",
        "run",
        "schedule",
        "list",
        "show",
        "cancel",
        "reschedule",
        "stats",
        "errors",
        "queues",
        "setup",
    ):
        assert command in top
        assert cli(command, "--help").returncode == 0
    # a flag is shown as a flag: Typer's help wrote `--paused <bool>`, as if it took a value
    for args in ((), ("recurring", "add"), ("run",)):
        shown = cli(*args, "--help").stdout
        assert "<bool>" not in shown and "--help" in shown, shown


def test_the_store_endpoint_and_transport_may_come_before_the_command(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`duetime --store X queues declare q`, as many tools take their global options: each stands
    for its variable, so every command of every group reads it, and the command's own wins."""
    store = f"sqlite:///{tmp_path}/before.db"
    cli("--store", store, "--endpoint", "shop", "setup")
    cli("--store", store, "queues", "declare", "orders")
    cli("--store", store, "--endpoint", "shop", "schedule", "orders", "x", "--in", "1h", "--id", "m1")
    listed = cli("--store", store, "--endpoint", "shop", "list", "--json").stdout
    assert [json.loads(line)["id"] for line in listed.splitlines()] == ["m1"]
    assert "no recurring" in cli("--store", store, "--endpoint", "shop", "recurring", "list").stderr
    other = cli("--store", store, "--endpoint", "shop", "stats", "--endpoint", "other", ok=False)
    assert other.returncode == 1 and "endpoint 'other'" in other.stderr  # the command's own option wins
    assert not (tmp_path / "duetime.db").exists()  # the default store was never used


def test_schedule_list_show_reschedule_cancel(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    twice = cli(
        "schedule", "orders", "hello", "--in", "1h", "-H", "tenant=acme", "-H", "tenant=other", ok=False
    )
    assert twice.returncode == 2 and "given twice" in twice.stderr  # one would have been dropped
    mid = cli("schedule", "orders", "hello", "--in", "1h", "-H", "tenant=acme").stdout.strip()
    listed = [json.loads(line) for line in cli("list", "--json").stdout.splitlines()]
    assert [m["id"] for m in listed] == [mid]
    assert listed[0]["headers"] == {"tenant": "acme"}
    shown = json.loads(cli("show", mid).stdout)
    assert shown["body"] == "hello"
    assert json.loads(cli("show", mid, "--json").stdout) == shown
    cli("reschedule", mid, "--at", "2031-01-01T00:00:00+00:00")
    assert json.loads(cli("show", mid).stdout)["due_at"] == "2031-01-01T00:00:00+00:00"
    cli("cancel", mid)
    again = cli("cancel", mid, ok=False)
    assert again.returncode == 1 and "no stored message" in again.stderr


def test_schedule_if_exists_keeps_replaces_and_debounces_as_typed(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`duetime schedule --if-exists`: stdout carries the id alone, stderr says what happened; a
    choice the command cannot keep is one line, exit 1, and changes nothing."""
    cli("setup", "--queue", "reminders")
    first = cli("schedule", "reminders", "1 item", "--id", "cart-7", "--in", "10m")
    assert first.stdout == "cart-7\n" and "replaced" not in first.stderr
    kept = cli("schedule", "reminders", "2 items", "--id", "cart-7", "--in", "1h", "--if-exists", "keep")
    assert kept.stdout == "cart-7\n" and "(kept: a message with this id was waiting)" in kept.stderr
    debounced = cli(
        "schedule", "reminders", "3 items", "--id", "cart-7", "--in", "2h", "--if-exists", "debounce"
    )
    assert "(replaced the one waiting)" in debounced.stderr
    shown = json.loads(cli("show", "cart-7").stdout)
    assert shown["body"] == "3 items"
    assert datetime.fromisoformat(shown["due_at"]) - datetime.now(UTC) > timedelta(hours=1, minutes=59)
    for args, said in (
        (["--id", "cart-7", "--at", "2031-01-01T00:00:00Z", "--if-exists", "debounce"], "takes a delay"),
        (["--in", "1m", "--if-exists", "replace"], "needs the message's id"),
        (["--id", "cart-7", "--in", "1m", "--if-exists", "refuse"], "already stored"),
    ):
        refused = cli("schedule", "reminders", "4 items", *args, ok=False)
        assert refused.returncode == 1 and said in refused.stderr and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    with sqlite_file(tmp_path / "duetime.db") as db:  # a dispatcher is sending it right now
        db.execute(
            'UPDATE "duetime.delayed" SET claim_token = ?, claimed_until = ? WHERE message_id = ?',
            ("someone", 2**62, "cart-7"),
        )
    held = cli(
        "schedule", "reminders", "5 items", "--id", "cart-7", "--in", "1m", "--if-exists", "replace", ok=False
    )
    assert held.returncode == 1 and "not replaced" in held.stderr and "Traceback" not in held.stderr
    assert json.loads(cli("show", "cart-7").stdout)["body"] == "3 items"


def test_run_burst_delivers_and_errors_can_be_sent_back(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    cli("schedule", "orders", "due-now", "--in", "0s", "--id", "a")
    cli("schedule", "typo-queue", "lost?", "--in", "0s", "--id", "b")
    cli("schedule", "orders", "later", "--in", "1h", "--id", "c")
    assert "forwarded 1, to the error queue 1" in cli("run", "--burst").stdout
    received = [
        json.loads(line)
        for line in cli(
            "queues", "receive", "orders", "--wait", "0.2", "--endpoint", "duetime"
        ).stdout.splitlines()
    ]
    assert [(m["id"], m["body"]) for m in received] == [("a", "due-now")]
    errors = [json.loads(line) for line in cli("errors", "list", "--json").stdout.splitlines()]
    assert errors[0]["id"] == "b"
    assert errors[0]["headers"]["duetime-error-original-destination"] == "typo-queue"
    assert errors[0]["attempts"] == 1  # the exactly-once move was a try: not 0, nor "?" in the table
    assert re.search(r"\bb\s.*typo-queue.*\s1\s", cli("errors", "list").stdout), cli("errors", "list").stdout
    old = cli("errors", "retry", "b", "--destination", "orders", ok=False)  # the option before --to
    assert old.returncode == 1 and "use --to QUEUE" in old.stderr
    # a typo in --error-queue is said (it looked like an empty error queue); so is an empty name
    typo = cli("errors", "list", "--error-queue", "eror")
    assert "there is no queue 'eror'" in typo.stderr and "0 shown of 0" in typo.stdout
    assert cli("errors", "list", "--error-queue", "", ok=False).returncode == 2
    assert cli("errors", "list", "--limit", "0", ok=False).returncode == 2
    assert cli("queues", "receive", "orders", "--wait", "-1", ok=False).returncode == 2
    assert cli("queues", "receive", "orders", "--count", "0", ok=False).returncode == 2
    retried = cli("errors", "retry", "b", "--to", "orders")
    assert "warning" not in retried.stderr  # a declared queue: nothing to say
    assert cli("errors", "list", "--json").stdout.strip() == ""
    cli("run", "--burst")
    received = [
        json.loads(line) for line in cli("queues", "receive", "orders", "--wait", "0.2").stdout.splitlines()
    ]
    assert [m["id"] for m in received] == ["b"]
    assert not any(k.startswith("duetime-error-") for k in received[0]["headers"])
    stats = json.loads(cli("stats", "--json").stdout)
    assert stats["stored"] == 1 and stats["by_destination"] == {"orders": 1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("schedule", "orders", "x", "--in", "soon"), "Cannot read the duration"),
        (("schedule", "orders", "x", "--at", "2030-01-01T09:00"), "no UTC offset"),
        (("schedule", "orders", "x", "--in", "-5s"), "must not be negative"),
        (("schedule", "x" * 201, "x", "--in", "1s"), "limit is 200"),
        (("schedule", "orders", "x", "--in", "1s", "--id", "i" * 251), "limit is 250"),
        (("list", "--store", "sqlit:///x.db"), "Did you mean sqlite://"),
        (("list", "--store", "sqlite:///missing-folder/x.db"), "does not exist"),
        (("list", "--endpoint", "bad name!"), "not allowed"),
        (("run", "--burst", "--mode", "exactly-once", "--transport", "memory://"), "exactly-once needs"),
    ],
)
def test_bad_input_gets_a_clear_error_and_changes_nothing(cli, args, message) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    cli("schedule", "orders", "keep me", "--in", "1h", "--id", "kept")
    result = cli(*args, ok=False)
    assert result.returncode != 0
    assert message in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(cli("show", "kept").stdout)["body"] == "keep me"


def test_list_before_setup_says_to_run_setup(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("list", ok=False)
    assert result.returncode == 1 and "duetime setup" in result.stderr


def test_demo_delivers_everything_on_time(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("demo", "--messages", "500", "--spread", "0.5", timeout=120)
    out = " ".join(result.stdout.split())
    assert "all delivered, none early, none doubled" in out
    assert "missing │ 0" in out or "missing 0" in out.replace("│", "")


def test_setup_from_several_processes_at_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from tests.conftest import duetime_cmd

    url = f"sqlite:///{tmp_path}/race.db"
    procs = [
        subprocess.Popen(
            duetime_cmd("setup", "--store", url, "--queue", "orders"), stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""


def test_load_a_file_all_or_nothing(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    good = tmp_path / "good.jsonl"
    good.write_text(
        "\n".join(
            [
                json.dumps({"destination": "orders", "delay": "1h", "body": f"b{i}", "id": f"L{i}"})
                for i in range(300)
            ]
            + [
                json.dumps(
                    {
                        "destination": "orders",
                        "due_at": "2031-01-01T00:00:00Z",
                        "body_base64": "AAEC",
                        "headers": {"k": "v"},
                    }
                )
            ]
        )
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"destination": "orders", "delay": "1h", "id": "X1"})
        + "\n"
        + json.dumps({"destination": "orders", "due_at": "2031-01-01T00:00:00"})
        + "\n"
        + "{not json\n"
        + json.dumps({"destination": "orders", "delay": 5, "colour": "red"})
        + "\n"
    )
    result = cli("load", str(bad), ok=False)
    err = " ".join(result.stderr.split())
    assert result.returncode == 1 and "nothing was stored" in err
    assert (
        "line 2" in err and "no UTC offset" in err and "line 3" in err and "line 4" in err and "colour" in err
    )
    assert cli("list", "--json").stdout.strip() == ""
    # a byte that is not UTF-8 is its line's problem, listed with the others (it was an internal error)
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(
        b'{"destination": "orders", "delay": "1h", "body": "caf\xe9"}\n{"destination": 1, "delay": "1h"}\n'
    )
    result = cli("load", str(latin), ok=False)
    err = " ".join(result.stderr.split())
    assert result.returncode == 1 and "Traceback" not in result.stderr and "internal error" not in err
    assert "line 1: not UTF-8 text (byte 0xe9 at column 54); save the file as UTF-8." in err
    assert "line 2: destination must be text" in err
    assert cli("list", "--json").stdout.strip() == ""
    # a byte-order mark (as some editors save UTF-8) is not a problem
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"destination": "orders", "delay": "1h", "id": "B"}).encode()
    )
    assert "stored 1 of 1" in cli("load", str(marked)).stdout
    assert cli("cancel", "B").returncode == 0
    out = cli("load", str(good), "--chunk", "100").stdout
    assert "stored 301 of 301" in out
    again = cli("load", str(good), ok=False)
    assert again.returncode == 1 and "--skip-duplicates" in again.stderr
    # lines with an id are skipped on a re-run; the line without one is a new message every time
    assert "stored 1 of 301; skipped 300" in cli("load", str(good), "--skip-duplicates").stdout
    shown = json.loads(cli("show", "L7").stdout)
    assert shown["body"] == "b7"


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    from duetime import __version__

    assert cli("--version").stdout.strip() == f"duetime {__version__}"


def test_a_failed_command_leaves_no_file_behind(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = cli("list", "--store", "sqlite:///missing.db", ok=False)
    assert result.returncode == 1 and "duetime setup" in result.stderr
    assert not (tmp_path / "missing.db").exists()


def test_a_due_time_in_the_past_is_accepted_with_a_warning(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    result = cli("schedule", "orders", "x", "--at", "2020-01-01T00:00:00+00:00")
    assert "warning:" in result.stderr and "has passed" in result.stderr
    assert result.stdout.strip()  # stored: the id is printed


def test_stats_of_an_empty_store_say_so(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    out = cli("stats").stdout
    assert "nothing stored" in out and "None" not in out


def test_stats_show_queues_only_for_a_transport_that_can_be_browsed(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    own = json.loads(cli("stats", "--json").stdout)
    assert own["queues"] == {"orders": 0, "error": 0}  # the SQLite queue tables beside the store
    broker = cli("stats", "--json", "--transport", "nats://127.0.0.1:1")  # nothing listens there
    shown = json.loads(broker.stdout)
    assert "queues" not in shown and "queues_error" in shown and not broker.stderr
    assert shown["stored"] == 0  # the store's counts stand without the queues
    said = cli("stats", "--transport", "nats://127.0.0.1:1")
    assert "note: could not look at the queues of nats://127.0.0.1:1" in said.stderr


def test_settings_from_the_environment_take_cli_durations(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    cli("schedule", "orders", "x", "--in", "0s")
    env = {"DUETIME_MAX_SLEEP": "1m", "DUETIME_TRANSACTION_MODE": "exactly_once"}
    assert "forwarded 1" in cli("run", "--burst", env=env).stdout
    bad = cli("run", "--burst", env={"DUETIME_MAX_SLEEP": "soon"}, ok=False)
    assert bad.returncode == 1 and "DUETIME_MAX_SLEEP='soon' is not a duration" in bad.stderr
    mode = cli("run", "--burst", env={"DUETIME_TRANSACTION_MODE": "twice"}, ok=False)
    assert mode.returncode == 1 and "at-least-once" in mode.stderr and "exactly-once" in mode.stderr
    for variable, value, said in (
        ("DUETIME_MAX_SLEEP", "-1s", "DUETIME_MAX_SLEEP='-1s' must not be negative."),
        ("DUETIME_CLAIM_TIMEOUT", "9999999d", "DUETIME_CLAIM_TIMEOUT='9999999d' is too long"),
        (
            "DUETIME_OPERATION_TIMEOUT",
            "0.000001",
            "DUETIME_OPERATION_TIMEOUT='0.000001' must be at least 100 ms",
        ),
        (
            "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER",
            "1ms",
            "DUETIME_TIME_TO_TRIGGER_FETCH_CIRCUIT_BREAKER='1ms' must be at least 1 s",
        ),
    ):
        refused = cli("run", "--burst", env={variable: value}, ok=False)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    # a misspelt name is said, not ignored silently; the suite's own DUETIME_TEST_* are not duetime's
    typo = cli("run", "--burst", env={"DUETIME_NUMBER_OF_RETRY": "3", "DUETIME_TEST_ANYTHING": "x"})
    assert typo.stderr.splitlines()[0] == (
        "warning: DUETIME_NUMBER_OF_RETRY is not a duetime variable, so it is ignored; did you mean "
        "DUETIME_NUMBER_OF_RETRIES?"
    )
    assert "DUETIME_TEST_ANYTHING" not in typo.stderr


def test_run_on_the_default_store_is_exactly_once_and_logs_one_line_records(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import signal
    import subprocess
    import time

    cli("setup", "--queue", "orders")
    from tests.conftest import duetime_cmd, wait_until_serving

    log = tmp_path / "run.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            duetime_cmd("run", "--log-format", "json"), cwd=tmp_path, stderr=out, text=True
        )
    # stopped once it serves: a signal during its start (3 s of imports on a loaded machine) ends
    # it before it has logged a line
    wait_until_serving(log)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    stderr = log.read_text()
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert records, stderr
    started = [r for r in records if "dispatching endpoint" in r["message"]]
    assert started and "exactly-once" in started[0]["message"]
    assert all(r["time"].endswith("Z") and "T" in r["time"] for r in records)
    # the stop is said, with what it did, as numbers a machine can read
    (ended,) = [r for r in records if r["message"].startswith("stopped: forwarded 0")]
    assert (ended["forwarded"], ended["dead_lettered"], ended["outages"]) == (0, 0, 0)
    # the error it stops on is a record as well, with the exit code (it was a line of text)
    stopped = subprocess.run(
        duetime_cmd("run", "--log-format", "json", "--store", "sqlite:///no/such/folder/d.db"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stopped.returncode == 1
    [last] = [json.loads(line) for line in stopped.stderr.splitlines()]
    assert (last["level"], last["exit_code"]) == ("ERROR", 1) and "does not exist" in last["message"], last


def test_the_front_door_is_on_only_when_asked_for(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`run` declares and reads <endpoint>.Timeouts only with --front-door (or DUETIME_FRONT_DOOR),
    says so in its start line, and refuses it on a transport it cannot read from."""
    import signal
    import subprocess
    import time

    from tests.conftest import duetime_cmd

    cli("setup", "--queue", "orders")
    cli("run", "--burst")
    assert "duetime.Timeouts" not in json.loads(cli("stats", "--json").stdout)["queues"]
    cli("send-delayed", "orders", "hi", "--in", "1h", "--id", "fd1", "--transport", "sqlite:///duetime.db")
    cli("run", "--burst")  # off: the envelope waits where it is
    stats = json.loads(cli("stats", "--json").stdout)
    assert stats["stored"] == 0 and stats["queues"]["duetime.Timeouts"] == 1, stats
    cli("run", "--burst", env={"DUETIME_FRONT_DOOR": "1"})
    stats = json.loads(cli("stats", "--json").stdout)
    assert stats["stored"] == 1 and stats["queues"]["duetime.Timeouts"] == 0, stats
    assert json.loads(cli("show", "fd1").stdout)["body"] == "hi"
    refused = cli(
        "run", "--burst", "--front-door", "--transport", "celery+amqp://u:p@nowhere.invalid//", ok=False
    )
    assert refused.returncode == 1 and "front door (--front-door) needs a transport" in refused.stderr, (
        refused.stderr
    )
    assert len(refused.stderr.strip().splitlines()) == 1 and ":p@" not in refused.stderr
    proc = subprocess.Popen(
        duetime_cmd("run", "--front-door"), cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        line = ""
        while "dispatching endpoint" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        assert "and storing what arrives on duetime.Timeouts" in line, line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_run_logs_a_summary_line_while_it_works(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal
    import subprocess
    import threading
    import time

    cli("setup", "--queue", "orders")
    for i in range(5):
        cli("schedule", "orders", f"hello {i}", "--in", "1s")
    from tests.conftest import duetime_cmd

    env = {**os.environ, "DUETIME_SUMMARY_INTERVAL": "2s"}
    proc = subprocess.Popen(
        duetime_cmd("run", "--log-format", "json"), cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env
    )
    # Read as it comes: on a loaded machine the start alone can take seconds, so a fixed sleep
    # would stop it before its first interval ended. Once the summary is there, two more
    # intervals of idling must add none.
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not any('"last ' in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(4.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    reader.join(timeout=10)
    stderr = "".join(lines)
    records = [json.loads(line) for line in lines if line.strip()]
    summaries = [r for r in records if r["message"].startswith("last ")]
    assert len(summaries) == 1, stderr  # the work, once; nothing while idle afterwards
    summary = summaries[0]
    assert (summary["forwarded"], summary["dead_lettered"], summary["stored"]) == (5, 0, 0)
    # The messages fell due while the dispatcher was still starting, so their lateness includes its
    # start-up (over a second on a loaded CI machine): the test checks the figure is there and sane.
    assert summary["lateness_p99_ms"] is not None and 0 < summary["lateness_p99_ms"] < 30_000
    assert "forwarded 5, dead-lettered 0" in summary["message"]


def test_rabbitmq_commands_read_duetime_transport(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("rabbitmq", "status", env={"DUETIME_TRANSPORT": "amqp://guest:guest@127.0.0.1:1/"}, ok=False)
    assert result.returncode == 1
    assert "127.0.0.1:1" in result.stderr  # not the default localhost:5672


def test_list_pages_with_a_cursor_and_streams_everything(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lines = [
        json.dumps({"destination": "orders", "delay": f"{i + 1}m", "id": f"m{i:03d}"}) for i in range(120)
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    cli("setup")
    cli("load", "m.jsonl")
    first = cli("list", "--limit", "50").stdout
    assert "m000" in first and "m049" in first and "m050" not in first
    cursor = first.rsplit("--after '", 1)[1].split("'")[0]
    second = cli("list", "--limit", "50", "--after", cursor).stdout
    assert "m050" in second and "m049" not in second
    streamed = [
        json.loads(line)["id"] for line in cli("list", "--all", "--json", "--limit", "7").stdout.splitlines()
    ]
    assert streamed == [f"m{i:03d}" for i in range(120)]
    bad = cli("list", "--after", "yesterday", ok=False)
    assert bad.returncode == 1 and "not a place in the listing" in bad.stderr


def test_cancel_everything_for_a_destination_after_confirmation(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    for i in range(3):
        cli("schedule", "retired", "x", "--in", f"{i + 1}h", "--id", f"r{i}")
    cli("schedule", "orders", "keep", "--in", "1h", "--id", "k")
    unasked = cli("cancel", "--destination", "retired", ok=False)
    assert unasked.returncode == 1 and "Cancel 3 stored messages for 'retired'?" in unasked.stderr
    assert len(cli("list", "--json").stdout.splitlines()) == 4
    early = cli("cancel", "--destination", "retired", "--due-before", "2100-01-01T00:00:00+00:00", "--yes")
    assert "cancelled 3 of 3" in early.stdout
    assert [json.loads(line)["id"] for line in cli("list", "--json").stdout.splitlines()] == ["k"]
    assert "give one of: a message id" in cli("cancel", ok=False).stderr


def test_a_group_is_scheduled_listed_and_cancelled_together(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    for i in range(3):
        cli("schedule", "orders", "x", "--in", f"{i + 1}h", "--id", f"g{i}", "--group", "order-42")
    cli("schedule", "orders", "other", "--in", "1h", "--id", "solo")
    listed = [json.loads(line) for line in cli("list", "--group", "order-42", "--json").stdout.splitlines()]
    assert [m["id"] for m in listed] == ["g0", "g1", "g2"] and {m["group"] for m in listed} == {"order-42"}
    assert "group" in cli("list").stdout  # the column shows when some message has a group
    unasked = cli("cancel", "--group", "order-42", ok=False)
    assert unasked.returncode == 1 and "Cancel the 3 stored messages of group 'order-42'?" in unasked.stderr
    assert "cancelled 3 of 3" in cli("cancel", "--group", "order-42", "--yes").stdout
    assert [json.loads(line)["id"] for line in cli("list", "--json").stdout.splitlines()] == ["solo"]
    gone = cli("cancel", "--group", "order-42", "--yes", ok=False)
    assert gone.returncode == 1 and "no stored message in group 'order-42'" in gone.stderr
    both = cli("cancel", "solo", "--group", "order-42", ok=False)
    assert both.returncode != 0 and "give one of" in both.stderr


def test_a_large_group_is_cancelled_in_whole_batches_and_ctrl_c_stops_between_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of CANCEL_BATCH, each one transaction: Ctrl-C (here sent by the store itself after
    the second batch) stops the command between batches, says how many went and how to go on; the
    same command again cancels the rest."""
    import signal

    from typer.testing import CliRunner

    import duetime.cli.messages as messages
    from duetime import DelayedMessage, TransactionMode, open_sync_store
    from duetime.backends._store import StoreRules
    from duetime.cli import app

    url = f"sqlite:///{tmp_path / 'g.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    with open_sync_store(url) as store:
        store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
        due = datetime(2040, 1, 1, tzinfo=UTC)
        store.store_many([DelayedMessage(f"m{i}", "orders", due, group="big") for i in range(25)])
    monkeypatch.setattr(messages, "CANCEL_BATCH", 10)
    calls = []
    original = StoreRules.cancel_group

    def interrupted_after_two(self: StoreRules, group: str, limit: int | None = None) -> int:
        calls.append(limit)
        done = original(self, group, limit)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return done

    monkeypatch.setattr(StoreRules, "cancel_group", interrupted_after_two)
    stopped = CliRunner().invoke(app, ["cancel", "--group", "big", "--yes", "--store", url])
    assert stopped.exit_code == 130 and calls == [10, 10], (stopped.output, calls)
    assert "stopped: cancelled 20 of 25, each batch whole; the rest are stored" in stopped.output
    assert "duetime cancel --group big" in stopped.output
    monkeypatch.setattr(StoreRules, "cancel_group", original)
    rest = CliRunner().invoke(app, ["cancel", "--group", "big", "--yes", "--store", url])
    assert rest.exit_code == 0 and "cancelled 5 of 5" in rest.output, rest.output


def test_tables_keep_ids_and_times_whole_on_a_narrow_terminal(cli) -> None:  # type: ignore[no-untyped-def]
    mid = "a-very-long-message-id-" + "x" * 60
    cli("setup")
    cli("schedule", "orders", "x", "--in", "1h", "--id", mid)
    out = cli("list", env={"COLUMNS": "40"}).stdout
    assert mid in out and "+00:00" in out


def test_scheduling_for_an_undeclared_queue_warns_and_names_the_fix(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    warned = cli("schedule", "invoices", "x", "--in", "1m")
    assert "no queue 'invoices' is declared" in warned.stderr
    assert "duetime queues declare invoices" in warned.stderr
    assert "warning" not in cli("schedule", "orders", "x", "--in", "1m").stderr
    (tmp_path / "m.jsonl").write_text('{"destination": "refunds", "delay": "1m"}\n')
    assert "no queue 'refunds' is declared" in cli("load", "m.jsonl").stderr
    assert len(cli("list", "--json").stdout.splitlines()) == 3  # stored all the same


def test_the_readme_quickstart_works_as_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The five commands, in order, in an empty folder; `duetime run` is stopped with SIGTERM."""
    import shlex
    import signal
    import subprocess
    import time
    from pathlib import Path

    from tests.conftest import duetime_cmd, run_cli

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [
        shlex.split(line.split("#", 1)[0])[1:] for line in block.splitlines() if line.startswith("duetime")
    ]
    assert [c[0] for c in commands] == ["setup", "schedule", "run", "queues", "stats"]
    setup, schedule, run, receive, stats = commands
    assert run_cli(*setup, cwd=tmp_path).returncode == 0
    assert run_cli(*schedule, cwd=tmp_path).returncode == 0
    service = subprocess.Popen(
        duetime_cmd(*run), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(6)  # the message is due in 5 s
        got = run_cli(*receive, cwd=tmp_path)
        assert got.returncode == 0 and json.loads(got.stdout)["body"] == "hello", got.stdout + got.stderr
        shown = run_cli(*stats, cwd=tmp_path)
        assert shown.returncode == 0 and "nothing stored" in shown.stdout
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=30) == 0


def test_errors_retry_to_a_queue_nobody_declared_warns_as_schedule_does(cli) -> None:  # type: ignore[no-untyped-def]
    cli("setup", "--queue", "orders")
    cli("schedule", "typo-queue", "lost?", "--in", "0s", "--id", "t")
    assert "to the error queue 1" in cli("run", "--burst").stdout
    retried = cli("errors", "retry", "t", "--to", "ordres", "--in", "1h")
    assert "sent 1 back" in retried.stdout
    assert (
        "no queue 'ordres' is declared" in retried.stderr
        and "duetime queues declare ordres" in retried.stderr
    )


def test_a_duration_split_in_two_words_is_refused_not_stored_with_the_wrong_body(cli) -> None:  # type: ignore[no-untyped-def]
    """`duetime schedule orders --in 5 minutes` stored a message with the body "minutes", due in
    5 seconds, and exited 0. Now it is refused, saying how to write it, and nothing is stored."""
    cli("setup")
    refused = cli("schedule", "orders", "--in", "5", "minutes", ok=False)
    assert refused.returncode == 2 and "'minutes' would be the body" in " ".join(refused.stderr.split())
    assert "--in 5m" in refused.stderr
    assert json.loads(cli("stats", "--json").stdout)["stored"] == 0
    # with a body given, the unit was an unexpected extra argument to the parser: the same line
    for words in (("orders", "hi", "--in", "5", "minutes"), ("orders", "hi", "--in=2", "hours")):
        refused = cli("schedule", *words, ok=False)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "a duration is one word" in said, said
        assert "unexpected extra argument" not in said and len(refused.stderr.strip().splitlines()) == 1, said
    assert json.loads(cli("stats", "--json").stdout)["stored"] == 0
    # the body "minutes" on purpose, with a duration that says its unit, is fine
    cli("schedule", "orders", "minutes", "--in", "5s")
    assert json.loads(cli("stats", "--json").stdout)["stored"] == 1
    # every command that takes a body and --in: refused before anything is sent
    for command in (
        (
            "send-delayed",
            "orders",
            "--in",
            "5",
            "minutes",
            "--transport",
            "amqp://guest:guest@nowhere.invalid/",
        ),
        (
            "rabbitmq",
            "send",
            "orders",
            "--in",
            "90",
            "seconds",
            "--url",
            "amqp://guest:guest@nowhere.invalid/",
        ),
    ):
        refused = cli(*command, ok=False)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "would be the body" in said and "Traceback" not in said, said


def test_an_interrupted_load_says_what_is_stored_and_how_to_store_the_rest(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C during `duetime load`: exit 130 with one line saying how many lines are stored (at
    least that many are, at most one chunk more), and the command that stores the rest."""
    import re
    import signal
    import subprocess
    import time

    from duetime import TransactionMode, open_sync_store
    from tests.conftest import duetime_cmd

    cli("setup", "--queue", "orders")
    lines = 100_000
    messages = tmp_path / "many.jsonl"
    with messages.open("w") as out:
        for i in range(lines):
            out.write(json.dumps({"id": f"m{i}", "destination": "orders", "delay": "1h", "body": "x"}) + "\n")
    # chunks of 10: ten thousand commits (seconds), so the load is still under way when the signal
    # lands; with chunks of 1,000, and then 100 (about a second), it finished between the look
    # that found 2,000 stored and the signal while the whole suite ran. The look is a bare count.
    proc = subprocess.Popen(
        duetime_cmd("load", str(messages), "--chunk", "10"), cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        with open_sync_store(f"sqlite:///{tmp_path / 'duetime.db'}") as store:
            store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)  # binds it to the endpoint
            deadline = time.monotonic() + 60
            with sqlite_file(tmp_path / "duetime.db") as look:  # a count, nothing more
                while look.execute('SELECT count(*) FROM "duetime.delayed"').fetchone()[0] < 2_000:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
            assert proc.returncode == 130, stderr
            said = re.search(r"interrupted: stored ([\d,]+) of 100,000 lines", stderr)
            assert said is not None and "--skip-duplicates" in stderr, stderr
            told = int(said.group(1).replace(",", ""))
            stored = store.counts(datetime.now(UTC)).total
            assert told <= stored <= told + 10 and stored < lines
    finally:
        if proc.poll() is None:
            proc.kill()
    rest = cli("load", str(messages), "--skip-duplicates", timeout=300)
    assert f"stored {lines - stored} of {lines}" in rest.stdout


def test_setup_declares_its_queues_on_the_transport_it_is_given_and_says_where(cli) -> None:  # type: ignore[no-untyped-def]
    """`setup --transport` (or DUETIME_TRANSPORT) declares --queue and the error queue on that
    transport, not in the store's own queue tables, and names it (without the password)."""
    import asyncio
    import uuid

    from duetime.backends.rabbitmq.transport import RabbitMqTransport
    from tests.services import RABBITMQ, shown

    orders, errors = f"setup-{uuid.uuid4().hex[:8]}", f"setup-err-{uuid.uuid4().hex[:8]}"
    given = cli("setup", "--queue", orders, "--transport", RABBITMQ, env={"DUETIME_ERROR_QUEUE": errors})
    assert f"declared: {orders}, {errors} on {shown(RABBITMQ)}" in given.stdout, given.stdout
    from_env = cli("setup", "--queue", orders, env={"DUETIME_TRANSPORT": RABBITMQ})
    assert "on amqp://" in from_env.stdout and "sqlite" not in from_env.stdout.split("declared:")[1]
    assert "No such option" in cli("setup", "--transprot", RABBITMQ, ok=False).stderr  # still strict

    async def on_rabbitmq() -> list[bool]:
        t = RabbitMqTransport(RABBITMQ)
        await t.start()
        try:
            found = [await t.has_queue(orders), await t.has_queue(errors)]
            for queue in (orders, errors):
                await t.delete(queue)
            return found
        finally:
            await t.close()

    assert asyncio.run(on_rabbitmq()) == [True, True]


def test_stats_shows_the_queues_the_dispatchers_deliver_to_or_says_which_it_shows(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Dispatchers deliver to RabbitMQ: `stats --transport` shows what waits in its queues (a
    broker cannot list them: the endpoint's destinations and error queue are looked up); without
    --transport it shows the store's own queue tables and says so, naming where they deliver."""
    import asyncio
    import uuid

    from duetime import TransactionMode, open_store
    from duetime.backends.rabbitmq.transport import RabbitMqTransport
    from duetime.inputs.urls import redact
    from duetime.live_dispatchers import DispatcherInfo
    from tests.services import RABBITMQ, shown

    queue = f"stats-{uuid.uuid4().hex[:8]}"
    cli("setup", "--queue", queue, "--transport", RABBITMQ)
    for i in range(3):
        cli("schedule", queue, f"m{i}", "--in", "0s")
    cli("schedule", queue, "later", "--in", "1h")
    assert "forwarded 3" in cli("run", "--burst", "--transport", RABBITMQ).stdout

    async def a_live_dispatcher_on_rabbitmq() -> None:
        async with open_store(f"sqlite:///{tmp_path / 'duetime.db'}") as store:
            await store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
            await store.beat(
                DispatcherInfo.new("duetime", "at-least-once", redact(RABBITMQ), datetime.now(UTC))
            )  # type: ignore[attr-defined]

    asyncio.run(a_live_dispatcher_on_rabbitmq())
    on_broker = json.loads(cli("stats", "--json", "--transport", RABBITMQ).stdout)
    assert on_broker["queues"][queue] == 3 and "queues_note" not in on_broker
    assert on_broker["queues_on"] == shown(RABBITMQ)
    local = cli("stats", "--json")
    shown = json.loads(local.stdout)
    assert queue not in shown.get("queues", {})  # the store's own queue tables hold nothing
    assert "deliver to amqp://guest:***@" in shown["queues_note"] and "--transport" in shown["queues_note"]
    assert "note: these are the queues of sqlite:///" in cli("stats").stderr
    # the dashboard says the same on its pages, the error queue's first
    import subprocess
    import time
    import urllib.request

    from tests.conftest import duetime_cmd
    from tests.services import free_port

    port = free_port()
    with (tmp_path / "dashboard.log").open("wb") as log:
        board = subprocess.Popen(duetime_cmd("dashboard", "--port", str(port)), cwd=tmp_path, stderr=log)
    try:
        deadline, pages = time.monotonic() + 60, {}
        while len(pages) < 2:
            assert time.monotonic() < deadline and board.poll() is None, (
                tmp_path / "dashboard.log"
            ).read_text()
            try:
                for path in ("/errors", "/"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as page:
                        pages[path] = page.read().decode()
            except OSError:
                time.sleep(0.2)
        for text in pages.values():
            assert 'id="elsewhere"' in text and "deliver to amqp://guest:***@" in text
            assert "start the dashboard with --transport" in text
    finally:
        board.terminate()
        board.wait(timeout=30)

    async def cleanup() -> None:
        t = RabbitMqTransport(RABBITMQ)
        await t.start()
        try:
            await t.delete(queue)
        finally:
            await t.close()

    asyncio.run(cleanup())


def test_queues_receive_returns_as_soon_as_it_has_what_is_there(cli) -> None:  # type: ignore[no-untyped-def]
    """`queues receive` waited out its 5 s even when the message was there; with --count it
    waits (up to --wait in all) for the rest."""
    import time

    cli("setup", "--queue", "orders")
    for body in ("one", "two"):
        cli("schedule", "orders", body, "--in", "0s")
    cli("run", "--burst")
    started = time.monotonic()
    cli("--version")  # what starting the command costs on this machine now (seconds when it is busy)
    start_up = time.monotonic() - started
    started = time.monotonic()
    got = cli("queues", "receive", "orders")
    assert time.monotonic() - started < start_up + 4, "it waited for more than was there"
    assert [json.loads(line)["body"] for line in got.stdout.splitlines()] == ["one", "two"]
    started = time.monotonic()
    cli("queues", "receive", "orders", "--count", "3", "--wait", "1.5")
    assert 1.4 < time.monotonic() - started < start_up + 6, "--count waits for the rest, up to --wait"


def test_a_flag_out_of_range_is_named_as_typed(tmp_path: Path) -> None:
    """`--batch-size 0` said "batch_size must be between 1 and 10000", a Python field."""
    for args, said in (
        (["--batch-size", "0"], "error: --batch-size 0 must be from 1 to 10,000."),
        (["--retries", "-1"], "error: --retries -1 must be 0 or more."),
        (["--lateness-budget", "5s"], "error: --lateness-budget 5s must be from 0 to 1 second."),
        (
            ["--lateness-budget", "soon"],
            "error: --lateness-budget 'soon' is not a duration; write e.g. 90, 1.5s, 250ms, 10m or 1h30m.",
        ),
    ):
        done = run_cli("run", "--burst", *args, cwd=tmp_path)
        assert done.returncode == 1 and done.stderr.strip() == said, done.stderr
        assert not (tmp_path / "duetime.db").exists(), "refused before anything was opened"
    done = run_cli("run", "--burst", cwd=tmp_path, env={"DUETIME_CLAIM_WINDOW": "2s"})
    assert (
        done.returncode == 1
        and done.stderr.strip() == "error: DUETIME_CLAIM_WINDOW='2s' must be from 0 to 1 second."
    )
    assert not (tmp_path / "duetime.db").exists(), "refused before anything was opened"


def test_a_burst_run_is_recorded_as_a_dispatcher_that_ran(cli) -> None:  # type: ignore[no-untyped-def]
    """After `run --burst`, `stats` said no dispatcher had run against the store."""
    cli("setup", "--queue", "orders")
    cli("schedule", "orders", "hello", "--in", "0s")
    cli("run", "--burst")
    [ran] = json.loads(cli("stats", "--json").stdout)["dispatchers"]
    assert ran["status"] == "stopped" and ran["forwarded"] == 1, ran
    assert "none has run" not in cli("stats").stdout


def test_every_command_reads_each_setting_from_the_same_variable() -> None:
    """With DUETIME_ERROR_QUEUE set, `run`, `setup` and `stats` used it while `errors list` and the
    dashboard read 'error'. Every option is read from the one table in duetime.settings, by its
    flag, so every command that has --store reads DUETIME_STORE; and its help says so."""
    from duetime.cli import command
    from duetime.cli.common import SETTING_VARIABLES, command_options
    from duetime.settings import option_variables

    #: bulk jobs take every endpoint they find unless told: an endpoint from the environment
    #: would quietly narrow a migration to one of them
    deliberate = {("bulk", "--endpoint")}
    forgot, unsaid = [], []
    for words, param in command_options(command()):
        read = option_variables(words[0], param.opts)
        for flag in param.opts:
            wanted = SETTING_VARIABLES.get(flag)
            if wanted and wanted not in read and (words[0], flag) not in deliberate:
                forgot.append(f"duetime {' '.join(words)} {flag}: reads {read}, not {wanted}")
        if read and f"[env var: {', '.join(read)}]" not in (param.help or ""):
            unsaid.append(f"duetime {' '.join(words)} {param.opts[0]}")
    assert not forgot, "\n".join(forgot)
    assert not unsaid, "\n".join(unsaid)


def test_a_variable_an_option_cannot_take_is_one_line_naming_it_and_only_for_its_command(cli) -> None:  # type: ignore[no-untyped-def]
    """DUETIME_METRICS_PORT=abc stops `duetime run` in one line naming the variable (not the
    --metrics-port nobody typed), and troubles no other command."""
    bad = cli("run", "--burst", ok=False, env={"DUETIME_METRICS_PORT": "abc"})
    assert bad.returncode == 1 and "DUETIME_METRICS_PORT='abc' is not allowed: give a port" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    cli("setup", env={"DUETIME_METRICS_PORT": "abc"})
    routes = cli("check", env={"DUETIME_ROUTES": "a.*=memory:// b.*=memory://"})
    assert "a.*=memory:// b.*=memory://" in routes.stdout  # a repeatable option: one item a word


def test_an_error_queue_set_by_the_environment_is_the_one_every_command_uses(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.services import free_port

    env = {"DUETIME_ERROR_QUEUE": "nc_error"}
    cli("setup", "--queue", "orders", env=env)
    cli("schedule", "nowhere", "lost", "--in", "0s", "--id", "lost-1", env=env)
    cli("run", "--burst", env=env)
    listed = cli("errors", "list", "--json", env=env)
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == ["lost-1"], listed.stdout
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "duetime", "dashboard", "--port", str(port)],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        page = ""
        for _ in range(100):
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/errors", timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert "lost-1" in page and "nc_error" in page, page[-2000:]
    finally:
        server.terminate()
        server.wait(30)


def test_stats_marks_destinations_that_have_no_queue(cli) -> None:  # type: ignore[no-untyped-def]
    """`stats` listed stored destinations and the queues in two tables without saying that the
    messages of a destination with no queue will all be dead-lettered."""
    cli("setup", "--queue", "orders")
    cli("schedule", "orders", "a", "--in", "1h")
    cli("schedule", "nowhere", "b", "--in", "1h")
    assert json.loads(cli("stats", "--json").stdout)["without_queue"] == ["nowhere"]
    rows = {
        line.split("│")[1].strip(): line for line in cli("stats").stdout.splitlines() if line.count("│") >= 3
    }
    assert "to the error queue when due" in rows["nowhere"] and "error queue" not in rows["orders"]


def test_a_body_over_the_size_limit_is_one_line_and_nothing_is_stored(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cli("setup")
    (tmp_path / "big.bin").write_bytes(b"\x00" * (16 * 1024 * 1024 + 1))
    done = cli("schedule", "orders", "--body-file", "big.bin", "--in", "1h", ok=False)
    said = done.stderr.strip()
    assert done.returncode == 1 and len(said.splitlines()) == 1, said
    assert "the body is 16,777,217 bytes; the limit is 16,777,216 (16 MiB)" in said
    assert cli("list", "--json").stdout == ""


def test_no_sender_writes_to_the_error_queue_or_a_timeouts_queue(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Entries a sender puts in the error queue look like a dispatcher's failures (and a
    destination that is the error queue gets failures for orders); a timeouts queue stores what
    arrives again. Every writer refuses both, by the error queue in force; nothing is stored."""
    cli("setup")
    env = {"DUETIME_ERROR_QUEUE": "nc_error"}
    lines = tmp_path / "some.jsonl"
    lines.write_text('{"destination": "orders", "delay": "1h"}\n{"destination": "nc_error", "delay": "1h"}\n')
    refused = [
        (("schedule", "error", "x", "--in", "1h"), {}, "'error' is the error queue"),
        (("schedule", "nc_error", "x", "--in", "1h"), env, "'nc_error' is the error queue"),
        (("schedule", "Billing.Timeouts", "x", "--in", "1h"), {}, "timeouts queue"),
        (("load", str(lines)), env, "'nc_error' is the error queue"),
        (("recurring", "add", "r", "error", "--every", "1h"), {}, "is the error queue"),
        (("send-delayed", "error", "x", "--in", "1h", "--transport", "memory://"), {}, "is the error queue"),
        (("run", "--burst"), {"DUETIME_ERROR_QUEUE": "Sales.timeouts"}, "must not be an endpoint's timeouts"),
    ]
    for args, extra, said in refused:
        result = cli(*args, ok=False, env=extra)
        assert result.returncode != 0 and "Traceback" not in result.stderr, (args, result.stderr)
        assert said in " ".join(result.stderr.split()), (args, result.stderr)
    cli("recurring", "add", "r", "orders", "--every", "1h")
    changed = cli("recurring", "change", "r", "--destination", "nc_error", ok=False, env=env)
    assert "is the error queue" in changed.stderr and changed.returncode != 0, changed.stderr
    assert json.loads(cli("stats", "--json").stdout)["stored"] == 1  # the schedule's tick alone
    # with another error queue in force, "error" is a queue like any other
    cli("schedule", "error", "fine", "--in", "1h", env=env)
