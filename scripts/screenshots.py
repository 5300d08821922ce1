"""Make the documentation's pictures of the dashboard (docs/dashboard-*.png) and of the bulk
report (docs/report-*.png) from a real run.

    .venv/bin/python scripts/screenshots.py   # about three minutes; needs the dashboard and spark extras, chromium

A SQLite store gets a steady stream of messages due over the next minute and a half (and a few
for a queue that does not exist, which end in the error queue), `duetime run` delivers them
(writing its delivery log), `duetime dashboard` watches, and Chromium photographs each page once
the charts have a story. Then `duetime bulk report` reads the store and the delivery log, and its
HTML report's charts are saved as they are.
"""

from __future__ import annotations

import base64
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

from playwright.sync_api import sync_playwright

from duetime import DelayedMessage, TransactionMode
from duetime.audit import Action, Actor, Via, made
from duetime.backends.sqlite import SyncSqliteStore
from duetime.clock import SYSTEM
from duetime.recurring import cron, every
from duetime.recurring.schedule import new_schedule

ROOT = Path(__file__).resolve().parent.parent
PORT = 18765
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def duetime(*args: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "duetime", *args], **kw)  # type: ignore[call-overload,no-any-return]


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    url = f"sqlite:///{folder}/shop.db"
    subprocess.run(
        [sys.executable, "-m", "duetime", "setup", "--store", url, "-q", "orders", "-q", "invoices"],
        check=True,
    )
    store = SyncSqliteStore.from_url(url)
    store.initialize("duetime", TransactionMode.EXACTLY_ONCE)
    rng = random.Random(7)
    messages = [
        DelayedMessage.create(
            rng.choice(["orders", "invoices"]),
            b'{"order": %d}' % i,
            delay=timedelta(seconds=5 + 90 * (i / 6000) ** 1.5 + rng.random()),
            headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        )
        for i in range(6000)
    ]
    messages += [DelayedMessage.create("shipping", b"parcel %d" % i, delay=8) for i in range(3)]
    messages += [
        DelayedMessage.create("orders", b"later %d" % i, delay=timedelta(hours=2 + i)) for i in range(40)
    ]
    store.store_many(messages)
    now = SYSTEM.now()
    for schedule in (
        new_schedule("ping", "orders", every("10s"), now, body=b"ping"),
        new_schedule("close-invoices", "invoices", cron("0 9 * * MON-FRI", zone="Europe/Paris"), now),
        new_schedule(
            "monthly-report", "invoices", cron("0 6 1 * *", zone="America/New_York"), now, paused=True
        ),
    ):
        store.add_schedule(schedule, now)
    later = messages[-40:]  # the ones due in hours: what an operator changed (the Audit page)
    for actor, action, target, ids, detail in (
        (
            Actor("ada@ops-1", Via.CLI, "ops-1"),
            Action.RESCHEDULE,
            later[0].message_id,
            [later[0].message_id],
            "due in 3h",
        ),
        (
            Actor("key:billing", Via.HTTP_API, "10.2.0.14"),
            Action.CANCEL,
            later[1].message_id,
            [later[1].message_id],
            "",
        ),
        (
            Actor("duetime", Via.DASHBOARD, "10.2.0.7"),
            Action.PAUSE,
            "shipping",
            [],
            "INC-7: carrier API down",
        ),
        (Actor("nightly-cleanup", Via.PYTHON, "batch-1"), Action.CANCEL_GROUP, "order-7", [], "12 cancelled"),
        (Actor("ada@ops-1", Via.CLI, "ops-1"), Action.LIMIT_SET, "invoices", [], "50/s"),
    ):
        store.audit(made(actor, action, target, ids=ids, detail=detail))
    env = {**os.environ, "DUETIME_DASHBOARD_PASSWORD": "demo"}
    board = duetime("dashboard", "--store", url, "--port", str(PORT), "--sample-every", "2s", env=env)
    time.sleep(4)
    log = f"jsonl:{folder}/deliveries"
    runner = duetime("run", "--store", url, "--delivery-log", log, stderr=subprocess.DEVNULL)
    try:
        time.sleep(100)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
            page = browser.new_context(
                http_credentials={"username": "duetime", "password": "demo"},
                viewport={"width": 1280, "height": 900},
            ).new_page()
            base = f"http://127.0.0.1:{PORT}"
            page.goto(base + "/?window=15m")
            page.screenshot(path=str(ROOT / "docs/dashboard-overview.png"), full_page=True)
            page.goto(base + "/messages?destination=orders")
            page.screenshot(path=str(ROOT / "docs/dashboard-messages.png"), full_page=True)
            first = page.locator("#messages tr[data-id]").first.get_attribute("data-id")
            page.goto(base + f"/message?id={first}")
            page.screenshot(path=str(ROOT / "docs/dashboard-message.png"), full_page=True)
            page.goto(base + "/errors")
            page.locator("#errors details").first.click()
            page.screenshot(path=str(ROOT / "docs/dashboard-errors.png"), full_page=True)
            page.goto(base + "/recurring")
            page.screenshot(path=str(ROOT / "docs/dashboard-recurring.png"), full_page=True)
            page.goto(base + "/audit")
            page.screenshot(path=str(ROOT / "docs/dashboard-audit.png"), full_page=True)
            browser.close()
        with urllib.request.urlopen(base + "/healthz") as answer:
            assert answer.status == 200
    finally:
        for process in (runner, board):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        store.close()
    report_pictures(url, log, folder)


def report_pictures(url: str, log: str, folder: Path) -> None:
    """``duetime bulk report`` of the run, and the charts of its HTML page as docs/report-*.png."""
    html = folder / "report.html"
    subprocess.run(
        [sys.executable, "-m", "duetime", "bulk", "report", "--store", url, "--delivery-log", log,
         "--period", "second", "--html", str(html)],
        check=True,
    )  # fmt: skip
    pictures = dict(
        re.findall(r'<img alt="(\w+)\.png" src="data:image/png;base64,([^"]+)"', html.read_text())
    )
    assert set(pictures) == {"backlog", "destinations", "lateness"}, sorted(pictures)
    for name, data in pictures.items():
        (ROOT / f"docs/report-{name}.png").write_bytes(base64.b64decode(data))


if __name__ == "__main__":
    main()
