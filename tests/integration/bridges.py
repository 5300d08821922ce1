"""What the Celery and Dramatiq bridge tests share: an application module written for the test,
its real workers and a real ``duetime run`` as subprocesses, and the log the tasks write."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from duetime.interfaces import ReceivedMessage
from tests.conftest import duetime_cmd
from tests.services import RABBITMQ

CELERY_APP = """
import json, os, time
from celery import Celery
import duetime.bridges.celery

app = Celery("bridgetest", broker=os.environ["T_BROKER"])
app.conf.update(
    task_default_queue=os.environ["T_QUEUE"],
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=4,
)
bridge = duetime.bridges.celery.install(app, store=os.environ["T_STORE"])


@app.task(name="record", bind=True)
def record(self, tag):
    with open(os.environ["T_LOG"], "a") as log:
        log.write(json.dumps({"tag": tag, "at": time.time(), "eta": self.request.eta, "id": self.request.id}) + "\\n")
"""

DRAMATIQ_APP = """
import json, os, time
import dramatiq
if os.environ["T_BROKER"].startswith("amqp"):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    broker = RabbitmqBroker(url=os.environ["T_BROKER"], confirm_delivery=True)
else:
    from dramatiq.brokers.redis import RedisBroker
    broker = RedisBroker(url=os.environ["T_BROKER"], namespace=os.environ["T_NAMESPACE"])
dramatiq.set_broker(broker)
import duetime.bridges.dramatiq

bridge = duetime.bridges.dramatiq.install(broker, store=os.environ["T_STORE"])


@dramatiq.actor(queue_name=os.environ["T_QUEUE"], max_retries=0)
def record(tag):
    with open(os.environ["T_LOG"], "a") as log:
        log.write(json.dumps({"tag": tag, "at": time.time()}) + "\\n")
"""


class App:
    """The test's application module (importable here and by the workers), and its processes."""

    def __init__(self, tmp_path: Path, source: str, name: str, env: dict[str, str]) -> None:
        self.dir = tmp_path
        self.name = name
        self.log = tmp_path / "ran.jsonl"
        self.log.touch()
        (tmp_path / f"{name}.py").write_text(source)
        self.env = {**os.environ, **env, "T_LOG": str(self.log), "PYTHONPATH": str(tmp_path)}
        self._processes: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    def load(self) -> ModuleType:
        """Import the module in this process, with the test's environment."""
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("T_")})
        spec = importlib.util.spec_from_file_location(self.name, self.dir / f"{self.name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[self.name] = module
        spec.loader.exec_module(module)
        return module

    def start(self, *command: str, name: str) -> subprocess.Popen[bytes]:
        with open(self.dir / f"{name}.log", "ab") as out:  # the process keeps its own copy
            process = subprocess.Popen(
                command,
                cwd=self.dir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append(process)
        if name == "worker":
            self.workers.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process and every process it started (a worker's pool): no goodbye."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def dispatcher(self, store: str, transport: str, *options: str) -> subprocess.Popen[bytes]:
        return self.start(
            *duetime_cmd("run", "--store", store, "--transport", transport, *options), name="duetime"
        )

    def output(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop_all(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill(process)

    def ran(self) -> list[dict[str, Any]]:
        """What the workers recorded: whole lines only (a worker may be writing the last one)."""
        text = self.log.read_text()
        whole = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def wait_for(self, count: int, timeout: float, *, why: Callable[[], str] = str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ran = self.ran()
            if len(ran) >= count:
                return ran
            time.sleep(0.1)
        raise AssertionError(
            f"{len(self.ran())} of {count} tasks ran within {timeout} s\n"
            f"--- duetime:\n{self.output('duetime')}\n--- worker:\n{self.output('worker')}\n{why()}"
        )


@contextmanager
def app(tmp_path: Path, source: str, name: str, env: dict[str, str]) -> Iterator[App]:
    made = App(tmp_path, source, name, env)
    try:
        yield made
    finally:
        made.stop_all()
        loaded = sys.modules.pop(name, None)
        bridge = getattr(loaded, "bridge", None)
        if bridge is not None:  # the module loaded here opened its store: closed with the test
            bridge.close()


def once_each(ran: list[dict[str, Any]]) -> Counter[str]:
    """How often each tag ran; the tests want 1 for every one."""
    return Counter(str(r["tag"]) for r in ran)


def error_queue_copies(queue: str, count: int, timeout: float = 20) -> list[ReceivedMessage]:
    """What arrived in a RabbitMQ error queue (read with duetime's own RabbitMQ transport)."""
    from duetime.backends.rabbitmq import RabbitMqTransport

    async def read() -> list[ReceivedMessage]:
        transport = RabbitMqTransport.from_url(RABBITMQ)
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + timeout
        try:
            while len(got) < count and time.monotonic() < deadline:
                batch = await transport.receive(queue, 10, 0.5)
                got += batch
                await transport.acknowledge(batch)
            await transport.delete(queue)
        finally:
            await transport.close()
        return got

    return asyncio.run(read())
