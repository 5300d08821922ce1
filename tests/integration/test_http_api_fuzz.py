"""Schemathesis against `duetime serve`, on SQLite and PostgreSQL: what the OpenAPI document
allows, hostile input included, and what it does not. No 5xx, no answer the document does not
describe, every default phase (coverage, fuzzing, stateful) and check
(``tests/integration/schemathesis.toml`` says the one exception and why).

The seed is fixed so that a run is repeatable; a deeper run is
``schemathesis run http://127.0.0.1:8081/openapi.json -H 'Authorization: Bearer …'`` by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.http_api import make_key, serving
from tests.services import store_url

HERE = Path(__file__).parent


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_url(request.param, tmp_path) as url:
        assert run_cli("setup", "--store", url).returncode == 0
        yield url


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_schemathesis_finds_nothing(store: str, tmp_path: Path) -> None:
    key = make_key(store, "fuzz", "schedule,read,manage", rate="1000000")
    schemathesis = Path(sys.executable).with_name("schemathesis")
    with serving(store, tmp_path) as port:
        done = subprocess.run(
            [
                str(schemathesis), "--config-file", str(HERE / "schemathesis.toml"), "--no-color",
                "run", f"http://127.0.0.1:{port}/openapi.json",
                "-H", f"Authorization: Bearer {key}", "--max-examples", "25", "--seed", "20261202",
            ],
            capture_output=True, text=True, timeout=560, cwd=tmp_path,
            env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "passed" in done.stdout
