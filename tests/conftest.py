"""Shared fixtures: subprocess helpers for tests that run duetime as a real process."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_server import Forks

ROOT = Path(__file__).resolve().parent.parent
TESTS = str(ROOT / "tests")

#: Every process the tests start themselves (``subprocess.Popen`` called from tests/), held until
#: it has ended and its pipes are closed: a test that reads a pipe, or kills a process and waits
#: for it, need not close each pipe by hand, and none is left to the garbage collector (an
#: unclosed pipe is a ResourceWarning, which fails the run).
_STARTED: list[subprocess.Popen[Any]] = []
_popen_init = subprocess.Popen.__init__


def _recorded_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    _popen_init(self, *args, **kwargs)
    caller = inspect.currentframe()
    if (
        caller is not None
        and caller.f_back is not None
        and caller.f_back.f_code.co_filename.startswith(TESTS)
    ):
        _STARTED.append(self)


subprocess.Popen.__init__ = _recorded_init  # type: ignore[method-assign]


def _close_ended(everything: bool = False) -> None:
    for process in list(_STARTED):
        if process.poll() is None and not everything:
            continue  # a fixture's process, still serving later tests
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        _STARTED.remove(process)


@pytest.fixture(autouse=True)
def _pipes_closed() -> Iterator[None]:
    """After each test, the pipes of the processes it started and that have ended are closed."""
    yield
    _close_ended()


@pytest.fixture(autouse=True)
def _python_ctrl_c(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with Python's own Ctrl-C handler, and a test that leaves another is named.

    A library can leave its own in the process: PySpark's SparkContext installs one that stays
    after the context stops, and a SIGINT ignored by a worker process is ignored by every process
    it starts. Tests that Ctrl-C themselves or a command they start then failed in a full run
    only, where another file's test had run first on the same worker ("DID NOT RAISE
    KeyboardInterrupt"; a `duetime load` that went on to the end)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    left = signal.getsignal(signal.SIGINT)
    if left is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print(
            f"{request.node.nodeid} left SIGINT handled by {left!r}; Python's own handler is back",
            file=sys.stderr,
        )


def pytest_sessionfinish() -> None:
    _close_ended(everything=True)


def duetime_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "duetime", *args]


def spawn_run(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A ``duetime run`` process (``args`` from :func:`duetime_cmd`) logging to a file of its own,
    with ``env`` added to this process's environment."""
    with log.open("wb") as out:
        return subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=out, env={**os.environ, **(env or {})}
        )


def wait_until_serving(log: Path, seconds: float = 60) -> None:
    """Until the process logging to ``log`` says it is dispatching: from then on a stop signal is a
    graceful stop. Sent during its start-up (imports take seconds on a loaded machine), Python's
    default ends it with -15 before it has claimed anything."""
    deadline = time.monotonic() + seconds
    while "dispatching endpoint" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"the dispatcher did not start: {log.read_text()[-2000:]}"
        time.sleep(0.05)


