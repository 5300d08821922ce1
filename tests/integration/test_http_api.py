"""`duetime serve` against every store: a message created with curl and a key is delivered by
`duetime run`; ids make creates idempotent; keys, scopes and rates are held; the document served
is the one committed."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import duetime_cmd, run_cli, spawn_run, wait_until_serving
from tests.integration.http_api import Api, make_key, once, serving
from tests.services import REDIS, delete_redis_keys, free_port, require, store_url, until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql", "mariadb", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_url(request.param, tmp_path) as url:
        done = run_cli("setup", "--store", url)
        assert done.returncode == 0, done.stderr
        yield url


def curl(port: int, key: str, path: str, payload: dict[str, object]) -> tuple[int, dict[str, object]]:
    """What a shell script does: curl, a bearer key and a JSON body."""
    done = subprocess.run(
        [
            "curl", "-sS", "-w", "\n%{http_code}", "-X", "POST",
            "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
            "--data-binary", json.dumps(payload), f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body)


@pytest.mark.slow
def test_a_message_created_with_curl_and_a_key_is_delivered_by_duetime_run(
    store: str, tmp_path: Path
) -> None:
    require(REDIS)
    prefix = f"api-{uuid.uuid4().hex[:8]}:"
    transport = f"{REDIS}?prefix={prefix}"
    assert run_cli("queues", "declare", "orders", "--transport", transport).returncode == 0
    writer = make_key(store, "writer", "schedule,read")
    reader = make_key(store, "reader", "read")
    body = bytes(range(256))
    payload: dict[str, object] = {
        "id": "order-42-reminder",
        "destination": "orders",
        "delay": "1s",
        "body_base64": base64.b64encode(body).decode(),
        "headers": {"customer-id": "c-7"},
        "group": "order-42",
    }
    try:
        with serving(store, tmp_path) as port:
            status, created = curl(port, writer, "/v1/messages", payload)
            assert status == 201, created
            assert curl(port, writer, "/v1/messages", payload) == (200, created)  # the same again
            status, other = curl(
                port,
                writer,
                "/v1/messages",
                {**{k: v for k, v in payload.items() if k != "body_base64"}, "body": "other"},
            )
            assert status == 409 and other["type"] == "urn:duetime:problem:duplicate-message-id"
            with Api(port) as api:
                wrong = api.call("GET", "/v1/messages/order-42-reminder", key="dtk_not-a-key")
                assert wrong.status == 401 and wrong.headers["content-type"] == "application/problem+json"
                assert api.call("GET", "/v1/messages").status == 401  # no key, once the store holds one
                cancel = api.call("DELETE", "/v1/messages/order-42-reminder", key=reader)
                assert cancel.status == 403 and "schedule scope" in cancel.body["detail"]
                listed = api.call("GET", "/v1/messages?group=order-42", key=reader).body
                assert [m["id"] for m in listed["messages"]] == ["order-42-reminder"]
            # a request's line is written once its answer is sent: wait for the last one's
            said = until(
                lambda: (
                    (text := next(tmp_path.glob(f"serve-{port}-*.log")).read_text()) * ("key=reader" in text)
                ),
                10,
                "the last request's log line",
            )
            assert "POST /v1/messages 201" in said and "key=writer" in said
            assert writer not in said and reader not in said  # the name, never the secret
        log = tmp_path / "run.log"
        run = spawn_run(duetime_cmd("run", "--store", store, "--transport", transport), log)
        try:
            wait_until_serving(log)
            got = until(lambda: _received(transport, "orders"), 30, "the message at the receiver")
        finally:
            run.terminate()
            run.wait(30)
        assert [(m["id"], m["encoding"], m["body"], m["headers"]["customer-id"]) for m in got] == [
            ("order-42-reminder", "base64", payload["body_base64"], "c-7")
        ]
    finally:
        delete_redis_keys(prefix)


def _received(transport: str, queue: str) -> list[dict[str, object]]:
    done = run_cli("queues", "receive", queue, "--transport", transport, "--wait", "1")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.mark.slow
def test_a_key_over_its_rate_is_answered_429_with_retry_after(store: str, tmp_path: Path) -> None:
    """2,000 requests in about a second from one key of 100 a second: most are refused, each
    refusal says when to come back, and the key is served again once it waited."""
    key = make_key(store, "busy", "read")
    with serving(store, tmp_path) as port:
        answers: list[tuple[int, str | None]] = []

        def hammer() -> None:
            with Api(port, key) as api:
                for _ in range(500):
                    a = api.call("GET", "/v1/messages/none")
                    answers.append((a.status, a.headers.get("retry-after")))

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - began
        refused = [after for status, after in answers if status == 429]
        assert len(answers) == 2000 and {s for s, _ in answers} == {404, 429}
        # at most a second's burst and the rate over the time it took were let through
        assert len(refused) >= 2000 - 100 * (took + 1), (len(refused), took)
        assert all(after is not None and int(after) >= 1 for after in refused)
        time.sleep(1.1)
        assert once(port, "GET", "/v1/stats", key).status == 200


def test_a_revoked_key_is_refused_within_two_seconds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    key = make_key(url, "leaving", "read")
    make_key(url, "staying", "read")
    with serving(url, tmp_path) as port:
        assert once(port, "GET", "/v1/stats", key).status == 200
        assert run_cli("api-keys", "revoke", "leaving", "--store", url).returncode == 0
        until(lambda: once(port, "GET", "/v1/stats", key).status == 401, 4, "the revoked key refused")
        listed = run_cli("api-keys", "list", "--json", "--store", url)
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["name"], r["revoked_at"] is not None) for r in rows] == [
            ("leaving", True),
            ("staying", False),
        ]
        assert key not in listed.stdout and key[len("dtk_") + 4 :] not in listed.stdout


def test_with_json_logs_each_request_is_one_object_with_its_parts_as_fields(tmp_path: Path) -> None:
    """`duetime serve --log-format json`: a request's line is a JSON object a collector counts
    by (method, path, status, ms, key), without the query string or the key's secret."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    key = make_key(url, "collector", "read")
    with serving(url, tmp_path, "--log-format", "json") as port:
        assert once(port, "GET", "/v1/stats?customer=c-7", key).status == 200

        def request_lines() -> list[dict[str, object]]:
            text = next(tmp_path.glob(f"serve-{port}-*.log")).read_text()
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
            return [e for e in entries if e.get("path") == "/v1/stats"]

        [entry] = until(request_lines, 10, "the request's log line")
        assert {k: entry[k] for k in ("method", "path", "status", "key", "logger")} == {
            "method": "GET",
            "path": "/v1/stats",
            "status": 200,
            "key": "collector",
            "logger": "duetime.api",
        }
        assert isinstance(entry["ms"], float) and entry["message"].startswith("GET /v1/stats 200 ")
        said = json.dumps(entry)
        assert "c-7" not in said and key not in said


