"""Every how-to guide's shell commands, run as written: each page's ``bash`` blocks, in order, in one
shell, in a fresh folder, against this machine's servers.

What is changed on the way, and only that: the pages' example servers (``db``, ``rabbit``, ``mq``,
``cache``, ``nats``, ``db.internal``, …) become this machine's (a PostgreSQL schema and a MariaDB
database of the test's own); folders at the root of the file system (``/data``, ``/backup``,
``/var/log``) and fixed ports become the test's own; the queue name ``orders`` becomes the test's
own on the shared brokers. A ``python`` block whose first line names a file (``# shop.py``) is
written as that file when the shell reaches it, as a reader would save it.

A command that serves until stopped (``duetime run`` without ``--burst``, ``duetime dashboard``,
``duetime serve``, a Celery or Dramatiq worker) is started in the background; the lines after it
run once it says it is ready, and at the end of its block (of the page, where its line says
``# keeps serving``) it is stopped with SIGTERM and must leave cleanly. ``npm install`` lines link
the packages of ``tests/clients/typescript`` instead, installed once from its lock file; a
``typescript`` block whose first line names a file (``// schedule.mts``) is written as that file.
``pip install`` lines are not run (the test environment has every extra; pip would fetch from
PyPI). Blocks that need what this machine does not have are listed in ``NOT_HERE`` with the test
that runs their commands instead; the list is checked against the pages, so it cannot go stale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.services import (
    MQTT,
    NATS,
    RABBITMQ,
    REDIS,
    delete_rabbitmq_queues,
    free_port,
    mariadb_database,
    postgres_schema,
    require,
    typescript_tools,
)

ROOT = Path(__file__).resolve().parents[2]
HOWTO = ROOT / "docs" / "how-to"

#: (page, the block's first line) -> why it is not run here, and where its commands are run.
NOT_HERE = {
    (
        "service.md",
        "sudo cp deploy/duetime.service",
    ): "systemd; tests/acceptance/test_deploy.py verifies the unit and runs its command",
    (
        "service.md",
        "kubectl create secret",
    ): "Kubernetes; tests/acceptance/test_deploy.py validates the manifest and runs its containers",
    ("spark.md", "duetime bulk export --from sqlite:///duetime.db --to parquet:sftp://"): (
        "an SFTP server; tests/bulk/test_cli_data.py runs this export against one of its own"
    ),
    ("spark.md", "duetime bulk migrate --master spark://spark-master:7077"): (
        "a Spark cluster and YARN; tests/bulk/test_cluster.py runs the jobs with spark-submit on a standalone cluster"
    ),
    **{
        ("native-delays.md", first): "a RabbitMQ cluster; tests/topology/test_rabbitmq_cluster.py builds one"
        for first in ("rabbitmqctl list_queues", "rabbitmq-upgrade -n NODE drain")
    },
    **{
        ("production.md", first): "a cluster or pooler of its own; tests/topology builds each"
        for first in (
            "export DUETIME_STORE='postgresql://app@db1:5432,db2:5432",
            "export DUETIME_TRANSPORT='amqp://app:PASSWORD@rabbit1:5672",
            "export DUETIME_TRANSPORT='nats://nats1:4222",
            "export DUETIME_STORE='redis+sentinel://",
            "export DUETIME_STORE='postgresql://app@pgbouncer:6432",
        )
    },
}

#: What says that a served command is ready for the lines after it.
READY = r"dispatching endpoint|dashboard of .* on http:|HTTP API of .* on http:|\[queues\]|Worker process is ready"

SERVES = re.compile(
    r"^(duetime run\b(?!.*--burst)|duetime dashboard\b|duetime serve\b(?!.*--openapi)|celery -A \S+ worker\b|dramatiq \S+)"
)

#: Said on a served command's line when the page's later blocks use it: it, and what the blocks
#: after it serve, are stopped at the end of the page, not of their block.
KEEPS_SERVING = "# keeps serving"

PRELUDE = r"""
set -euo pipefail
_services=()
_serve() {  # start a command that serves until stopped; go on once it is ready
  local log; log=$(mktemp -p "$PWD" served.XXXX.log)
  "$@" >"$log" 2>&1 &
  local pid=$!
  _services+=("$pid:$log")
  for _ in $(seq 600); do
    if ! kill -0 "$pid" 2>/dev/null; then echo "stopped by itself: $*"; cat "$log"; exit 1; fi
    if grep -qE "$READY" "$log"; then echo "serving: $*"; return 0; fi
    sleep 0.1
  done
  echo "not ready in 60 s: $*"; cat "$log"; exit 1
}
_stop_served() {  # at the end of a block: each must leave cleanly on SIGTERM
  local entry
  for entry in "${_services[@]}"; do
    kill -TERM "${entry%%:*}"
    if ! wait "${entry%%:*}"; then echo "did not stop cleanly:"; cat "${entry#*:}"; exit 1; fi
  done
  _services=()
}
trap 'for e in "${_services[@]}"; do kill -9 "${e%%:*}" 2>/dev/null || true; done' EXIT
"""


def pages() -> list[str]:
    """The pages with a shell block this machine can run."""
    return sorted(
        p.name
        for p in HOWTO.glob("*.md")
        if any(lang == "bash" and not _not_here(p.name, body) for lang, body in blocks(p.read_text()))
    )


def _not_here(page: str, body: str) -> bool:
    first = body.lstrip().splitlines()[0] if body.strip() else ""
    return any(page == p and first.strip().startswith(f) for p, f in NOT_HERE)


def blocks(text: str) -> Iterator[tuple[str, str]]:
    """(language, text) of each fenced block, in page order."""
    for match in re.finditer(r"^[ \t]*```(\w+)\n(.*?)^[ \t]*```", text, re.S | re.M):
        yield match.group(1), match.group(2)


def script_of(page: str, swap: dict[str, str]) -> tuple[str, int]:
    """The page's shell blocks as one script (and how many command lines it runs)."""
    text = (HOWTO / page).read_text()
    for example, here in swap.items():
        text = text.replace(example, here)
    parts, run, keeping = [PRELUDE], 0, False
    for language, body in blocks(text):
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        if language == "python" and re.fullmatch(r"# [\w/]+\.py", first.strip()):
            parts.append(f"cat > {first.strip()[2:]} <<'PYTHON_FILE'\n{body}PYTHON_FILE")
        if language == "typescript" and re.fullmatch(r"// [\w/]+\.m?ts", first.strip()):
            parts.append(f"cat > {first.strip()[3:]} <<'TYPESCRIPT_FILE'\n{body}TYPESCRIPT_FILE")
        if language != "bash":
            continue
        if _not_here(page, body):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            if command.startswith("pip install "):
                parts.append(f": not run: {command!r}")
                continue
            if command.startswith("npm install "):  # the packages of tests/clients/typescript, installed once
                parts.append(f"ln -sfn {typescript_tools()} node_modules  # for: {command}")
                continue
            run += 1
            parts.append(f"_serve {command}" if SERVES.match(command) else command)
        keeping = keeping or KEEPS_SERVING in body
        if not keeping:
            parts.append("_stop_served")
    return "\n".join([*parts, "_stop_served"]) + "\n", run


