"""The documentation site builds strictly (no broken link or anchor, no page outside the
navigation), and its references come from the code: every command in the command-line reference,
every public name in the Python API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import duetime
from duetime.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="pip install 'duetime[docs]' (scripts/test.sh does)")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def test_the_command_line_reference_has_every_command(site: Path) -> None:
    import typer

    page = (site / "reference" / "cli" / "index.html").read_text()
    command = typer.main.get_command(app)
    names = list(command.commands)  # type: ignore[attr-defined]
    assert len(names) > 10
    for name in names:
        assert f"duetime {name}" in page, name
    assert "duetime bulk migrate" in page and "--store" in page


def test_the_python_api_reference_has_every_public_name(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in duetime.__all__:
        assert f'id="duetime.{name}"' in page, name


def test_every_environment_variable_the_package_reads_is_on_the_settings_page(site: Path) -> None:
    import re

    page = (site / "reference" / "settings" / "index.html").read_text()
    read = {
        name
        for path in (ROOT / "duetime").rglob("*.py")
        for name in re.findall(r"DUETIME_[A-Z_]*[A-Z]", path.read_text())
    }
    assert len(read) > 10
    missing = sorted(name for name in read if name not in page)
    assert not missing, missing


def test_the_metrics_page_has_every_series_the_alert_rules_use(site: Path) -> None:
    import re

    page = (site / "reference" / "metrics" / "index.html").read_text()
    rules = (ROOT / "deploy" / "prometheus-rules.yaml").read_text()
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for name in re.findall(r"\bduetime_[a-z_]+", rules)} - {
        "duetime_up"
    }  # Prometheus's own series for the scrape job
    assert used
    missing = sorted(name for name in used if name not in page)
    assert not missing, missing


def test_the_readme_links_only_to_what_is_there() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)\)", readme) if not t.startswith("http")]
    assert len(targets) > 15
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
    assert len(readme.splitlines()) < 150  # read in five minutes
