"""The tutorial's commands, run as written: every ``bash`` block of docs/tutorial.md in one shell,
from the repository's folder (as a reader's clone) with a home folder of the test's own, against
this machine's PostgreSQL and RabbitMQ (the page's example hosts are swapped for them, and its
queue names made this test's own on the shared broker).

Its first step makes a new virtual environment with only the extras the page names, and nothing
of the development environment is on the PATH: a command that needs more than the page installs
fails here as it would for a reader."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.services import RABBITMQ, delete_rabbitmq_queues, free_port, postgres_schema, require

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"


@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_written_in_a_new_environment_with_only_what_it_installs(tmp_path: Path) -> None:
    require(RABBITMQ)
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 8
    tag = uuid.uuid4().hex[:6]
    port = free_port()
    with postgres_schema() as pg:
        script = "set -euo pipefail\n" + "\n".join(blocks)
        script = script.replace("postgresql://app@db/app?schema=duetime", pg)
        script = script.replace("amqp://guest:guest@localhost/", RABBITMQ)
        script = script.replace("--port 8080", f"--port {port}")
        for queue in ("orders", "invoices"):
            script = re.sub(rf"\b{queue}\b", f"{queue}_{tag}", script)
        # the dashboard was left running in the background: it answers, then it is stopped
        script += (
            f'\npython -c "import time, urllib.request\n'
            "for _ in range(100):\n"
            "    try:\n"
            f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2).status); break\n"
            "    except OSError: time.sleep(0.2)\n"
            '"\nkill %1\n'
        )
        # the reader's shell: no virtual environment of ours, the system's Python 3
        path = [p for p in os.environ["PATH"].split(":") if p and not p.startswith(str(ROOT / ".venv"))]
        env = {**os.environ, "PATH": ":".join(path), "HOME": str(tmp_path), "COLUMNS": "200"}
        env = {k: v for k, v in env.items() if not k.startswith(("DUETIME_", "VIRTUAL_ENV", "PYTHON"))}
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        done = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=540, env=env
        )
        said = done.stdout + done.stderr
        assert done.returncode == 0, said[-4000:]
    assert '"body": "hello"' in said and "bill #42" in said and "hello from PostgreSQL" in said, said[-4000:]
    assert said.rstrip().endswith("200") or "\n200\n" in said, said[-2000:]
    assert "Traceback" not in said
    delete_rabbitmq_queues(f"orders_{tag}", f"invoices_{tag}")
