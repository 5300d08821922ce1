"""The dashboard in a real browser (Debian's Chromium, driven by Playwright; nothing downloaded):
a PostgreSQL store delivering into its own queue tables, a live dispatcher, and `duetime
dashboard` as an operator runs it. Every change made through the pages is checked in the store.

With ``DUETIME_SCREENSHOTS=folder`` the test also saves a screenshot of each page (the README's).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime import DelayedMessage, StoreNotReady, TransactionMode
from duetime.backends.postgres import SyncPostgresStore
from tests.conftest import duetime_cmd, run_cli
from tests.dashboard_process import PASSWORD, basic, dashboard, request, stop
from tests.integration.proxy import proxy_for
from tests.services import free_port, postgres_schema, until

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.slow

ENDPOINT = "shop"  # the dashboard helpers' default endpoint


def ok(*args: str) -> subprocess.CompletedProcess[str]:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    """Two messages for `orders` (an hour and two away), one for `refunds`, two dead-lettered (their
    queue was never declared) by a real dispatcher, which keeps running; and the dashboard."""
    with postgres_schema() as url:
        ok("setup", "--store", url, "--endpoint", ENDPOINT, "-q", "orders", "-q", "refunds")
        store = SyncPostgresStore.from_url(url)
        store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
        a = DelayedMessage.create(
            "orders", b'{"order": 1}', delay=timedelta(hours=1), headers={"kind": "reminder"}
        )
        b = DelayedMessage.create("orders", b'{"order": 2}', delay=timedelta(hours=2))
        c = DelayedMessage.create("refunds", b"r", delay=timedelta(hours=3))
        lost = [DelayedMessage.create("gone-queue", f"lost {i}".encode(), delay=0) for i in range(2)]
        store.store_many([a, b, c, *lost])
        dispatcher = subprocess.Popen(
            duetime_cmd("run", "--store", url, "--endpoint", ENDPOINT),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = free_port()
        board = None
        try:
            until(lambda: store.counts(store_now()).total == 3, 30, "the two lost messages dead-lettered")
            board = dashboard(url, port)
            yield {"url": url, "store": store, "port": port, "a": a, "b": b, "c": c, "lost": lost}
        finally:
            if board is not None:
                stop(board)
            dispatcher.send_signal(signal.SIGTERM)
            dispatcher.wait(timeout=30)
            store.close()


def store_now() -> Any:
    from duetime.clock import SYSTEM

    return SYSTEM.now()


def page_for(browser: Any, *, login: bool = True) -> Any:
    credentials = {"username": "duetime", "password": PASSWORD} if login else None
    context = browser.new_context(http_credentials=credentials, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    return page


def screenshot(page: Any, name: str) -> None:
    folder = os.environ.get("DUETIME_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"dashboard-{name}.png"), full_page=True)


def errors_in_queue(url: str) -> list[dict[str, Any]]:
    found = ok("errors", "list", "--json", "--store", url, "--endpoint", ENDPOINT)
    return [json.loads(line) for line in found.stdout.splitlines() if line.strip()]


def test_the_overview_shows_the_backlog_the_live_dispatcher_and_charts(
    world: dict[str, Any], browser: Any
) -> None:
    page = page_for(browser)
    until(
        lambda: page.goto(f"http://127.0.0.1:{world['port']}/") and page.locator("svg.chart").count() >= 1,
        20,
        "a chart",
    )
    assert page.inner_text("#stored") == "3"
    dispatchers = page.inner_text("#dispatchers")
    assert "live" in dispatchers and "exactly-once" in dispatchers
    assert "orders" in page.inner_text("#destinations") and "refunds" in page.inner_text("#destinations")
    assert "closed" in page.inner_text("#breakers")
    assert "correct horse" not in page.content()  # no password anywhere on the page
    screenshot(page, "overview")


def test_search_reschedule_send_now_and_cancel_each_land_in_the_store(
    world: dict[str, Any], browser: Any
) -> None:
    store: SyncPostgresStore = world["store"]
    a, b = world["a"], world["b"]
    page = page_for(browser)
    page.goto(f"http://127.0.0.1:{world['port']}/messages?limit=1")  # paging: one a page, in due order
    seen = [page.locator("#messages tr[data-id]").get_attribute("data-id")]
    page.click("#next")
    seen.append(page.locator("#messages tr[data-id]").get_attribute("data-id"))
    assert seen == [a.message_id, b.message_id]
    page.goto(f"http://127.0.0.1:{world['port']}/messages")
    page.fill("input[name=id]", a.message_id)
    page.click("#search button[type=submit]")
    assert page.locator("#messages tr[data-id]").count() == 1
    row = page.locator(f"tr[data-id='{a.message_id}']")
    row.locator("input[name=when]").fill("3h")
    row.locator("button[name=reschedule]").click()
    assert f"rescheduled {a.message_id}" in page.inner_text("#note")
    moved = store.get(a.message_id)
    assert moved is not None
    assert abs((moved.due_at - store_now() - timedelta(hours=3)).total_seconds()) < 60

    page.goto(f"http://127.0.0.1:{world['port']}/messages?destination=orders")
    screenshot(page, "messages")
    page.locator(f"tr[data-id='{b.message_id}'] button[name=cancel]").click()
    assert f"cancelled {b.message_id}" in page.inner_text("#note")
    assert store.get(b.message_id) is None

    page.goto(f"http://127.0.0.1:{world['port']}/message?endpoint={ENDPOINT}&id={a.message_id}")
    assert page.inner_text("#body") == '{"order": 1}'
    assert "reminder" in page.inner_text("#headers")
    screenshot(page, "message")
    page.click("button[name=send-now]")
    assert "due now" in page.inner_text("#note")
    until(lambda: store.get(a.message_id) is None, 20, "the live dispatcher to deliver what was sent now")
    queues = json.loads(ok("stats", "--json", "--store", world["url"], "--endpoint", ENDPOINT).stdout)
    assert queues["queues"]["orders"] == 1


def test_the_error_queue_retries_one_and_discards_another(world: dict[str, Any], browser: Any) -> None:
    store: SyncPostgresStore = world["store"]
    first, second = world["lost"]
    page = page_for(browser)
    page.goto(f"http://127.0.0.1:{world['port']}/errors")
    assert page.locator("#errors tr[data-id]").count() == 2
    assert "gone-queue" in page.inner_text("#errors")
    page.locator(f"tr[data-id='{first.message_id}'] details").click()  # the reason, with the stack
    screenshot(page, "errors")
    page.check(f"input[value='{first.message_id}']")
    page.fill("input[name=in]", "1h")  # not due at once: the live dispatcher would dead-letter it again
    page.click("button[name=retry-selected]")
    assert "sent 1 back" in page.inner_text("#note")
    back = store.get(first.message_id)
    assert back is not None and back.destination == "gone-queue" and back.body == first.body
    assert [e["id"] for e in errors_in_queue(world["url"])] == [second.message_id]

    page.check(f"input[value='{second.message_id}']")
    page.click("button[name=discard-selected]")
    assert "discarded 1" in page.inner_text("#note")
    assert errors_in_queue(world["url"]) == []
    assert store.get(second.message_id) is None


def test_changes_without_login_or_without_the_pages_token_are_refused(
    world: dict[str, Any], browser: Any
) -> None:
    store: SyncPostgresStore = world["store"]
    c = world["c"]
    port = world["port"]
    form = f"endpoint={ENDPOINT}&id={c.message_id}".encode()
    assert request(port, "/actions/cancel", data=form)[0] == 401
    assert request(port, "/actions/cancel", data=form, auth=basic("duetime", "wrong"))[0] == 401
    status, text = request(port, "/actions/cancel", data=form, auth=basic("duetime", PASSWORD))
    assert status == 403 and "did not match" in text  # logged in, but no CSRF token

    anonymous = page_for(browser, login=False)  # the browser gets the login challenge, and no page
    try:
        assert anonymous.goto(f"http://127.0.0.1:{port}/").status == 401
    except playwright.Error as refused:
        assert "AUTH" in str(refused)

    # A page on another site posting to the dashboard: the browser sends the login, not the token.
    forger = page_for(browser)
    forger.set_content(
        f'<form method="post" action="http://127.0.0.1:{port}/actions/cancel">'
        f'<input name="endpoint" value="{ENDPOINT}"><input name="id" value="{c.message_id}">'
        '<button id="go">win a prize</button></form>'
    )
    with forger.expect_navigation():
        forger.click("#go")
    assert "another site" in forger.content()
    assert store.get(c.message_id) is not None


def test_read_only_hides_every_action_and_refuses_changes(world: dict[str, Any], browser: Any) -> None:
    c = world["c"]
    for extra, password in ((["--read-only"], PASSWORD), ([], None)):
        port = free_port()
        board = dashboard(world["url"], port, *extra, password=password)
        try:
            page = page_for(browser, login=password is not None)
            page.goto(f"http://127.0.0.1:{port}/messages")
            assert page.locator("#messages tr[data-id]").count() >= 1
            assert page.locator("button").filter(has_text="Cancel").count() == 0
            assert "Read-only" in page.inner_text("#read-only")
            page.goto(f"http://127.0.0.1:{port}/errors")
            assert page.locator("button").filter(has_text="Retry").count() == 0
            token = page.context.cookies()[0]["value"] if page.context.cookies() else ""
            auth = basic("duetime", PASSWORD) if password else None
            data = f"endpoint={ENDPOINT}&id={c.message_id}&csrftoken={token}".encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/actions/cancel",
                data=data,
                headers={"Cookie": f"csrftoken={token}", **({"Authorization": auth} if auth else {})},
            )
            try:
                urllib.request.urlopen(req, timeout=10)
                raise AssertionError("a read-only dashboard accepted a change")
            except urllib.error.HTTPError as refused:
                with refused:  # it holds the connection
                    assert refused.code == 403
            assert world["store"].get(c.message_id) is not None
        finally:
            stop(board)


def test_a_port_in_use_is_one_line(world: dict[str, Any]) -> None:
    result = run_cli("dashboard", "--store", world["url"], "--port", str(world["port"]))
    assert result.returncode == 1
    assert "port" in result.stderr and "in use" in result.stderr and "Traceback" not in result.stderr


def test_a_database_outage_is_a_one_line_answer_and_it_recovers() -> None:
    with postgres_schema() as url, proxy_for(url) as proxy:
        ok("setup", "--store", url, "--endpoint", ENDPOINT)
        port = free_port()
        board = dashboard(proxy.url(url), port, "--timeout", "2s")
        auth = basic("duetime", PASSWORD)
        try:
            assert request(port, "/", auth=auth)[0] == 200
            proxy.cut()
            status, text = request(port, "/", auth=auth)
            assert status == 503 and text.startswith("The store or the transport did not answer: "), text
            assert request(port, "/messages", auth=auth)[0] == 503
            assert request(port, "/healthz")[0] == 200  # the dashboard itself is fine
            proxy.restore()
            until(lambda: request(port, "/", auth=auth)[0] == 200, 30, "the dashboard to answer again")
            # a partition: nothing answers; the page said nothing at all until the browser gave up
            proxy.blackhole()
            started = time.monotonic()
            status, text = request(port, "/", auth=auth)
            assert status == 503 and "did not answer within 2 s" in text, text
            assert "Nothing was changed" in text and time.monotonic() - started < 10
            proxy.restore()
            until(lambda: request(port, "/", auth=auth)[0] == 200, 30, "the dashboard to answer again")
        finally:
            stderr = stop(board)
        assert "Traceback" not in stderr, stderr
        assert "dashboard: GET / failed: " in stderr  # the operator's log says why, on one line
        assert "dashboard: GET / did not answer within 2 s" in stderr


def test_ctrl_c_while_the_store_is_partitioned_still_ends_the_dashboard() -> None:
    """Ctrl-C closed the stores without a deadline, and Python then waited at exit for the thread
    stuck on the dead MariaDB connection: the dashboard never ended."""
    from tests.services import REDIS, mariadb_database

    with mariadb_database() as url, proxy_for(url) as proxy:
        ok("setup", "--store", url, "--endpoint", ENDPOINT)
        port = free_port()
        board = dashboard(proxy.url(url), port, "--transport", REDIS, "--timeout", "2s")
        auth = basic("duetime", PASSWORD)
        try:
            assert request(port, "/", auth=auth)[0] == 200
            proxy.blackhole()
            assert request(port, "/", auth=auth)[0] == 503  # a store call is now stuck in a thread
            stopping = time.monotonic()
            board.send_signal(signal.SIGINT)
            board.wait(timeout=30)
            assert time.monotonic() - stopping < 15
        finally:
            if board.poll() is None:
                board.kill()
            stderr = board.communicate(timeout=30)[1] or ""
            proxy.restore()
        assert "stopping did not finish within 7 s" in stderr, stderr[-2000:]


def test_several_endpoints_a_bearer_token_and_bad_options(world: dict[str, Any]) -> None:
    ok("setup", "--store", world["url"], "--endpoint", "billing")
    port = free_port()
    board = dashboard(world["url"], port, "--endpoint", "billing")  # with the fixture's ENDPOINT
    try:
        bearer = f"Bearer {PASSWORD}"
        status, page = request(port, "/?endpoint=billing", auth=bearer)
        assert status == 200 and "Overview of endpoint billing" in page
        assert 'option value="billing"' in page and f'option value="{ENDPOINT}"' in page  # the menu
        status, page = request(port, "/", auth=bearer)  # the first endpoint by default
        assert status == 200 and f"Overview of endpoint {ENDPOINT}" in page
        assert request(port, "/", auth="Bearer wrong")[0] == 401
    finally:
        stop(board)
    for option, value, said in (
        ("--sample-every", "soon", "Cannot read the duration 'soon'"),
        ("--sample-every", "0.1s", "--sample-every must be at least 1s"),
        ("--timeout", "soon", "Cannot read the duration 'soon'"),
        ("--timeout", "0s", "--timeout must be more than 0s and at most 1h"),
        ("--port", "99999", "65535"),
    ):
        result = run_cli("dashboard", "--store", world["url"], option, value)
        assert result.returncode != 0 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_the_dashboard_stats_and_the_metrics_agree_at_the_same_moment() -> None:
    """One store, one dispatcher with its metrics port, the dashboard: what is stored, what is
    due, how long the oldest due message has waited and how many were delivered read the same on
    all three once the store stands still."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    with postgres_schema() as url:
        ok("setup", "--store", url, "--endpoint", ENDPOINT, "-q", "orders")
        for i in range(5):
            ok("schedule", "orders", f"later {i}", "--in", "1h", "--store", url, "--endpoint", ENDPOINT)
        metrics, port = free_port(), free_port()
        board = dashboard(url, port)
        run = subprocess.Popen(
            duetime_cmd("run", "--store", url, "--endpoint", ENDPOINT, "--metrics-port", str(metrics)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            until(lambda: request(metrics, "/readyz")[0] == 200, 60, "the dispatcher serving")
            for i in range(4):
                ok("schedule", "orders", f"now {i}", "--in", "0s", "--store", url, "--endpoint", ENDPOINT)

            def looks() -> dict[str, tuple[object, ...]]:
                stats = json.loads(ok("stats", "--json", "--store", url, "--endpoint", ENDPOINT).stdout)
                samples = [
                    s
                    for family in text_string_to_metric_families(request(metrics, "/metrics")[1])
                    for s in family.samples
                    if s.labels.get("endpoint") == ENDPOINT
                ]
                # the backlog gauges appear with the first backlog refresh (every 10 s): absent until
                # then, which under load is after the first look (a KeyError here was the flake)
                scraped = {s.name: s.value for s in samples if "destination" not in s.labels}
                for name in (
                    "duetime_backlog_stored",
                    "duetime_backlog_due",
                    "duetime_backlog_oldest_due_age_seconds",
                ):
                    scraped.setdefault(name, -1.0)
                forwarded = sum(s.value for s in samples if s.name == "duetime_forwarded_total")
                page = request(port, f"/?endpoint={ENDPOINT}", auth=basic("duetime", PASSWORD))[1]

                def card(name: str) -> str:
                    found = re.search(rf'id="{name}">([^<]*)<', page)
                    return found.group(1) if found else "?"

                return {
                    "stored": (stats["stored"], int(scraped["duetime_backlog_stored"]), card("stored")),
                    "due": (stats["due"], int(scraped["duetime_backlog_due"]), card("due")),
                    "oldest due": (scraped["duetime_backlog_oldest_due_age_seconds"], card("oldest-due")),
                    "delivered": (
                        sum(d["forwarded"] for d in stats["dispatchers"]),
                        int(forwarded),
                        card("delivered"),
                    ),
                }

            expected = {
                "stored": (5, 5, "5"),
                "due": (0, 0, "0"),
                "oldest due": (0.0, "none due"),
                "delivered": (4, 4, "4"),
            }
            seen: list[dict[str, tuple[object, ...]]] = []

            def agree() -> bool:
                seen.append(looks())
                return seen[-1] == expected

            try:
                until(agree, 60, "stats, metrics and the dashboard to agree")
            except AssertionError:
                raise AssertionError(f"they did not agree: {seen[-1]}") from None
        finally:
            stop(board)
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=30)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_stops_the_dashboard_with_exit_0(tmp_path: Path, stop_signal: int) -> None:
    """As `duetime run`: a stop asked for is a clean stop (uvicorn raised the signal again after
    its shutdown, and the process died of it: 143 or 130, which a supervisor reads as a failure)."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    assert run_cli("setup", "--store", url, "--endpoint", ENDPOINT).returncode == 0
    process = dashboard(url, free_port())
    process.send_signal(stop_signal)
    assert process.wait(timeout=30) == 0, stop(process)


@pytest.mark.parametrize("broker", ["rabbitmq", "nats"])
def test_the_overview_shows_what_the_broker_holds_and_what_live_dispatchers_delivered(
    broker: str, browser: Any
) -> None:
    """With messages waiting in a broker's queue and one in the error queue, the overview showed
    neither, and "delivered" counted from when the dashboard started. Now: each destination's
    queue depth ("no queue" for one the broker lacks), the error queue's count (a non-default one,
    set by the environment) linking to its page, and what the live dispatchers delivered since
    they started and how late (a bound), from the first view."""
    import asyncio
    import concurrent.futures
    import uuid

    from duetime import open_transport
    from tests.services import NATS, RABBITMQ, require

    tag = uuid.uuid4().hex[:8]
    orders, nowhere, errors = f"orders-{tag}", f"nowhere-{tag}", f"err-{tag}"
    require(RABBITMQ if broker == "rabbitmq" else NATS)
    url = RABBITMQ if broker == "rabbitmq" else f"{NATS}?subject_prefix=duetime-dash-{tag}."

    async def on_broker(fill: bool) -> None:
        t: Any = open_transport(url)
        await t.start()
        try:
            if fill:
                for name in (orders, errors):
                    await t.declare(name)
                waiting = [DelayedMessage.create(orders, b"w", delay=0) for _ in range(3)]
                failed = DelayedMessage.create(errors, b"e", delay=0, message_id=f"failed-{tag}")
                assert await t.send_batch([*waiting, failed]) == [None] * 4
            else:
                for name in (orders, errors):
                    await t.delete(name)
        finally:
            await t.close()

    def on_broker_now(fill: bool) -> None:  # a thread of its own: Playwright's loop may run in this one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, on_broker(fill)).result()

    on_broker_now(fill=True)
    env = {"DUETIME_ERROR_QUEUE": errors, "DUETIME_TRANSPORT": url}
    try:
        with postgres_schema() as store_url:
            ok("setup", "--store", store_url, "--endpoint", ENDPOINT)
            store = SyncPostgresStore.from_url(store_url)
            store.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
            store.store_many(
                [
                    *(DelayedMessage.create(orders, b"now", delay=0) for _ in range(2)),
                    DelayedMessage.create(orders, b"later", delay=timedelta(hours=1)),
                    DelayedMessage.create(nowhere, b"later", delay=timedelta(hours=1)),
                ]
            )
            store.close()
            running = subprocess.Popen(
                duetime_cmd("run", "--store", store_url, "--endpoint", ENDPOINT),
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            port = free_port()
            try:
                until(
                    lambda: (
                        '"forwarded": 2'
                        in run_cli(
                            "stats", "--json", "--store", store_url, "--endpoint", ENDPOINT, env=env
                        ).stdout
                    ),
                    60,
                    "the dispatcher's heartbeat with its 2 deliveries",
                )
                board = dashboard(store_url, port, settings=env)
                try:
                    page = page_for(browser)
                    answer = page.goto(f"http://127.0.0.1:{port}/?endpoint={ENDPOINT}")
                    status, html = answer.status, page.content()
                    # the error page reads the error queue the environment names, not "error"
                    # content() does not wait: read the new page once it has loaded, not the
                    # empty document a slow answer leaves between the click and the load
                    with page.expect_navigation(wait_until="load"):
                        page.click("#error-count a")
                    errors_page = page.content()
                finally:
                    stop(board)
            finally:
                running.terminate()
                running.communicate(timeout=30)
        assert status == 200, html
        rows = {
            cells[0]: cells
            for cells in (
                re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
                for row in re.findall(r"<tr[^>]*>(.*?)</tr>", html.split('id="destinations"', 1)[1], re.S)
            )
            if cells
        }
        assert rows[orders][2].strip() == "5", rows[orders]  # 3 waiting, and the 2 delivered
        assert "no queue" in rows[nowhere][2], rows[nowhere]
        error_card = html.split('id="error-count"', 1)[1].split("</div>", 1)[0]
        assert f'/errors?endpoint={ENDPOINT}">1</a>' in error_card, error_card
        assert f"in the error queue <code>{errors}</code>" in html
        assert f"failed-{tag}" in errors_page, errors_page[-2000:]
        delivered = html.split('id="delivered-live"', 1)[1].split("</div>", 1)[0]
        assert ">2" in delivered and "1 live dispatcher since" in html, delivered
        # how late those 2 were, from the dispatcher's own counts: a bound, said as one
        late = html.split('id="lateness-p99"', 1)[1].split("</div>", 1)[0]
        assert re.search(r">≤ [\d.]+ (ms|s)$", late), late
    finally:
        on_broker_now(fill=False)


def test_the_overview_stands_when_the_broker_does_not_answer() -> None:
    """A transport that accepts the connection and never speaks: the overview still answers,
    within its time, with the store's figures and one line saying why the queues are missing."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections wait in the backlog, never answered
    broker = f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/"
    try:
        with postgres_schema() as url:
            ok("setup", "--store", url, "--endpoint", ENDPOINT)
            port = free_port()
            board = dashboard(url, port, "--transport", broker, "--timeout", "4s")
            try:
                started = time.monotonic()
                status, html = request(port, f"/?endpoint={ENDPOINT}", auth=basic("duetime", PASSWORD))
                took = time.monotonic() - started
            finally:
                stop(board)
    finally:
        silent.close()
    assert status == 200, html
    assert 'id="broker-problem"' in html and "could not read the queues" in html, html
    assert took < 4, took  # half the page's time for the broker, the rest to spare


