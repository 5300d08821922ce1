"""Shared by the integration tests: Debian's Chromium, driven by Playwright (nothing downloaded), for
the dashboard's tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import require_program

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Chromium on a closed network: no background connections, no sandbox (tests run as root here).
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for a test module."""
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        require_program("chromium", "chromium")
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()
