"""The SQLite how-to sends a reader to ``bench/fsync_probe.py`` before they judge lateness: it
runs as the page writes it, from a checkout, on a folder of the reader's choosing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fsync_probe_measures_the_folder_it_is_given_and_leaves_nothing_there(tmp_path: Path) -> None:
    assert "bench/fsync_probe.py --folder" in (ROOT / "docs" / "how-to" / "sqlite.md").read_text()
    done = subprocess.run(
        [sys.executable, "bench/fsync_probe.py", "--seconds", "0.5", "--folder", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"in {tmp_path}" in done.stdout
    for figure in ("| p50 |", "| p99 |", "| p99.9 |", "| max |", "stalls of 50 ms or more:"):
        assert figure in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == []  # its file is a temporary one, removed