def test_the_recurring_page_pauses_resumes_and_sends_one_now(world: dict[str, Any], browser: Any) -> None:
    """The schedules with their next tick and state; pause, resume and "send one now" go through
    the page's forms (with its CSRF token), and an id that is markup stays text."""
    from duetime.interfaces import ListQuery
    from duetime.recurring import cron
    from duetime.recurring.schedule import group_of, new_schedule

    store: SyncPostgresStore = world["store"]
    now = store_now()
    hostile = "<b>bold</b>"
    for schedule_id in ("monthly", hostile):
        store.add_schedule(
            new_schedule(schedule_id, "orders", cron("0 6 1 * *", zone="Europe/Paris"), now), now
        )
    try:
        page = page_for(browser)
        page.goto(f"http://127.0.0.1:{world['port']}/recurring?endpoint={ENDPOINT}")
        row = page.locator('#schedules tr[data-id="monthly"]')
        assert "0 6 1 * * in Europe/Paris" in row.inner_text() and "active" in row.inner_text()
        assert page.locator("#schedules b").count() == 0 and hostile in page.inner_text("#schedules")
        row.locator("button[name=pause]").click()
        assert "paused monthly" in page.inner_text(".note")
        assert (
            store.get_schedule("monthly").paused
            and store.list(ListQuery(group=group_of("monthly"))).messages == []
        )
        page.locator('#schedules tr[data-id="monthly"] button[name=resume]').click()
        assert not store.get_schedule("monthly").paused
        page.locator('#schedules tr[data-id="monthly"] button[name=trigger]').click()
        assert "sent one tick of monthly" in page.inner_text(".note")
        form = f"endpoint={ENDPOINT}&id=monthly".encode()  # logged in, no token: refused
        status, text = request(world["port"], "/recurring/pause", data=form, auth=basic("duetime", PASSWORD))
        assert status == 403 and "did not match" in text and not store.get_schedule("monthly").paused
    finally:
        for schedule_id in ("monthly", hostile):
            store.remove_schedule(schedule_id)


