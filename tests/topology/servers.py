"""Production topologies started by a test on its own ports and directories, and removed after:
PgBouncer in transaction pooling mode, a PostgreSQL primary with a synchronous standby. The
shared servers (../shared/SERVICES.md) are never stopped, restarted or reconfigured.

PostgreSQL's tools and PgBouncer refuse to run as root: they run as ``postgres``, in a directory
of its own (../shared/reference/local-topologies.md says what was seen to work here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.services import POSTGRES, free_port, require

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def as_postgres(*command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command run as the ``postgres`` user (root when the tests already run as someone else)."""
    if os.geteuid() == 0:
        command = ("runuser", "-u", "postgres", "--", *command)
    return subprocess.run(command, capture_output=True, text=True, check=check, timeout=timeout)


@contextmanager
def postgres_folder(prefix: str) -> Iterator[Path]:
    """A directory the ``postgres`` user owns, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        folder.chmod(0o700)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def answers(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for_port(port: int, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not answers(port):
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not answer on port {port} within {seconds} s")
        time.sleep(0.1)


@dataclass
class Bouncer:
    """A PgBouncer in transaction pooling mode in front of a PostgreSQL server."""

    port: int
    folder: Path
    process: subprocess.Popen[bytes]

    def url(self, database_url: str) -> str:
        """``database_url`` (host, port, database, options) pointed at the pooler instead."""
        parts = urlsplit(database_url)
        user = parts.username or "postgres"
        return parts._replace(netloc=f"{user}@127.0.0.1:{self.port}").geturl()

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def pgbouncer(server: str = POSTGRES, *, pool_size: int = 10, extra: str = "") -> Iterator[Bouncer]:
    """Debian's PgBouncer, ``pool_mode = transaction``, for every database of ``server``."""
    if shutil.which("pgbouncer") is None:
        pytest.fail("pgbouncer is not installed: apt-get install pgbouncer (scripts/test-topologies.sh does)")
    require(server)
    target = urlsplit(server)
    port = free_port()
    with postgres_folder("duetime-pgbouncer-") as folder:
        (folder / "users.txt").write_text('"postgres" ""\n')
        (folder / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={target.hostname} port={target.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
{extra}
"""
        )
        for name in ("users.txt", "pgbouncer.ini"):
            if os.geteuid() == 0:
                shutil.chown(folder / name, "postgres", "postgres")
        command = ["pgbouncer", str(folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, 15, "pgbouncer")
            yield Bouncer(port, folder, process)
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """End a server this test started (runuser passes the signal on), and wait for it."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
