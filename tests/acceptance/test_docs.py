"""The documentation site builds strictly (no broken link or anchor, no page outside the
navigation), and its references come from the code: every command in the command-line reference,
every public name in the Python API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_every_command_line_in_the_readme_and_the_docs_is_one_the_cli_takes() -> None:
    """Each ``duetime …`` line of a shell block, parsed as the command line parses it (options,
    arguments, their types): an option renamed or removed in the code fails here. (The tutorial's
    are also run: tests/acceptance/test_tutorial.py.)"""
    import re
    import shlex

    import typer

    from duetime.cli import app

    root = typer.main.get_command(app)  # Typer's own click: told apart by what it has, not its class
    checked, wrong = 0, []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if not line.strip().startswith("duetime "):
                    continue
                args = _as_typed(shlex.split(line, comments=True))[1:]
                command: Any = root
                path = ["duetime"]
                while hasattr(command, "commands") and args and args[0] in command.commands:
                    path.append(args[0])
                    command = command.commands[args.pop(0)]
                assert not hasattr(command, "commands"), f"{line}: not a command"
                try:
                    command.make_context(" ".join(path), args)
                except Exception as error:
                    # --help and --version end the parse; a file named on the page is the reader's
                    if type(error).__name__ != "Exit" and "does not exist" not in str(error):
                        wrong.append(f"{page.relative_to(ROOT)}: {line.strip()}: {error}")
                checked += 1
    assert checked > 50
    assert not wrong, wrong


def _as_typed(words: list[str]) -> list[str]:
    """A documented command line as a reader types it: what follows a shell operator (``>``,
    ``|``, ``;``, ``&&``) is another command, ``[--json]`` marks what may be left out, and ``…``
    what the reader fills in."""
    typed: list[str] = []
    optional = 0
    for word in words:
        if word in (">", ">>", "|", "&&", "||", ";", "&"):
            break
        if word.startswith("["):
            optional += word.count("[")
        if optional:
            optional -= word.count("]")
            continue
        if word == "…":  # the value of the option before it, or more of the reader's own
            if typed and typed[-1].startswith("--"):
                typed.append("filled-in")
        else:
            typed.append(word.removesuffix(";"))
        if word.endswith(";"):
            break
    return typed


def test_every_picture_in_the_docs_is_made_by_a_script() -> None:
    """The docs' pictures come from real runs, made again by a script, never by hand: each one a
    page shows is written by scripts/screenshots.py or a benchmark."""
    import re

    makers = (ROOT / "scripts" / "screenshots.py").read_text() + (
        ROOT / "bench" / "soak_bench.py"
    ).read_text()
    shown = {
        Path(name).name
        for page in (ROOT / "docs").rglob("*.md")
        for name in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text())
    }
    assert len(shown) >= 8
    made = {name for name in shown if name in makers or name.removesuffix(".png").split("-", 1)[-1] in makers}
    assert shown == made, sorted(shown - made)


def _commands() -> list[tuple[list[str], Any]]:
    """Every command and group of ``duetime``, with the words that run it."""
    import typer.main

    found: list[tuple[list[str], Any]] = []

    def walk(words: list[str], command: Any) -> None:
        found.append((words, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk([*words, name], sub)

    walk([], typer.main.get_command(app))
    return found


def test_every_help_text_renders_its_brackets_and_every_help_runs() -> None:
    """`duetime run --help` said "Needs duetime." where the code said ``duetime[metrics]``: Rich
    took ``[metrics]`` for a style and dropped it. A bracket in a help text is written ``\\[``
    unless it is a style Rich knows; and every command's --help runs."""
    import re

    from rich.errors import StyleSyntaxError
    from rich.style import Style
    from typer.testing import CliRunner

    eaten = []
    for words, command in _commands():
        texts = [command.help or "", command.epilog or ""] + [
            getattr(p, "help", None) or "" for p in command.params
        ]
        for text in texts:
            for tag in re.findall(r"(?<!\\)\[([a-z#/@][^[]*?)\]", text):  # what Rich reads as a tag
                if tag.startswith("/"):
                    continue
                try:
                    Style.parse(tag)
                except StyleSyntaxError:
                    eaten.append(f"duetime {' '.join(words)}: [{tag}] in {text[:80]!r}")
        shown = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (words, shown.output)
    assert not eaten, "\n".join(eaten)
    run_help = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "duetime[metrics]" in run_help


def test_the_command_line_reference_shows_text_as_written() -> None:
    """The page showed ``schedule orders &#x27;hello&#x27;`` and cut each summary at 45 characters."""
    import re

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from cli_reference import MARKER, on_page_markdown
    finally:
        sys.path.pop(0)
    page = on_page_markdown(MARKER, None)
    assert "&#x27;" not in page and "&quot;" not in page
    assert not [code for code in re.findall(r"`[^`\n]*`", page) if re.search(r"&\w+;|&#", code)]
    cut = [line for line in page.splitlines() if re.match(r"\* `[\w-]+`: .*\.\.\.$", line)]
    assert not cut, cut
    assert "duetime schedule orders 'hello' --in 10s" in page


def test_every_test_the_docs_name_exists() -> None:
    """The docs name tests as evidence (`tests/x.py::test_y` or `::TestClass`): each must be there."""
    import re

    named = set()
    for page in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        named |= set(re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", page.read_text()))
    missing = []
    for path, name in sorted(named):
        file = ROOT / path
        if not file.exists() or (
            name and not re.search(rf"^\s*(async def|def|class) {name}\b", file.read_text(), re.M)
        ):
            missing.append(f"{path}::{name}" if name else path)
    assert not missing, missing


def test_every_how_to_page_keeps_to_twelve_kilobytes() -> None:
    """A how-to page is read to do one thing: past 12 KB it is two pages."""
    large = {
        p.name: p.stat().st_size for p in (ROOT / "docs" / "how-to").glob("*.md") if p.stat().st_size > 12_000
    }
    assert large == {}, large