def test_every_block_kept_off_this_machine_is_still_on_its_page() -> None:
    for (page, first), why in NOT_HERE.items():
        text = (HOWTO / page).read_text()
        assert any(lang == "bash" and body.lstrip().startswith(first) for lang, body in blocks(text)), (
            f"{page}: no block starts with {first!r} any more ({why}): remove it from NOT_HERE"
        )


#: Pages run by a test file of their own: their Spark jobs take minutes, and the suite runs each
#: file whole on one worker, so they run beside the others rather than after them.
OWN_FILE = {"spark.md": "tests/acceptance/test_howto_spark.py"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [page for page in pages() if page not in OWN_FILE])
def test_the_pages_commands_run_as_written(page: str, tmp_path: Path) -> None:
    run_page(page, tmp_path)


def run_page(page: str, tmp_path: Path) -> str:
    """The page's shell blocks as one script in ``tmp_path``: it must end with 0 and no traceback.
    Returns what it printed."""
    for url in (RABBITMQ, REDIS, NATS):
        require(url)
    tag = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        pg = stack.enter_context(postgres_schema())
        swap = _swaps(stack, pg, tag, tmp_path)
        script, commands = script_of(page, swap)
        if page in GIVEN:
            GIVEN[page](pg, tmp_path)
        assert commands > 0, page
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "200"}
        env = {k: v for k, v in env.items() if not k.startswith("DUETIME_")} | {"READY": READY}
        (tmp_path / "page.sh").write_text(script)
        done = subprocess.run(
            ["bash", "page.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=540, env=env
        )
        said = done.stdout + done.stderr
        delete_rabbitmq_queues(f"orders_{tag}", "celery", "default", "default.DQ", "default.XQ")
        assert done.returncode == 0, f"{page}:\n{said[-5000:]}"
        assert "Traceback" not in said, said[-5000:]
    return said


def _spark_pages_data(pg: str, folder: Path) -> None:
    """What the Spark page's reader has already: NServiceBus's timeouts of the Sales endpoint in
    its SQL persistence's table, and a data set of reminders in Parquet."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.bulk.conftest import create_timeoutdata, timeout_rows

    create_timeoutdata(pg, "Sales_TimeoutData", timeout_rows(50))
    (folder / "data" / "reminders").mkdir(parents=True)
    due = datetime.now(UTC) + timedelta(days=1)
    pq.write_table(
        pa.table(
            {
                "id": [f"reminder-{i}" for i in range(100)],
                "destination": ["crm-reminders"] * 100,
                "due_at": pa.array(
                    [due + timedelta(minutes=i) for i in range(100)], pa.timestamp("us", "UTC")
                ),
                "body": [f"call customer {i}" for i in range(100)],
            }
        ),
        folder / "data" / "reminders" / "part-0.parquet",
    )


#: What a page takes for granted that its reader has (data of their own), made before it runs.
GIVEN = {"spark.md": _spark_pages_data}


def _swaps(stack: ExitStack, pg: str, tag: str, folder: Path) -> dict[str, str]:
    """The pages' example servers, folders and ports -> this machine's, longest first."""
    mysql = stack.enter_context(mariadb_database())
    other = stack.enter_context(postgres_schema())
    amqp = RABBITMQ.rstrip("/") + "/"
    swap = {
        "postgresql://app:PASSWORD@db.internal:5432/app?schema=duetime": pg,
        "postgresql://db/legacy?layout=timeoutdata": f"{pg}&layout=timeoutdata",
        "postgresql://app@db/app": pg,
        "postgresql://db/other": other,
        "postgresql://db/app": pg,
        "postgresql://…": pg,
        "mysql://app:PASSWORD@db:3306/app": mysql,
        "mysql://app@db:3306/app": mysql,
        "amqp://guest:guest@rabbit:5672/": amqp,
        "amqp://guest:guest@rabbit/": amqp,
        "amqp://mq": amqp,
        "redis://cache:6379/0": REDIS,
        "nats://nats:4222": NATS,
        "mqtt://127.0.0.1:1883": MQTT,
        "-h 127.0.0.1 -p 1883": f"-h {urlsplit(MQTT).hostname} -p {urlsplit(MQTT).port}",
        "parquet:/data/": f"parquet:{folder}/data/",
        "parquet:/backup/": f"parquet:{folder}/backup/",
        "jsonl:/var/log/duetime": f"jsonl:{folder}/log",
        "--port 8080": f"--port {free_port()}",
    }
    api = str(free_port())
    swap |= {"--port 8081": f"--port {api}", "127.0.0.1:8081": f"127.0.0.1:{api}"}
    swap["127.0.0.1:8090"] = f"127.0.0.1:{free_port()}"  # the webhooks page's receiver
    metrics = str(free_port())
    swap |= {"--metrics-port 9464": f"--metrics-port {metrics}", "localhost:9464": f"localhost:{metrics}"}
    swap[" orders"] = f" orders_{tag}"
    return dict(sorted(swap.items(), key=lambda kv: -len(kv[0])))
