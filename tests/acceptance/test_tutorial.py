"""The tutorial's commands, run as written: every ``bash`` block of docs/tutorial.md in one shell,
in a fresh folder, against this machine's PostgreSQL and RabbitMQ (the page's example hosts are
swapped for them, and its queue names made this test's own on the shared broker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.services import RABBITMQ, delete_rabbitmq_queues, free_port, postgres_schema, require

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"


@pytest.mark.timeout(300)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
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
            f'\n{sys.executable} -c "import time, urllib.request\n'
            "for _ in range(100):\n"
            "    try:\n"
            f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2).status); break\n"
            "    except OSError: time.sleep(0.2)\n"
            '"\nkill %1\n'
        )
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "200"}
        env = {k: v for k, v in env.items() if not k.startswith("DUETIME_")}
        done = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env
        )
        said = done.stdout + done.stderr
        assert done.returncode == 0, said[-4000:]
    assert '"body": "hello"' in said and "bill #42" in said and "hello from PostgreSQL" in said, said[-4000:]
    assert said.rstrip().endswith("200") or "\n200\n" in said, said[-2000:]
    assert "Traceback" not in said
    delete_rabbitmq_queues(f"orders_{tag}", f"invoices_{tag}")