def test_other_machines_are_let_in_only_once_the_store_holds_a_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    refused = run_cli("serve", "--store", url, "--host", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "holds no API key" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    key = make_key(url, "remote", "read")
    with serving(url, tmp_path, "--host", "0.0.0.0") as port:
        assert once(port, "GET", "/v1/stats", key).status == 200
        assert once(port, "GET", "/v1/stats").status == 401
        assert once(port, "GET", "/healthz").status == 200  # health needs no key


def test_the_served_document_is_the_committed_one_and_valid(tmp_path: Path) -> None:
    from openapi_spec_validator import validate

    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    with serving(url, tmp_path) as port:
        served = once(port, "GET", "/openapi.json").body
    committed = json.loads((ROOT / "docs" / "reference" / "openapi.json").read_text())
    assert served == committed, "docs/reference/openapi.json is stale: duetime serve --openapi > it"
    validate(served)
    printed = run_cli("serve", "--openapi")
    assert json.loads(printed.stdout) == served


def test_tls_is_served_with_the_certificate_given(tmp_path: Path) -> None:
    """`--tls-cert` and `--tls-key`: HTTPS directly, checked by curl against the test's own CA."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    key = make_key(url, "tls", "read")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
         "-out", str(tmp_path / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    tls = ("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"))
    with serving(url, tmp_path, *tls) as port:
        done = subprocess.run(
            ["curl", "-sS", "--cacert", str(tmp_path / "cert.pem"), "-H", f"Authorization: Bearer {key}",
             f"https://127.0.0.1:{port}/v1/stats"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["total"] == 0
        plain = subprocess.run(
            ["curl", "-sS", f"http://127.0.0.1:{port}/healthz"], capture_output=True, text=True, timeout=30
        )
        assert plain.returncode != 0 or "ok" not in plain.stdout  # no plain HTTP on the TLS port
    refused = run_cli("serve", "--store", url, "--tls-cert", str(tmp_path / "cert.pem"), "--port", "0")
    assert refused.returncode != 0 and "--tls-key" in refused.stderr and "Traceback" not in refused.stderr


def test_api_keys_refuse_bad_input_in_one_line_and_store_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    make_key(url, "taken", "read")
    for args, words in [
        (("create", "bad name"), "letters, digits"),
        (("create", "k", "--scope", "admin"), "schedule, read, manage"),
        (("create", "k", "--rate", "0"), "requests a second"),
        (("create", "taken"), "exists; revoke it first"),
        (("revoke", "nobody"), "no API key 'nobody'"),
    ]:
        done = run_cli("api-keys", *args, "--store", url)
        said = done.stderr.strip()
        assert done.returncode == 1 and words in said, said
        assert len(said.splitlines()) == 1 and "Traceback" not in said and not done.stdout
    listed = run_cli("api-keys", "list", "--json", "--store", url).stdout.splitlines()
    assert [json.loads(line)["name"] for line in listed] == ["taken"]


def test_servers_sharing_a_port_each_answer_on_it(tmp_path: Path) -> None:
    """`--share-port`: a second `duetime serve` on the same port starts, and both answer (a
    second without it is refused in one line)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    port = free_port()
    with serving(url, tmp_path, "--share-port", port=port), serving(url, tmp_path, "--share-port", port=port):
        assert all(once(port, "GET", "/healthz").status == 200 for _ in range(20))
        refused = run_cli("serve", "--store", url, "--port", str(port))
        assert refused.returncode == 1 and "is in use" in refused.stderr and "Traceback" not in refused.stderr


def _children(pid: int) -> set[int]:
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = task / "children"
        if children.exists():
            found |= {int(c) for c in children.read_text().split()}
    return found


def _gone(pids: set[int]) -> bool:
    return not any(Path(f"/proc/{p}").exists() and "Z" not in _state(p) for p in pids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_workers_share_the_port_and_end_with_the_command_however_it_ends(tmp_path: Path) -> None:
    """`--workers 2`: two server processes answer on one port, each request stored once; SIGTERM
    ends both and the command exits 0; SIGKILL of the command ends them too; a worker killed ends
    the other, and the command exits with its status (137); a store that cannot be opened is said
    once, and the command exits 1; `--port 0` is refused before anything starts."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    for how in ("SIGTERM", "SIGKILL", "a worker's SIGKILL"):
        port = free_port()
        log = tmp_path / f"serve-{how}.log"
        with log.open("wb") as out:
            command = subprocess.Popen(
                duetime_cmd("serve", "--store", url, "--port", str(port), "--workers", "2"),
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        try:
            until(lambda log=log: log.read_text().count("HTTP API of") == 2, 60, "both workers to start")
            workers = _children(command.pid)
            assert len(workers) == 2, log.read_text()
            ids = [f"w-{how.replace(' ', '-')}-{i}" for i in range(40)]
            for i in ids:  # a connection each: the kernel spreads them over both workers
                made = once(
                    port,
                    "POST",
                    "/v1/messages",
                    body={"id": i, "destination": "q", "delay": "1h", "body": "b"},
                )
                assert made.status == 201, made.body
            assert {once(port, "GET", f"/v1/messages/{i}").status for i in ids} == {200}
            if how == "SIGTERM":
                command.terminate()
                assert command.wait(30) == 0, log.read_text()[-2000:]
            elif how == "SIGKILL":
                command.kill()
                command.wait(10)
            else:
                killed = min(workers)
                os.kill(killed, signal.SIGKILL)
                assert command.wait(40) == 137, log.read_text()[-2000:]
                assert f"worker {killed} ended (killed by SIGKILL); stopping the others" in log.read_text()
            until(lambda workers=workers: _gone(workers), 15, f"the workers {workers} to end after {how}")
        finally:
            if command.poll() is None:
                command.kill()
                command.wait()
        said = log.read_text()
        assert "Traceback" not in said and "2 workers serve on port" in said, said[-2000:]
    missing = run_cli(
        "serve", "--store", f"sqlite:///{tmp_path / 'none.db'}", "--port", str(free_port()), "--workers", "2"
    )
    assert missing.returncode == 1 and missing.stderr.count("There is no SQLite store") == 1, missing.stderr
    assert "Traceback" not in missing.stderr
    no_port = run_cli("serve", "--store", url, "--port", "0", "--workers", "2")
    assert no_port.returncode == 2 and "--workers needs a port" in no_port.stderr, no_port.stderr
    assert "HTTP API of" not in no_port.stderr and "Traceback" not in no_port.stderr
