"""A Spark standalone cluster on loopback, from the installed pyspark: a master and one-core
workers, each stopped by the process id started here (the tests and ``bench/cluster_bench.py``).

A worker may be started with one folder hidden behind an empty tmpfs in its own mount namespace:
to its executors that folder is a disk the driver has and they do not.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import suppress
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """A test killed by its timeout never reaches its teardown: the kernel then stops the cluster
    (PR_SET_PDEATHSIG survives the exec chain down to the JVM)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _hidden_from(folder: Path, command: list[str]) -> list[str]:
    """``command`` in a mount namespace where ``folder`` is an empty tmpfs (root, or a user
    namespace for everybody else)."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = 'mount -t tmpfs duetime-hidden "$0" && exec "$@"'
    return [
        "unshare",
        *user,
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(folder),
        *command,
    ]


class StandaloneCluster:
    def __init__(self, work: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.work = work
        port = free_port()
        self.master = f"spark://127.0.0.1:{port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOG_DIR": str(work)}
        self._start(
            "master", self._class("master.Master", "--port", str(port), "--webui-port", str(free_port()))
        )

    def _class(self, name: str, *args: str) -> list[str]:
        spark_class = str(self.home / "bin" / "spark-class")
        return [spark_class, f"org.apache.spark.deploy.{name}", "--host", "127.0.0.1", *args]

    def _start(self, name: str, command: list[str]) -> None:
        with (self.work / f"{name}.log").open("wb") as log:  # the process keeps its own copy
            self.procs.append(
                subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            )

    def add_worker(self, hidden: Path | None = None, timeout: float = 90) -> None:
        """Start a worker of one core and wait until the master has registered it."""
        n = len(self.procs)
        command = self._class(
            "worker.Worker", "--cores", "1", "--memory", "2g", "--webui-port", str(free_port()),
            "--work-dir", str(self.work / f"w{n}"), self.master,
        )  # fmt: skip
        self._start(f"worker{n}", command if hidden is None else _hidden_from(hidden, command))
        deadline = time.monotonic() + timeout
        while True:
            text = (self.work / "master.log").read_text(errors="replace")
            if text.count("Registering worker") >= n:
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a Spark process of the cluster exited:\n" + text[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {n} did not register with the master within {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM to each process group started here, SIGKILL after 20 s."""
        for proc in reversed(self.procs):
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
