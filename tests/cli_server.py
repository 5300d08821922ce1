"""Short ``duetime`` commands for the tests, each a process forked from one that has already imported
the CLI, instead of a new interpreter that imports it again.

Why: the suite runs about 1,200 short commands (``setup``, ``schedule``, ``list``, a bad flag...).
A new ``python -m duetime`` spends about 0.25 CPU-seconds importing duetime, asyncio, Rich and
Typer before its command starts, more on two cores kept busy by everything else. A fork of a
process that has imported them starts the command at once: a whole run took 1,470 CPU-seconds
instead of about 2,300, 12-13 minutes instead of 19-21 (``DUETIME_TEST_FORKS=0`` starts each
command anew, to compare).

What the command gets is what ``python -m duetime`` would give it: its own process (its exit code,
its atexit handlers and non-daemon threads waited for, a kill ends only it), the arguments
byte for byte, the caller's environment and working folder, stdout and stderr in files the caller
reads, stdin empty. Where the environment differs in something Python or Rich read while
importing (the locale, ``COLUMNS``, ``PYTHON*``, ``LD_PRELOAD`` for faketime...), the caller runs a
new interpreter instead (:func:`forkable`).

Run as ``python -m tests.cli_server SOCKET``; it prints ``ready`` once it listens. Each
connection: the request (pickled, with the two file descriptors beside it), then the command's
process id, then its exit code.
"""

from __future__ import annotations

import array
import atexit
import gc
import locale
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Variables the forked command may see changed from the server's: read while a command runs,
#: never while importing (pytest names the running test in one; Spark's are read as a job starts).
_MAY_DIFFER = ("DUETIME_", "SSL_CERT_", "PG", "PYTEST_CURRENT_TEST", "SPARK_", "PYSPARK_", "JAVA_")


def forkable(env: Mapping[str, str], server_env: Mapping[str, str]) -> bool:
    """Whether a command with ``env`` may be forked from a server started with ``server_env``."""
    for name in env.keys() | server_env.keys():
        if env.get(name) != server_env.get(name) and not name.startswith(_MAY_DIFFER):
            return False
    return True


def send(conn: socket.socket, value: Any, fds: list[int] | None = None) -> None:
    data = pickle.dumps(value)
    frame = struct.pack("!I", len(data)) + data
    if fds:
        conn.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        conn.sendall(frame)


def receive(conn: socket.socket, with_fds: int = 0) -> tuple[Any, list[int]]:
    """One framed value, and the file descriptors sent with it."""
    fds: list[int] = []
    header = b""
    while len(header) < 4:
        if with_fds and not fds:
            part, fds, _, _ = socket.recv_fds(conn, 4 - len(header), with_fds)
        else:
            part = conn.recv(4 - len(header))
        if not part:
            raise EOFError("the other side closed the connection")
        header += part
    (size,) = struct.unpack("!I", header)
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            raise EOFError("the other side closed the connection")
        data += part
    return pickle.loads(data), fds


def _serve(listener: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Accept for ever; returns only in a forked process that must run a command."""
    parent = os.getppid()
    while True:
        if not select.select([listener], [], [], 5)[0]:
            if os.getppid() != parent:  # the test process is gone (killed): so is this server
                os._exit(0)
            continue
        conn, _ = listener.accept()
        if os.fork() != 0:
            conn.close()
            continue
        # the connection's own process: starts the command, answers its pid and then its exit code
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request, fds = receive(conn, with_fds=2)
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        if _sent(conn, pid):  # else the caller has gone: nobody is left to tell how it ended
            _, status = os.waitpid(pid, 0)
            _sent(conn, os.waitstatus_to_exitcode(status))
        os._exit(0)


def _sent(conn: socket.socket, value: Any) -> bool:
    """Sent, or the caller has gone (it gave up waiting and killed the command)."""
    try:
        send(conn, value)
    except OSError:
        return False
    return True


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this fork into ``python -m duetime ARGS`` started in the request's folder and environment."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (stdin, *fds):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.path[0] = request["cwd"]
    sys.argv = [request["main"], *request["args"]]


class Forks:
    """The client: one server per test process, started at its first command and ended with it."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[bytes] | None = None
        self._folder = ""
        self._env: dict[str, str] = {}

    def run(
        self, args: list[str], cwd: str, env: dict[str, str], timeout: float, errors: str
    ) -> subprocess.CompletedProcess[str] | None:
        """The command's result, or None when it must run in a new interpreter (see :func:`forkable`)."""
        if self._server is None:
            self._start(env)
        if self._server is None or self._server.poll() is not None or not forkable(env, self._env):
            return None
        request = {"args": args, "cwd": cwd, "env": env, "main": _MAIN}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(os.path.join(self._folder, "socket"))
                send(conn, request, [out.fileno(), err.fileno()])
                pid, _ = receive(conn)
                conn.settimeout(timeout)
                try:
                    code, _ = receive(conn)
                except TimeoutError:
                    os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(
                        [sys.executable, "-m", "duetime", *args],
                        timeout,
                        _read(out, errors),
                        _read(err, errors),
                    ) from None
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "duetime", *args], code, _read(out, errors), _read(err, errors)
            )

    def _start(self, env: dict[str, str]) -> None:
        self._folder = tempfile.mkdtemp(prefix="duetime-cli-")
        self._env = dict(env)
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_server", os.path.join(self._folder, "socket")],
            cwd=Path(__file__).parent.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a test's Ctrl-C to its own process group leaves it serving
        )
        atexit.register(self.stop)
        assert self._server.stdout is not None
        if self._server.stdout.readline() != b"ready\n":  # it could not start: every command runs anew
            self.stop()

    def stop(self) -> None:
        if self._server is not None:
            if self._server.poll() is None:
                self._server.kill()
                self._server.wait()
            if self._server.stdout is not None:
                self._server.stdout.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _read(file: Any, errors: str) -> str:
    """What the command wrote, decoded as ``subprocess.run(..., text=True)`` decodes it."""
    file.seek(0)
    text: str = file.read().decode(locale.getpreferredencoding(False), errors)
    return text.replace("\r\n", "\n").replace("\r", "\n")


_MAIN = str(Path(__file__).parent.parent / "duetime" / "__main__.py")


def main() -> None:
    import duetime.cli

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the connections' processes end unwaited
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    print("ready", flush=True)
    gc.freeze()  # what was imported stays shared with the forks: the collector never touches it
    request, fds = _serve(listener)
    _become(request, fds)
    from duetime.cli import main as duetime

    duetime()


if __name__ == "__main__":
    main()