def test_the_audit_page_lists_changes_made_through_the_pages_and_keeps_markup_inert(
    world: dict[str, Any], browser: Any
) -> None:
    """A cancel made on the messages page is on the Audit page with the dashboard's user, through
    the dashboard, from the browser's address; a change typed at the command line by an actor whose
    name is markup shows that name as text, and nothing of it runs; the filter by action works."""
    store: SyncPostgresStore = world["store"]
    m = DelayedMessage.create("refunds", b"audit me", delay=timedelta(hours=5))
    store.store(m)
    hostile = "<img id=injected src=x onerror=\"document.title='pwned'\">"
    for verb in ("pause", "resume"):
        typed = run_cli("destinations", verb, "audited-queue", "--store", world["url"], "--endpoint", ENDPOINT,
                        env={"DUETIME_ACTOR": hostile})  # fmt: skip
        assert typed.returncode == 0, typed.stderr
    page = page_for(browser)
    page.goto(f"http://127.0.0.1:{world['port']}/messages?id={m.message_id}")
    page.locator(f"tr[data-id='{m.message_id}'] button[name=cancel]").click()
    assert f"cancelled {m.message_id}" in page.inner_text("#note")
    page.click("header a:text-is('Audit')")
    row = page.locator("#entries tr[data-id]").filter(has_text=m.message_id).first
    cells = row.locator("td").all_inner_texts()
    assert cells[1:6] == ["duetime", "dashboard", "127.0.0.1", "cancel", m.message_id]
    assert page.locator("#entries td.actor").filter(has_text="onerror").count() == 2
    assert hostile in page.inner_text("#entries")  # shown as text
    assert page.locator("#injected").count() == 0 and page.title() != "pwned"
    screenshot(page, "audit")
    page.select_option("select[name=action]", "pause")
    page.click("#filter button[type=submit]")
    assert set(page.locator("#entries tr[data-id] td:nth-child(5)").all_inner_texts()) == {"pause"}


