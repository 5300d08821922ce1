"""The dashboard attacked as producers and other sites would attack it, in Debian's Chromium.

Markup and script go into every field a producer controls (destination, id, header names and
values, body, group, and through the destination the error text); every page is opened and every
confirmation answered "Cancel". Nothing may run, nothing may change. Then the forms of another
site (also through a reverse proxy that adds a bearer token to every request), oversized and
malformed bodies, and a dashboard without a password.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from duetime import DelayedMessage, TransactionMode
from duetime.backends.postgres import SyncPostgresStore
from tests.conftest import run_cli
from tests.dashboard_process import PASSWORD, basic, dashboard, request, stop
from tests.integration.test_dashboard import errors_in_queue, ok
from tests.services import free_port, postgres_schema

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.slow

ENDPOINT = "shop"
RUN = "alert('pwned')"
#: One string that breaks out of a JavaScript string, an HTML attribute, an element and a <pre>.
EVIL = f'x\'+{RUN}+\'"><img src=x onerror="{RUN}"></pre></td><script>{RUN}</script>'


@pytest.fixture(scope="module")
def hostile() -> Iterator[dict[str, Any]]:
    """A store holding hostile messages (one due later in each field) and an error queue holding
    two whose destinations are the attack (dead-lettered by a real `duetime run --burst`)."""
    with postgres_schema() as url:
        ok("setup", "--store", url, "--endpoint", ENDPOINT)
        store = SyncPostgresStore.from_url(url)
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        later = [
            DelayedMessage.create(
                EVIL,
                EVIL.encode(),
                delay=timedelta(hours=1),
                headers={f"h{EVIL}": EVIL, "plain": EVIL},
                group=EVIL,
                message_id=f"id{EVIL}",
            ),
            DelayedMessage.create("orders", b"ok", delay=timedelta(hours=2)),
        ]
        lost = [
            DelayedMessage.create(EVIL, EVIL.encode(), delay=0, headers={EVIL: EVIL}),
            DelayedMessage.create(f"two{EVIL}", b"\xff\x00 binary", delay=0),
        ]
        store.store_many([*later, *lost])
        burst = run_cli("run", "--store", url, "--endpoint", ENDPOINT, "--burst", timeout=120)
        assert burst.returncode == 0, burst.stderr
        assert len(errors_in_queue(url)) == 2
        yield {"url": url, "store": store, "later": later, "lost": lost}
        store.close()


class Watched:
    """A page whose dialogs are recorded and answered "Cancel"."""

    def __init__(self, browser: Any, **context: Any) -> None:
        self.page = browser.new_context(viewport={"width": 1280, "height": 900}, **context).new_page()
        self.dialogs: list[tuple[str, str]] = []
        self.page.on("dialog", self._answer)

    def _answer(self, dialog: Any) -> None:
        self.dialogs.append((dialog.type, dialog.message))
        dialog.dismiss()

    def ran(self) -> list[str]:
        """What the attack managed to run: alerts, and its marker on the page's window."""
        alerts = [message for kind, message in self.dialogs if kind != "confirm"]
        marker = self.page.evaluate("() => typeof window.pwned === 'undefined' ? '' : 'window.pwned'")
        return alerts + ([marker] if marker else [])


