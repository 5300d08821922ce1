"""The wheel a user installs (in a file of its own: building and installing take a minute, which
the suite's workers then share with the other files)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_wheel_installs_into_a_clean_environment_and_runs_the_demo(tmp_path: Path) -> None:
    """What a user installs: `python -m build` makes a wheel and an sdist that `twine check`
    passes; the wheel in a new virtual environment (no extras) carries its SQL, Lua, templates
    and static files, and `duetime demo` delivers everything."""
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(dist.glob("duetime-*.whl"))
    assert next(dist.glob("duetime-*.tar.gz"))
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"),
         str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    files = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.resources as r, duetime\n"
         "root = r.files(duetime)\n"
         "for kind in ('sql', 'lua', 'html', 'css', 'js'):\n"
         "    print(kind, sum(1 for _ in root.rglob('*.' + kind)) if hasattr(root, 'rglob') else 0)\n"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    found = dict(line.split() for line in files.stdout.splitlines())
    packaged = {kind: sum(1 for _ in (ROOT / "duetime").rglob(f"*.{kind}")) for kind in found}
    assert found == {kind: str(count) for kind, count in packaged.items()}, (files.stdout, files.stderr)
    assert all(int(count) > 0 for count in found.values()), found
    demo = subprocess.run(
        [str(venv / "bin" / "duetime"), "demo", "--messages", "500", "--spread", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "duplicates" in demo.stdout + demo.stderr
