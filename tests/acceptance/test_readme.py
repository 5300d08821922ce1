"""Every Python block in the README and the documentation runs as written, in reading order:
against this machine's servers (the example hosts are swapped for them), in a fresh folder, with
top-level ``await`` allowed.

Blocks that show a fragment of a receiver use names the reader's program would have (``handle``,
``message``, ``conn``); ``PRELUDES`` gives them those, and nothing else."""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import sqlite_file
from tests.services import POSTGRES, RABBITMQ, REDIS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _pages() -> list[Path]:
    """The README, then the documentation's pages in the order of the site's navigation."""
    import yaml

    def walk(entries: Any) -> Iterator[str]:
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from walk(value)
            else:
                yield value

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [README, *(ROOT / "docs" / page for page in walk(site["nav"]))]


#: (where, code) of every Python block, in reading order.
BLOCKS = [
    (f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 2}", m.group(1))
    for page in _pages()
    for text in [page.read_text()]
    for m in re.finditer(r"```python\n(.*?)```", text, re.S)
]

#: The README's example hosts, and where they are on this machine.
HOSTS = {
    "postgresql://app@db/app?schema=duetime": "{pg}",
    "postgresql://db/app": "{pg}",
    "amqp://guest:guest@localhost/": RABBITMQ,
}

#: What a block expects its reader's program to have, by a line only that block holds.
PRELUDES = {
    "SyncSqliteQueue(": "def handle(*parts): pass\n",
    "SyncPostgresQueue.from_url": (
        "def handle(message): pass\n"
        "from duetime.backends.postgres import SyncPostgresQueue as _Q\n"
        "_q = _Q.from_url(PG); _q.declare('orders'); _q.close()\n"
    ),
    "PostgresDeduplicator()": (
        "import psycopg, redis\nfrom datetime import timedelta\n"
        "def handle(message): pass\n"
        "conn = psycopg.connect(POSTGRES_BASE, autocommit=True)\n"
        "redis_client = redis.Redis.from_url(REDIS)\n"
        "message = duetime.DelayedMessage.create('orders', b'x', delay=0)\n"
    ),
    "send_delayed(transport": (
        "from datetime import timedelta\n"
        "transport = duetime.open_transport('sqlite:///duetime.db')\n"
        "await transport.declare('shop.Timeouts')\n"  # what `duetime run --endpoint shop --front-door` declares
    ),
    "NativeDelays(transport)": (
        "from duetime.backends.rabbitmq.transport import RabbitMqTransport as _T\n"
        "_t = _T(RABBITMQ); await _t.start(); await _t.declare('orders'); await _t.close()\n"
    ),
    # The block before it is shop.py: the module the reader's workers and senders import.
    "from shop import": (
        "import sys as _sys, types as _types\n"
        "_sys.modules['shop'] = _types.SimpleNamespace(bridge=bridge, remind=remind)\n"
    ),
    "spark.read.parquet": (
        "import pyarrow as pa, pyarrow.parquet as pq, os\n"
        "os.makedirs('customers', exist_ok=True)\n"
        "pq.write_table(pa.table({'id': ['1', '2'], 'tz': ['Europe/Paris', 'UTC']}), 'customers/part-0.parquet')\n"
    ),
}


def _prelude(code: str) -> str:
    return "".join(text for marker, text in PRELUDES.items() if marker in code)


async def _run(code: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if asyncio.iscoroutine(result):
        await result


def test_every_python_block_runs_as_written(pg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(BLOCKS) >= 9
    monkeypatch.chdir(tmp_path)
    # The blocks build on each other as the README reads (the router uses the native sender made
    # just above it), so they share one namespace, as one reader's session would.
    namespace: dict[str, Any] = {"__name__": "readme", "duetime": __import__("duetime")}
    namespace |= {"PG": pg, "POSTGRES_BASE": POSTGRES, "REDIS": REDIS, "RABBITMQ": RABBITMQ}
    loop = asyncio.new_event_loop()
    try:
        for where, block in BLOCKS:
            code = block
            for host, here in HOSTS.items():
                code = code.replace(host, here.format(pg=pg))
            # Spark reads a relative path from its JVM's working directory: where this worker
            # process first started Spark (another test file may have), not this test's folder.
            for folder in ("customers/", "rejects/"):
                code = code.replace(f'"{folder}"', repr(f"{tmp_path}/{folder}"))
            code = _prelude(code) + code
            before = dict(namespace)
            try:
                if "asyncio.run(" in code:  # a whole program: it runs its own event loop
                    exec(compile(code, str(README), "exec"), namespace)
                else:
                    loop.run_until_complete(_run(code, namespace))
            except Exception as error:
                raise AssertionError(f"the block at {where} failed: {error!r}") from error
            # a name a later block gives again (`bridge = ...` on two pages): the first one is
            # closed as its reader's program would have, before it is lost
            replaced = {k: v for k, v in before.items() if k in namespace and namespace[k] is not v}
            loop.run_until_complete(_close_all(replaced))
    finally:
        loop.run_until_complete(_close_all(namespace))
        loop.close()


async def _close_all(namespace: dict[str, Any]) -> None:
    """Close what the blocks opened and left open (a reader's program would at its end)."""
    for name, value in namespace.items():
        close = getattr(value, "close", None)
        if name.startswith("_") or isinstance(value, type) or not callable(close):
            continue
        try:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            pass


def test_the_worker_modules_send_nothing_when_a_worker_imports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``shop.py`` the docs show (Celery's, Dramatiq's) is what ``celery -A shop worker`` or
    ``dramatiq shop`` imports at every start: importing it makes the app or broker and installs
    the bridge, and stores (sends) nothing."""
    import sys

    modules = [code for _, code in BLOCKS if code.startswith("# shop.py") and "bridge.recurring(" not in code]
    assert len(modules) == 2
    monkeypatch.syspath_prepend(str(tmp_path))
    for number, block in enumerate(modules):
        folder = tmp_path / str(number)
        folder.mkdir()
        monkeypatch.chdir(folder)
        (tmp_path / "shop.py").write_text(block.replace("amqp://guest:guest@localhost/", RABBITMQ))
        try:
            shop = __import__("shop")
            assert hasattr(shop, "remind") and hasattr(shop, "bridge")
            database = folder / "duetime.db"
            if database.exists():  # the store opens at the first delayed task, not at import
                with sqlite_file(database) as conn:
                    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
                    assert all(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] == 0 for t in tables)
            shop.bridge.close()
        finally:
            sys.modules.pop("shop", None)


def test_a_recurring_entry_in_the_worker_module_is_kept_once_however_often_it_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recurring page's ``shop.py`` says its schedule at every start (each worker imports it):
    one schedule, its next tick stored once."""
    import sys

    from duetime import connect_sync
    from duetime.recurring.schedule import group_of

    [module] = [code for _, code in BLOCKS if code.startswith("# shop.py") and "bridge.recurring(" in code]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shop.py").write_text(module.replace("amqp://guest:guest@localhost/", RABBITMQ))
    for _ in range(3):  # three workers starting
        try:
            __import__("shop").bridge.close()
        finally:
            sys.modules.pop("shop", None)
    with connect_sync(f"sqlite:///{tmp_path / 'duetime.db'}") as client:
        assert [s.schedule_id for s in client.list_recurring()] == ["close-invoices"]
        ticks = client.list(group=group_of("close-invoices")).messages
        assert len(ticks) == 1 and ticks[0].headers["celery-task"].endswith("close_invoices")