def test_markup_and_script_in_every_field_never_run_and_a_cancelled_confirmation_changes_nothing(
    hostile: dict[str, Any], browser: Any
) -> None:
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        watched = Watched(browser, http_credentials={"username": "duetime", "password": PASSWORD})
        page = watched.page
        base = f"http://127.0.0.1:{port}"
        evil_id = hostile["later"][0].message_id
        answer = page.goto(f"{base}/")
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["referrer-policy"]
        pages = [
            "/",
            "/messages",
            f"/messages?destination={quote(EVIL)}",
            f"/messages?group={quote(EVIL)}&due_after={quote(EVIL)}",
            f"/message?id={quote(evil_id)}",
            "/errors",
            f"/errors?destination={quote(EVIL)}",
        ]
        for path in pages:
            page.goto(base + path)
            page.wait_for_load_state("load")
            assert watched.ran() == [], path
        # the message page shows the attack as text, every character of it
        page.goto(f"{base}/message?id={quote(evil_id)}")
        assert page.inner_text("#body") == EVIL
        assert EVIL in page.inner_text("#headers") and EVIL in page.inner_text("#fields")

        # every button that asks first, answered "Cancel": nothing changes, nothing runs
        page.goto(f"{base}/errors")
        for i in range(page.locator("#by-destination button.danger").count()):
            page.goto(f"{base}/errors")
            page.locator("#by-destination button.danger").nth(i).click()
        page.goto(f"{base}/errors")
        page.locator("#errors input[type=checkbox]").first.check()
        page.click("button[name=discard-selected]")
        page.goto(f"{base}/messages")
        for i in range(page.locator("#messages button[name=cancel]").count()):
            page.goto(f"{base}/messages")
            page.locator("#messages button[name=cancel]").nth(i).click()
        confirmations = [message for kind, message in watched.dialogs if kind == "confirm"]
        assert len(confirmations) == 5, watched.dialogs
        assert any(EVIL in message for message in confirmations)  # shown as text, whole
        assert watched.ran() == []
        assert len(errors_in_queue(hostile["url"])) == 2
        assert all(hostile["store"].get(m.message_id) is not None for m in hostile["later"])

        # and answered "OK", the same button does what it says, for that destination alone
        page.goto(f"{base}/errors")
        page.once("dialog", lambda dialog: dialog.accept())
        watched.page.remove_listener("dialog", watched._answer)
        row = page.locator("#by-destination tr").filter(has_text="two")
        row.locator("button.danger").click()
        page.wait_for_load_state("load")
        assert "discarded 1" in page.inner_text("#note")
        left = errors_in_queue(hostile["url"])
        assert [e["id"] for e in left] == [hostile["lost"][0].message_id]
    finally:
        stderr = stop(board)
    assert "Traceback" not in stderr, stderr


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    return request(port, path, data=body, headers=headers, timeout=30)


def test_another_sites_form_is_refused_also_through_a_proxy_that_adds_a_bearer_token(
    hostile: dict[str, Any], browser: Any
) -> None:
    """asgi-csrf, used before, skipped its check for any request with ``Authorization: Bearer``:
    exactly what the README's reverse proxy adds to every request."""
    store = hostile["store"]
    victim = hostile["later"][1]
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        for context in (
            {"extra_http_headers": {"Authorization": f"Bearer {PASSWORD}"}},  # the proxy's way
            {"http_credentials": {"username": "duetime", "password": PASSWORD}},  # basic auth
        ):
            forger = browser.new_context(**context).new_page()
            forger.set_content(
                f'<form method="post" action="http://127.0.0.1:{port}/actions/cancel">'
                f'<input name="endpoint" value="{ENDPOINT}"><input name="id" value="{victim.message_id}">'
                '<input name="csrftoken" value="guess"><button id="go">win a prize</button></form>'
            )
            with forger.expect_navigation():
                forger.click("#go")
            assert "another site" in forger.content()
            assert store.get(victim.message_id) is not None
        # a script with the bearer token but without a page's token: refused too
        bearer = {"Authorization": f"Bearer {PASSWORD}", "Content-Type": "application/x-www-form-urlencoded"}
        form = f"endpoint={ENDPOINT}&id={quote(victim.message_id)}".encode()
        status, text = _post(port, "/actions/cancel", form, bearer)
        assert status == 403 and "did not match" in text
        status, text = _post(port, "/actions/cancel", form, {**bearer, "Origin": "https://evil.example"})
        assert status == 403 and "another site" in text
        assert store.get(victim.message_id) is not None
    finally:
        stop(board)


