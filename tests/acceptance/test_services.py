"""scripts/services.py, which gets the suite its servers: when the standard port is held by
something the tests cannot use, a server of duetime's own starts on a free port, with its own data
folder, and the tests are told where."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.services import free_port, require_program

ROOT = Path(__file__).resolve().parents[2]


def services(monkeypatch: pytest.MonkeyPatch, home: Path) -> ModuleType:
    monkeypatch.setenv("DUETIME_SERVICES_DIR", str(home))
    spec = importlib.util.spec_from_file_location("duetime_services_script", ROOT / "scripts" / "services.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "duetime_services_script", module)
    spec.loader.exec_module(module)
    return module


def test_a_standard_port_held_by_something_else_gets_a_server_of_its_own_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_program("redis-server", "redis-server")
    script = services(monkeypatch, tmp_path / "services")
    squatter = socket.socket()  # takes connections, says nothing: not a Redis
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(8)
    held = squatter.getsockname()[1]
    redis = next(s for s in script.SERVERS if s.name == "Redis")
    monkeypatch.setattr(redis, "port", held)
    monkeypatch.setattr(redis, "installed_before", False)
    url = None
    try:
        assert redis.ask(held) is not None, "the squatter must not pass for Redis"
        url = script.start(redis)
        port = script.port_of(url)
        assert port != held and redis.ask(port) is None, url
        assert (tmp_path / "services" / "redis").is_dir()
    finally:
        squatter.close()
        if url is not None:
            subprocess.run(
                ["redis-cli", "-p", str(script.port_of(url)), "shutdown", "nosave"],
                capture_output=True,
                timeout=30,
            )


def test_a_server_of_its_own_that_ran_before_is_started_again_on_its_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A second run after the first one's servers stopped (a container started again) restarts
    those, with their data, on their ports: starting the machine's own on the standard port left
    two servers, and tests that assumed the standard port met the wrong one."""
    require_program("redis-server", "redis-server")
    home = tmp_path / "services"
    script = services(monkeypatch, home)
    nobody, earlier_port = free_port(), free_port()
    while earlier_port == nobody:
        earlier_port = free_port()
    redis = next(s for s in script.SERVERS if s.name == "Redis")
    (home / "redis").mkdir(parents=True)
    (home / "env").write_text(f"export {redis.variable}='redis://127.0.0.1:{earlier_port}/0'\n")
    monkeypatch.setattr(redis, "port", nobody)  # the standard port: free, nothing answers there
    monkeypatch.setattr(redis, "installed_before", True)  # the machine's own would start there
    monkeypatch.setattr(redis, "system_start", ["false"])
    redis.own_port_before = script.ran_before(redis, script.previous_env())
    assert redis.own_port_before == earlier_port
    url = None
    try:
        url = script.start(redis)
        assert script.port_of(url) == earlier_port and redis.ask(earlier_port) is None, url
    finally:
        if url is not None:
            subprocess.run(
                ["redis-cli", "-p", str(earlier_port), "shutdown", "nosave"], capture_output=True, timeout=30
            )
    assert script.ran_before(redis, {}) is None  # no URL from before: nothing of its own ran


def test_the_check_names_what_is_missing_with_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without root or apt, each missing program is one line with its apt-get command."""
    script = services(monkeypatch, tmp_path / "services")
    monkeypatch.setattr(
        script, "PROGRAMS", [(lambda: False, "faketime", "faketime (the tests of a wrong host clock)")]
    )
    monkeypatch.setattr(script, "SERVERS", [])
    monkeypatch.setattr(sys, "argv", ["services.py", "--check"])
    said: list[str] = []
    monkeypatch.setattr(script, "say", said.append)
    assert script.main() == 1
    assert said == [
        "faketime (the tests of a wrong host clock) is not installed: sudo apt-get install faketime"
    ]