def test_the_overview_shows_limits_and_pauses_and_pauses_and_resumes(
    world: dict[str, Any], browser: Any
) -> None:
    """Each destination's limit and pause beside it; Pause, Resume, Limit and Remove limit go
    through the page's forms (with its CSRF token) and record the dashboard's user; a bad rate
    is one line and changes nothing; a name that is markup stays text; a form without the token
    changes nothing."""
    from duetime.limits import Limit, Pause, Rate

    store: SyncPostgresStore = world["store"]
    hostile = "<b>x</b>*"
    store.set_limit(Limit("orders", Rate.parse("50/s")))
    store.pause_destination(Pause(hostile, "mallory", store_now(), "<i>why</i>"))
    try:
        page = page_for(browser)
        page.goto(f"http://127.0.0.1:{world['port']}/?endpoint={ENDPOINT}")
        row = page.locator('#destinations tr[data-destination="orders"]')
        assert "50/s" in row.inner_text()
        assert page.locator("#destinations b, #destinations i").count() == 0
        assert "<i>why</i>" in page.inner_text("#destinations")
        row.locator("input[name=reason]").fill("INC-7")
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button[name=pause]").click()
        assert "paused orders" in page.inner_text(".note")
        [paused] = [p for p in store.paused() if p.destination == "orders"]
        assert paused.by == "duetime (dashboard)" and paused.reason == "INC-7"
        assert "paused by duetime (dashboard)" in page.inner_text(
            '#destinations tr[data-destination="orders"]'
        )
        page.locator('#destinations tr[data-destination="orders"] button[name=resume]').click()
        assert "resumed orders" in page.inner_text(".note")
        assert [p for p in store.paused() if p.destination == "orders"] == []
        refunds = '#destinations tr[data-destination="refunds"]'
        page.locator(f"{refunds} input[name=rate]").fill("5/s")
        page.locator(f"{refunds} input[name=concurrency]").fill("2")
        page.locator(f"{refunds} button[name=limit]").click()
        assert "limited refunds to 5/s, 2 at once" in page.inner_text(".note")
        [limit] = [x for x in store.limits() if x.destination == "refunds"]
        assert limit.concurrency == 2 and limit.set_by == "duetime (dashboard)"
        page.locator(f"{refunds} input[name=rate]").fill("5/fortnight")
        page.locator(f"{refunds} button[name=limit]").click()
        assert "is not one duetime reads" in page.inner_text(".note")
        page.locator(f"{refunds} button[name=unlimit]").click()
        assert "removed the limit of refunds" in page.inner_text(".note")
        assert [x for x in store.limits() if x.destination == "refunds"] == []
        form = f"endpoint={ENDPOINT}&destination=orders".encode()  # logged in, no token: refused
        status, text = request(
            world["port"], "/destinations/pause", data=form, auth=basic("duetime", PASSWORD)
        )
        assert status == 403 and "did not match" in text and store.paused() != [] and len(store.paused()) == 1
    finally:
        store.remove_limit("orders")
        store.resume_destination(hostile)
        store.resume_destination("orders")


