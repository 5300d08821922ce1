"""The tree shows the architecture: the top of the package is the public core and the entry
points, everything else sits in a subpackage named for its role, and every module is in one layer
of the import-linter contract (``pyproject.toml``), which ``lint-imports`` holds."""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import duetime

PACKAGE = Path(duetime.__file__).parent
ROOT = PACKAGE.parent

#: The public core (what a message is, the errors, the capabilities (the bulk jobs' too), the store's
#: row, the patterns that vouch for a row in a server, settings, the clock, the
#: error queue's and the live dispatchers' records, the API keys, the webhook endpoints, the limits,
#: the seal of encryption at rest, the audit trail's entries, NServiceBus's wire format, tracing) and the entry points (the clients, URL -> backend, ``python -m duetime``).
TOP_MODULES = {
    "__init__", "__main__", "api_keys", "audit", "bulk_interfaces", "client", "clock", "encryption", "error_headers",
    "errors", "interfaces", "limits", "live_dispatchers", "message", "nservicebus_wire", "plainly_fine", "registry",
    "service", "settings", "store_row", "tracing", "version", "webhooks",
}  # fmt: skip
SUBPACKAGES = {
    "api", "backends", "bridges", "bulk", "cli", "dashboard", "engine", "inputs", "nservicebus",
    "observability", "operations", "recurring", "testing",
}  # fmt: skip


def test_the_top_of_the_package_is_the_core_and_the_entry_points() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert (modules, packages) == (TOP_MODULES, SUBPACKAGES)


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = (c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [name for layer in contract["layers"] for name in re.split(r"\s*[:|]\s*", layer)]


def test_every_module_sits_in_a_layer_of_the_contract() -> None:
    layers = _layers()
    unplaced = []
    for found in pkgutil.walk_packages([str(PACKAGE)], "duetime."):
        name = found.name
        if not any(name == layer or name.startswith(layer + ".") for layer in layers):
            unplaced.append(name)
    assert unplaced == []


def test_the_project_says_what_is_true_now_not_when_it_was_written() -> None:
    """History lives in git and the CHANGELOG: no "session N" or "issue N" (with a number) in the code, its
    comments, the tests, the benchmarks or the documents."""
    diary = re.compile(r"\b(session|issue)s? #?\d+\b", re.IGNORECASE)
    places = [PACKAGE, ROOT / "tests", ROOT / "bench", ROOT / "scripts", ROOT / "deploy", ROOT / "docs"]
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "pyproject.toml"]
    files += [p for place in places if place.exists() for p in place.rglob("*") if p.is_file()]
    said = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
        for path in files
        if path.suffix in {".py", ".md", ".sql", ".sh", ".toml", ".yaml", ".yml", ".html", ".js", ".css", ""}
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if diary.search(line)
    ]
    assert said == []


def test_the_one_private_python_api_used_is_still_there() -> None:
    """The exit watchdog arms itself before the interpreter joins the threads at exit, through
    CPython's ``threading._register_atexit`` (no public hook runs before that join): a Python
    without it would let a command hang on a dead connection again, silently."""
    from duetime.cli import exit_watchdog

    assert exit_watchdog._BEFORE_THREADS_JOIN is not None


def test_no_module_imports_another_modules_private_helper() -> None:
    """A helper two modules share is public in the module that owns it (the command line's
    shared helpers were ``_open``, ``_confirm``, ``_transport_url``… imported by five modules)."""
    import ast

    borrowed = [
        f"{path.relative_to(ROOT)}: {node.module}.{alias.name}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("duetime")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert borrowed == []


def test_file_seconds_adds_up_each_files_tests_from_a_report(tmp_path: Path) -> None:
    """scripts/file-seconds.py, as the suite's ordering reads it (tests/conftest.py)."""
    import importlib.util
    import json

    report = tmp_path / "suite.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>'
        '<testcase classname="tests.unit.test_a" name="test_two" time="2.0"/>'
        '<testcase classname="tests.contract.test_b.TestThing" name="test_x" time="9"/>'
        "</testsuite></testsuites>"
    )
    spec = importlib.util.spec_from_file_location("file_seconds", ROOT / "scripts" / "file-seconds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "file-seconds.json"
    module.main(str(report), out)
    assert json.loads(out.read_text()) == {"tests/contract/test_b.py": 9.0, "tests/unit/test_a.py": 3.5}


def test_url_options_are_read_in_one_place() -> None:
    """duetime.inputs.urls reads every URL's query (options_of, split_options, url_options):
    seven modules once parsed it each their own way (blank values kept or dropped, the rest
    encoded again or not, an empty host lost)."""
    readers = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"\bparse_qsl?\b", path.read_text()) and path != PACKAGE / "inputs" / "urls.py"
    ]
    assert readers == []


def test_the_run_command_only_configures_the_service() -> None:
    """`duetime run` assembled the dispatcher, heartbeat, probes and front door itself (169 lines
    in one function); duetime.Service does that now, and no function of cli/run.py is long."""
    import ast

    tree = ast.parse((PACKAGE / "cli" / "run.py").read_text())
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or 0) - node.lineno >= 60
    ]
    assert long == []
