"""The tests' short commands, forked from a process that has imported the CLI, give what a new
``python -m duetime`` gives (tests/cli_server.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_server import Forks, forkable
from tests.conftest import duetime_cmd


@pytest.fixture(scope="module")
def forks() -> Forks:
    return Forks()


def _anew(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        duetime_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, errors="surrogateescape"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["setup", "--store", "sqlite:///x.db", "--queue", "orders"],
        [
            "schedule",
            "orders",
            "a\udcffb",
            "--at",
            "2099-01-01T00:00:00Z",
            "--id",
            "b",
            "--store",
            "sqlite:///x.db",
        ],
        ["show", "b", "--store", "sqlite:///x.db"],
        ["list", "--due-before", "not a time", "--store", "sqlite:///x.db"],
        ["no-such-command"],
        ["--version"],
    ],
)
def test_a_forked_command_answers_as_a_new_interpreter_does(
    forks: Forks, tmp_path: Path, args: list[str]
) -> None:
    env = {**os.environ, "COLUMNS": "200", "DUETIME_STORE": "sqlite:///x.db"}
    for folder in ("forked", "anew"):
        (tmp_path / folder).mkdir()
        setup = ["setup", "--store", "sqlite:///x.db", "--queue", "orders"]
        assert _anew(setup, tmp_path / folder, env).returncode == 0
    forked = forks.run(args, str(tmp_path / "forked"), env, 60, "surrogateescape")
    anew = _anew(args, tmp_path / "anew", env)
    assert forked is not None
    assert (forked.returncode, forked.stdout, forked.stderr) == (anew.returncode, anew.stdout, anew.stderr)


def test_a_command_over_its_time_is_killed_and_said_so(forks: Forks, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    assert _anew(["setup", "--store", "sqlite:///q.db", "--queue", "x"], tmp_path, env).returncode == 0
    receive = ["queues", "receive", "x", "--wait", "30", "--transport", "sqlite:///q.db"]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forks.run(receive, str(tmp_path), env, 2, "strict")
    assert time.monotonic() - started < 20


def test_what_python_reads_as_it_starts_is_never_forked() -> None:
    base = {"LANG": "C.UTF-8", "DUETIME_STORE": "a", "PYTEST_CURRENT_TEST": "t1"}
    assert forkable({**base, "DUETIME_STORE": "b", "PYTEST_CURRENT_TEST": "t2"}, base)
    assert not forkable({**base, "LANG": "C"}, base)
    assert not forkable({**base, "COLUMNS": "40"}, base)
    assert not forkable({**base, "PYTHONWARNINGS": "error"}, base)
    assert not forkable({**base, "LD_PRELOAD": "libfaketime.so.1"}, base)