@contextlib.contextmanager
def sqlite_file(path: str | Path, **options: Any) -> Iterator[sqlite3.Connection]:
    """A connection to a SQLite file for a test to look or write with, committed when the block
    ends well and closed however it ends. ``with sqlite3.connect(...)`` only commits: since Python
    3.13 the connection left open is a ResourceWarning, which fails whichever test is running when
    it is collected."""
    conn = sqlite3.connect(path, **options)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def _closes_its_sqlite_connections() -> Iterator[None]:
    """Every SQLite connection a test opens, the test closes (through the store, queue or
    transport that holds it, or itself). Since Python 3.13 one left open is a ResourceWarning
    whenever it is collected, which fails whichever test runs then; here the test that opened it
    fails, on every Python, with where it was opened."""
    opened: list[tuple[sqlite3.Connection, str]] = []
    connect = sqlite3.connect

    def recording(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        stack = traceback.extract_stack(limit=16)[:-1]
        ours = [f"{Path(f.filename).name}:{f.lineno}" for f in stack if "/tests/" in f.filename]
        theirs = [f"{Path(f.filename).name}:{f.lineno}" for f in stack if "/duetime/" in f.filename]
        opened.append((conn, " <- ".join([*theirs[-3:][::-1], *ours[-2:][::-1]])))
        return conn

    sqlite3.connect = recording  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = connect
    left = []
    for conn, where in opened:
        try:
            conn.in_transaction  # noqa: B018 - raises once the connection is closed
        except sqlite3.ProgrammingError:
            continue
        left.append(where)
        with contextlib.suppress(Exception):
            conn.close()  # so that it fails no later test
    if left:
        pytest.fail(f"{len(left)} SQLite connection(s) left open, opened at: {'; '.join(sorted(set(left)))}")


def run_cli(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    errors: str = "strict",
) -> subprocess.CompletedProcess[str]:
    """``duetime ARGS`` run to its end: forked from a process that has imported the CLI already
    (tests/cli_server.py says why and what stays the same), else a new interpreter."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if _FORKS is not None:
        done = _FORKS.run(list(args), str(cwd or os.getcwd()), full_env, timeout, errors)
        if done is not None:
            return done
    return subprocess.run(
        duetime_cmd(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        errors=errors,
    )


#: DUETIME_TEST_FORKS=0 starts every command in a new interpreter, as the README's users do.
_FORKS = None if os.environ.get("DUETIME_TEST_FORKS") == "0" else Forks()


@pytest.fixture
def cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Run the CLI in a fresh folder: ``cli("schedule", "orders", "x", "--in", "1s")``."""

    def call(*args: str, ok: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
        result = run_cli(*args, cwd=tmp_path, **kw)  # type: ignore[arg-type]
        if ok and result.returncode != 0:
            raise AssertionError(
                f"duetime {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    return call


@pytest.fixture
def pg() -> Iterator[str]:
    """A PostgreSQL URL whose ``schema=`` is the test's own, dropped afterwards."""
    from tests.services import postgres_schema

    with postgres_schema() as url:
        yield url


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """At the end, how many tests were skipped for what (a server that did not answer, a program
    not installed), so a run that skipped says what to install: ``python3 scripts/services.py``."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        # "postgresql at 127.0.0.1:5432 does not answer (...)": one line per server, not per error text
        reason = reason.split(" (")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, and why")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:5d}  {reason}")
        terminalreporter.write_line(
            "python3 scripts/services.py says how to install and start what is missing."
        )


#: Where each xdist worker writes the test it is running, so that the controller can name it when
#: the worker dies: pytest-timeout ends a test that runs over by ending its worker, and what it
#: prints then is lost with the worker's captured output.
RUNNING = Path(os.environ.get("TMPDIR", "/tmp")) / f"duetime-tests-running-{os.getppid()}"


def pytest_runtest_logstart(nodeid: str) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        RUNNING.mkdir(exist_ok=True)
        (RUNNING / worker).write_text(f"{nodeid}\n{time.time()}\n")


class _HangNotes:
    """In a worker: a few seconds before a test's timeout, write every thread's stack and every
    asyncio task's to a file beside the breadcrumb, for the controller to print when the worker
    goes down. A hang is then a stack to read, not a test name to guess from."""

    def __init__(self, worker: str, default_timeout: float) -> None:
        self.worker, self.default_timeout = worker, default_timeout

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Any:
        import threading

        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker and marker.args else self.default_timeout
        timer = threading.Timer(max(1.0, seconds - 3), self._dump)
        timer.daemon = True
        if seconds > 0:
            timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _dump(self) -> None:
        import asyncio
        import faulthandler

        RUNNING.mkdir(exist_ok=True)
        with (RUNNING / f"{self.worker}.stacks").open("w") as out:
            out.write("threads:\n")
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
            out.write("asyncio tasks:\n")
            for task in list(getattr(asyncio.tasks, "_all_tasks", ())):
                with contextlib.suppress(Exception):  # read from another thread: best effort
                    if not task.done():
                        task.print_stack(limit=12, file=out)


class _CrashNotes:
    """On the controller: a worker that went down is named with the test it was running and for
    how long, so that a crash says which test to look at; and the summary says how many tests
    never ran (a worker that goes down ends the run, and pytest-xdist's own summary counts only
    what ran), so a third of the suite cannot be dropped in silence."""

    def __init__(self) -> None:
        self.collected: set[str] = set()
        self.reported: set[str] = set()
        self.down: list[str] = []

    @pytest.hookimpl
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected.update(ids)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reported.add(report.nodeid)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        never = sorted(self.collected - self.reported)
        if not never or not self.down:  # a run stopped by -x or Ctrl-C says so itself
            return
        terminalreporter.section("not run", red=True)
        terminalreporter.write_line(
            f"{len(never)} of {len(self.collected)} tests did not run: {'; '.join(self.down)}"
        )
        files = sorted({nodeid.split("::")[0] for nodeid in never})
        terminalreporter.write_line(
            f"in {len(files)} files: {', '.join(files[:12])}{' ...' if len(files) > 12 else ''}"
        )

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        if error is None:
            return
        note = RUNNING.parent / f"duetime-tests-running-{os.getpid()}" / node.gateway.id
        self.down.append(f"worker {node.gateway.id} went down")
        if note.exists():
            nodeid, started = note.read_text().split("\n")[:2]
            seconds = time.time() - float(started)
            self.down[-1] += f" {seconds:.0f} s into {nodeid}"
            sys.stderr.write(
                f"\n[{node.gateway.id}] went down {seconds:.0f} s into {nodeid} "
                "(a test that runs over its timeout ends its worker)\n"
            )
            stacks = note.parent / f"{node.gateway.id}.stacks"
            if stacks.exists():
                sys.stderr.write(f"where it was, {seconds - 3:.0f} s in:\n{stacks.read_text()[-12000:]}\n")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        import shutil

        shutil.rmtree(RUNNING.parent / f"duetime-tests-running-{os.getpid()}", ignore_errors=True)
        if self.down and self.collected - self.reported and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker and "SPARK_SUBMIT_OPTS" not in os.environ:  # the workers inherit it
        from tests.spark_jvm import options

        spark_options = options()
        if spark_options:
            os.environ["SPARK_SUBMIT_OPTS"] = spark_options
    if config.pluginmanager.hasplugin("xdist") and not worker:
        config.pluginmanager.register(_CrashNotes(), "duetime-crash-notes")
    if worker:
        default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
        config.pluginmanager.register(_HangNotes(worker, default), "duetime-hang-notes")


#: Each test file's seconds in a whole run (scripts/file-seconds.py writes it from a report).
FILE_SECONDS = Path(__file__).parent / "file-seconds.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, each kept whole and in its own order: with one file per worker at
    a time (``--dist loadfile``), a long file started last keeps the whole run waiting for it.
    A file the list does not know yet counts as long (it may be), so it starts early too."""
    import json

    try:
        seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return
    unknown = max(seconds.values(), default=0.0)
    root = Path(str(config.rootpath))

    def file_of(item: pytest.Item) -> str:
        return Path(str(item.path)).relative_to(root).as_posix()

    first_seen: dict[str, int] = {}
    spark: set[str] = set()
    for index, item in enumerate(items):
        first_seen.setdefault(file_of(item), index)
        if file_of(item).startswith("tests/bulk/") or item.get_closest_marker("spark"):
            spark.add(file_of(item))
    files = sorted(first_seen, key=lambda f: (-seconds.get(f, unknown), first_seen[f]))
    # a pytest-xdist worker (which orders the files it was given) knows how many there are
    workers = getattr(config, "workerinput", {}).get("workercount")
    if isinstance(workers, int) and workers > 1:
        files = spread(files, spark, SPARK_SIDE_BY_SIDE, workers)
    place = {f: n for n, f in enumerate(files)}
    items.sort(key=lambda item: place[file_of(item)])  # a stable sort: each file in its own order


#: How many Spark files may run side by side: each starts JVMs of 20 CPU-seconds, and six at once
#: on two cores ran tests past their timeouts.
SPARK_SIDE_BY_SIDE = 2


def spread(files: list[str], spark: set[str], most: int, window: int) -> list[str]:
    """``files`` in their order, but with no more than ``most`` of ``spark`` among any ``window``
    next to each other (the workers: pytest-xdist hands each its first files in turn, so files
    next to each other run side by side): a Spark file one too many waits for a place."""
    order: list[str] = []
    waiting = list(files)
    while waiting:
        recent = sum(1 for f in order[-(window - 1) :] if f in spark)
        pick = next((f for f in waiting if f not in spark or recent < most), waiting[0])
        waiting.remove(pick)
        order.append(pick)
    return order