def _send_endlessly(port: int, framing: str) -> tuple[str, int]:
    """POST a body that never ends (as 1 MB pieces, up to 400 MB); the answer and how many
    megabytes had been sent when it came, which must be long before the end."""
    import select
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST /actions/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n\r\n".encode()
        )
        piece = b"x" * (1024 * 1024)
        chunked = framing.startswith("Transfer")
        sent = 0
        try:
            while sent < 400 and not select.select([sock], [], [], 0)[0]:
                sock.sendall(b"100000\r\n" + piece + b"\r\n" if chunked else piece)
                sent += 1
        except OSError:
            pass  # refused and closed while we still sent: what we want
        answer = b""
        try:  # the whole answer: its head may come in a piece of its own
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except OSError as error:
            return answer.decode(errors="replace") or str(error), sent
        return answer.decode(errors="replace"), sent


def _length(answer: bytes) -> int:
    """An HTTP answer's Content-Length, once its head has come (0 before, or without one)."""
    head = answer.split(b"\r\n\r\n", 1)[0].decode(errors="replace").lower()
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip() == "content-length" and value.strip().isdigit():
            return int(value)
    return 0


def test_oversized_and_malformed_bodies_are_short_answers_and_one_log_line(hostile: dict[str, Any]) -> None:
    port = free_port()
    board = dashboard(hostile["url"], port, password=None)  # no login: anyone may send these
    try:
        for framing in ("Content-Length: 419430400", "Transfer-Encoding: chunked"):  # 400 MB, or unsaid
            answer, megabytes = _send_endlessly(port, framing)
            assert answer.startswith("HTTP/1.1 413") and "at most 256 KB" in answer, answer
            # answered after the first megabytes, however busy the machine: never read to the end
            assert megabytes <= 16, (framing, megabytes)
        for content_type, body in (
            ("multipart/form-data", b"--x\r\n\r\nv\r\n--x--"),  # no boundary
            ("multipart/form-data; boundary=x", b"--x\r\nX-Nothing: 1\r\n\r\nv\r\n--x--\r\n"),
        ):
            status, text = _post(port, "/actions/cancel", body, {"Content-Type": content_type})
            assert status == 400 and text.startswith("Could not read the form"), (status, text)
        status, text = _post(
            port,
            "/actions/cancel",
            b"id=%ff%fe&endpoint=\xff\xfe",
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert status in (400, 403), (status, text)  # never a 500
        assert request(port, "/healthz")[0] == 200
    finally:
        stderr = stop(board)
    assert "Traceback" not in stderr and "refused: Could not read the form" in stderr, stderr


def test_without_a_password_contents_stay_hidden_and_the_network_is_refused(hostile: dict[str, Any]) -> None:
    evil_id = quote(hostile["later"][0].message_id)
    port = free_port()
    board = dashboard(hostile["url"], port, password=None)
    try:
        status, html = request(port, f"/message?id={evil_id}")
        assert status == 200 and 'id="hidden"' in html and 'id="body"' not in html
        assert "onerror" not in html.replace("onerror=&#34;", "")  # the id is shown, escaped
        status, html = request(port, "/errors")
        assert status == 200 and "stack and headers" not in html
    finally:
        stop(board)
    port = free_port()
    board = dashboard(hostile["url"], port, "--show-contents", password=None)
    try:
        status, html = request(port, f"/message?id={evil_id}")
        assert status == 200 and 'id="body"' in html
    finally:
        stop(board)
    refused = run_cli("dashboard", "--store", hostile["url"], "--host", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode == 1 and "no DUETIME_DASHBOARD_PASSWORD is set" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr  # bad setup: one line
    assert "--allow-no-password" in refused.stderr and "Traceback" not in refused.stderr
    port = free_port()
    board = subprocess.Popen(
        [*dashboard_cmd(hostile["url"], port), "--host", "0.0.0.0", "--allow-no-password"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        from tests.services import until

        until(lambda: request(port, "/healthz")[0] == 200, 30, "the dashboard on 0.0.0.0")
    finally:
        stop(board)


def dashboard_cmd(url: str, port: int) -> list[str]:
    from tests.conftest import duetime_cmd

    return duetime_cmd("dashboard", "--store", url, "--endpoint", ENDPOINT, "--port", str(port))


def test_a_bearer_token_still_logs_a_script_in(hostile: dict[str, Any]) -> None:
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        assert request(port, "/", auth=f"Bearer {PASSWORD}")[0] == 200
        assert request(port, "/", auth=basic("duetime", "wrong"))[0] == 401
    finally:
        stop(board)


def test_guessing_the_password_is_throttled_logged_and_counted(hostile: dict[str, Any]) -> None:
    """Was 2,000 wrong passwords a second, none logged. Now ten a minute from one address: then
    429 with Retry-After, the right password too (a guesser learns nothing), each wrong one a log
    line and a count in /metrics."""
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        from tests.services import until

        until(lambda: request(port, "/healthz")[0] == 200, 30, "the dashboard")
        answers = [request(port, "/", auth=basic("duetime", f"guess{i}"))[0] for i in range(30)]
        assert answers[:10] == [401] * 10 and set(answers[10:]) == {429}, answers
        assert request(port, "/", auth=basic("duetime", PASSWORD))[0] == 429
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/", headers={"Authorization": f"Bearer {PASSWORD}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        with refused.value:  # it holds the connection
            assert refused.value.code == 429 and 50 <= int(refused.value.headers["Retry-After"]) <= 60
        status, counts = request(port, "/metrics")
        assert status == 200, counts
        assert "duetime_dashboard_login_failures_total 10\n" in counts, counts
        assert "duetime_dashboard_logins_refused_total 22\n" in counts, counts
    finally:
        stderr = stop(board)
    said = [line for line in stderr.splitlines() if "wrong credentials from 127.0.0.1" in line]
    assert len(said) == 10 and "it now waits" in said[-1], stderr
    assert PASSWORD not in stderr and "guess" not in stderr


def _ask(port: int, auth: str, **headers: str) -> tuple[int, list[str]]:
    """The status and the cookies set by ``/`` asked with ``auth`` and ``headers``."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Authorization": auth, **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.status, answer.headers.get_all("Set-Cookie") or []
    except urllib.error.HTTPError as error:
        with error:
            return error.code, []


def test_guessers_on_rotating_addresses_never_lock_the_real_user_out(hostile: dict[str, Any]) -> None:
    """Was: at 20 wrong guesses a second, each with an X-Forwarded-For of its own (uvicorn
    believed it from 127.0.0.1), the right password got in 2 times of 18 and every guess was
    logged under the address it made up. Now the address is the connection's, so the guesses
    are one client's and wait; and a browser that logged in before keeps a way in of its own,
    however the others are throttled."""
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        from tests.services import until

        until(lambda: request(port, "/healthz")[0] == 200, 30, "the dashboard")
        status, cookies = _ask(port, basic("duetime", PASSWORD))
        [known] = [c.split(";", 1)[0] for c in cookies if c.startswith("duetime_known=")]
        assert status == 200
        guesses = [
            _ask(port, basic("duetime", f"guess{i}"), **{"X-Forwarded-For": f"10.9.{i // 250}.{i % 250}"})[0]
            for i in range(150)
        ]
        assert guesses[:10] == [401] * 10 and set(guesses[10:]) == {429}, guesses  # one client
        right = [_ask(port, basic("duetime", PASSWORD), Cookie=known)[0] for _ in range(18)]
        assert right == [200] * 18
        forged = known.split(".")[0] + ".0000"  # a cookie the dashboard did not make counts for nothing
        assert _ask(port, basic("duetime", PASSWORD), Cookie=forged)[0] == 429
    finally:
        stderr = stop(board)
    assert "10.9." not in stderr and "wrong credentials from 127.0.0.1" in stderr


def test_behind_a_named_proxy_each_forwarded_address_is_its_own_client(hostile: dict[str, Any]) -> None:
    """With ``--forwarded-allow-ips 127.0.0.1`` (nginx on this host) the address in
    ``X-Forwarded-For`` is the client: one person's wrong guesses lock out only that person, and
    the log names their address."""
    port = free_port()
    board = dashboard(hostile["url"], port, "--forwarded-allow-ips", "127.0.0.1")
    try:
        from tests.services import until

        until(lambda: request(port, "/healthz")[0] == 200, 30, "the dashboard")
        guesser = [
            _ask(port, basic("duetime", f"guess{i}"), **{"X-Forwarded-For": "10.9.0.1"})[0] for i in range(12)
        ]
        assert guesser[:10] == [401] * 10 and set(guesser[10:]) == {429}, guesser
        assert _ask(port, basic("duetime", PASSWORD), **{"X-Forwarded-For": "10.9.0.2"})[0] == 200
    finally:
        stderr = stop(board)
    assert "wrong credentials from 10.9.0.1" in stderr and "10.9.0.2" not in stderr, stderr


def test_many_requests_for_a_message_with_huge_headers_stay_bounded(hostile: dict[str, Any]) -> None:
    """Twenty requests at once for a message with a million headers took the dashboard to 550 MB
    and /healthz to 5.4 s. Its pages are now prepared a few at a time, holding only what they
    show: the memory a few pages take, /healthz answering as usual, each page saying how many
    headers it left out, and a request that waits too long for its turn told the dashboard is busy
    (503, Retry-After). (300,000 headers here, to keep the test short.)"""
    import threading

    store = hostile["store"]
    many = DelayedMessage.create(
        "orders",
        b"big",
        delay=timedelta(hours=5),
        headers={f"h{i:06d}": "v" * 20 for i in range(300_000)},
        message_id="many-headers",
    )
    store._insert([many])  # over the headers' limit: as a store holds one kept from before the limit
    port = free_port()
    board = dashboard(hostile["url"], port)
    try:
        from tests.services import until

        until(lambda: request(port, "/healthz")[0] == 200, 30, "the dashboard")
        pages: list[tuple[int, str]] = []

        def open_page() -> None:  # they wait their turn: longer than request()'s 10 s
            asked = urllib.request.Request(
                f"http://127.0.0.1:{port}/message?id=many-headers",
                headers={"Authorization": basic("duetime", PASSWORD)},
            )
            try:
                with urllib.request.urlopen(asked, timeout=120) as answer:
                    pages.append((answer.status, answer.read().decode()))
            except urllib.error.HTTPError as error:
                with error:  # it holds the connection
                    pages.append((error.code, error.read().decode()))
            except OSError as error:
                pages.append((0, str(error)))

        started = time.monotonic()
        open_page()  # one alone: what a page costs on this machine now
        one_page = time.monotonic() - started
        pages.clear()
        threads = [threading.Thread(target=open_page) for _ in range(20)]
        for thread in threads:
            thread.start()
        slowest = 0.0
        while any(thread.is_alive() for thread in threads):
            started = time.monotonic()
            assert request(port, "/healthz")[0] == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.2)
        for thread in threads:
            thread.join()
        peak_kb = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{board.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:")
            )
        )
    finally:
        stop(board)
        store.cancel("many-headers")
    served = [html for status, html in pages if status == 200]
    busy = [html for status, html in pages if status == 503]
    assert len(pages) == 20 and len(served) + len(busy) == 20 and len(served) >= 2, pages
    assert all("and 299,800 more headers, not shown" in html for html in served)
    others = [html for html in busy if not html.startswith("Busy: other message pages are being prepared")]
    assert others == []  # a page that waited its turn is never told the store was too slow
    # a page's headers are decoded holding the GIL, so /healthz may wait for a few of them (the
    # ones being prepared at once) on a loaded machine, never for twenty
    assert slowest < max(4.0, 4 * one_page), (slowest, one_page)
    assert peak_kb < 400_000, f"the dashboard peaked at {peak_kb // 1024} MB"
