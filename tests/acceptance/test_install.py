"""Installing duetime as a stranger does: the pins on the oldest Python we claim, a wheel in a clean
virtual environment, and one line (never "a duetime bug") for every optional library not installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from duetime.errors import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _python_floor() -> str:
    claimed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    found = re.fullmatch(r">=\s*(\d+\.\d+)", claimed)
    assert found, f"requires-python {claimed!r} is not a plain lower bound"
    return found.group(1)


@pytest.mark.timeout(300)
def test_every_pin_installs_on_the_oldest_python_the_project_claims(tmp_path: Path) -> None:
    """constraints.txt was pinned on 3.11.7 and held a release that needs 3.11.5: Debian 12's 3.11.2
    could not install the test command. pip is asked as if it ran on the lowest Python that
    requires-python admits (x.y means x.y.0)."""
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line]
    # pyspark comes only as an sdist, which pip will not judge for another Python: its own
    # Requires-Python (>=3.11 for 4.x) is checked by the fresh-machine run instead
    wheels = [pin for pin in pins if not pin.startswith("pyspark==")]
    (tmp_path / "pins.txt").write_text("\n".join(wheels) + "\n")
    asked = subprocess.run(
        [*PIP, "install", "--dry-run", "--no-deps", "--ignore-installed", "--only-binary=:all:",
         "--python-version", _python_floor(), "--target", str(tmp_path / "t"), "-r", str(tmp_path / "pins.txt")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr[-3000:]


def _hidden(modules: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``duetime ARGS`` in a process where ``modules`` cannot be imported, as if not installed."""
    program = (
        "import sys\n"
        f"for name in {modules!r}:\n"
        "    sys.modules[name] = None\n"
        "from duetime.cli import main\n"
        f"sys.argv = ['duetime', *{list(args)!r}]\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    return subprocess.run(
        [sys.executable, "-c", program], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
    )


#: extra -> (a library of it to hide, a command that needs it)
NEEDS = {
    "postgres": (["psycopg", "psycopg_pool"], ["setup", "--store", "postgresql://app@db/app"]),
    "mysql": (["pymysql"], ["stats", "--store", "mysql://app@db/app"]),
    "redis": (["redis"], ["setup", "--store", "redis://cache/0"]),
    "rabbitmq": (["aio_pika", "aiormq"], ["queues", "declare", "q", "--transport", "amqp://mq/"]),
    "nats": (["nats"], ["queues", "declare", "q", "--transport", "nats://nats:4222"]),
    "celery": (["kombu", "celery"], ["queues", "declare", "q", "--transport", "celery+amqp://mq/"]),
    "dramatiq": (["dramatiq", "pika"], ["queues", "declare", "q", "--transport", "dramatiq+redis://cache/0"]),
    "metrics": (["prometheus_client"], ["run", "--metrics-port", "0"]),
    "dashboard": (["starlette", "uvicorn", "jinja2"], ["dashboard", "--port", "0"]),
    "spark": (["pyspark", "pyarrow"], ["bulk", "report", "--store", "sqlite:///duetime.db"]),
}


@pytest.mark.parametrize("extra", sorted(NEEDS))
def test_a_missing_optional_library_is_one_line_with_the_pip_line_and_exit_1(
    extra: str, tmp_path: Path
) -> None:
    """`duetime dashboard` without starlette was "internal error ... this is a duetime bug"."""
    assert run_setup(tmp_path).returncode == 0
    modules, command = NEEDS[extra]
    done = _hidden(modules, *command, cwd=tmp_path)
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, said
    assert "\n" not in said and "Traceback" not in said and "duetime bug" not in said, said
    assert re.search(rf"pip install (-e )?'[^']*\[{extra}\]'", said), said


def run_setup(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duetime", "setup", "--queue", "orders"],
        cwd=folder,
        capture_output=True,
        text=True,
    )


def test_every_optional_library_maps_to_an_extra_that_installs_it() -> None:
    """The table the one-line rule reads names only extras pyproject.toml has, and every extra of a
    store, transport or feature is reachable from it (or from NEEDS, this test's own list)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    assert set(NEEDS) | {"otel"} <= set(EXTRA_OF_MODULE.values())


def test_without_opentelemetry_tracing_is_off_and_nothing_fails(tmp_path: Path) -> None:
    """The otel extra is the API only and optional: without it a run delivers as ever."""
    assert run_setup(tmp_path).returncode == 0
    done = _hidden(["opentelemetry"], "run", "--burst", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(600)
def test_the_demo_command_sets_up_a_fresh_copy_quietly(tmp_path: Path) -> None:
    """The README's first command in a copy of the repository with no .venv: it sets up, runs the
    demo, and its set-up prints no packaging warning (setuptools' editable install warned that a
    folder named like the package may shadow it)."""
    copy = tmp_path / "duetime"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((ROOT / name).read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUETIME_", "VIRTUAL_ENV"))}
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(str(ROOT / ".venv")))
    done = subprocess.run(
        ["bash", "scripts/demo.sh", "--messages", "500", "--spread", "1"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    ours = [line for line in said.splitlines() if re.search(r"warn", line, re.I) and "is ignored" not in line]
    assert not ours, "\n".join(ours)