def test_the_dashboard_opened_as_a_library_object_serves_its_pages(tmp_path: Path) -> None:
    """What the command starts, without the command: the object opens the endpoints' stores, its
    app serves the overview of each, and closing it closes them. (On a thread of its own: the
    browser's sync API keeps an event loop running on this one.)"""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from duetime.dashboard.app import Dashboard
    from tests.unit.test_http_api import call

    url = f"sqlite:///{tmp_path / 'lib.db'}"
    for endpoint in ("shop", "billing"):
        assert run_cli("setup", "--store", url, "--endpoint", endpoint).returncode == 0

    async def go() -> None:
        board = await Dashboard.open(url, ["shop", "billing", "shop"], transport_url=url, read_only=True)
        try:
            assert list(board.stores) == ["shop", "billing"]
            page = await call(board.app(secret="s" * 32), "GET", "/?endpoint=billing", headers=[])
            assert page.status == 200 and b"billing" in page.raw
        finally:
            await board.close()
        with pytest.raises(StoreNotReady):
            await Dashboard.open(url, ["never-set-up"], transport_url=url)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()


def test_the_server_object_serves_as_the_command_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`DashboardServer`, which `duetime dashboard` only starts: the same refusals (bad values, the
    network without a password) and the pages served on its port until it is stopped."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from duetime.dashboard.server import DashboardServer
    from duetime.errors import ConfigurationError

    monkeypatch.delenv("DUETIME_DASHBOARD_PASSWORD", raising=False)
    url = f"sqlite:///{tmp_path / 'lib.db'}"
    assert run_cli("setup", "--store", url).returncode == 0
    with pytest.raises(ConfigurationError, match="--sample-every must be at least 1s"):
        DashboardServer(url, sample_every=0.5)
    with pytest.raises(ConfigurationError, match="no DUETIME_DASHBOARD_PASSWORD is set"):
        DashboardServer(url, host="0.0.0.0", port=free_port()).bind()
    port = free_port()
    server = DashboardServer(url, port=port, read_only=True)

    async def go() -> None:
        serving = asyncio.create_task(server.serve())
        try:
            await asyncio.to_thread(until, lambda: request(port, "/")[0] == 200, 20, "the pages")
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()
