"""The bulk jobs on a real Spark standalone cluster: a master and two workers on loopback,
started here from the installed pyspark and torn down by their process ids.

The workers run in their own mount namespace where one folder of this machine is hidden behind an
empty tmpfs: to them it is a disk the driver has and they do not, like a driver's /tmp on a real
cluster. The jobs run in one driver spark-submit started (``warm_driver.py``: the same ``duetime
bulk`` commands spark_job.py runs, on executors that stay warm between jobs, as a new application per job
would cost 25 to 60 s here); one job runs through the ``duetime bulk --master spark://…`` command line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.bulk import sftp_server
from tests.bulk.conftest import count, create_timeoutdata, store_planner_rows, timeout_rows
from tests.bulk.sftp_server import Sftp
from tests.bulk.standalone import StandaloneCluster, die_with_parent
from tests.bulk.test_migrate import seed_store, store_rows
from tests.conftest import run_cli
from tests.services import postgres_schema

pytestmark = pytest.mark.slow

WARM_DRIVER = Path(__file__).with_name("warm_driver.py")


class Cluster:
    def __init__(self, master: str, hidden: Path) -> None:
        self.master = master
        #: A folder the driver sees and the executors do not.
        self.hidden = hidden

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``duetime bulk … --master spark://…``: a new application, as the command line starts one."""
        return run_cli("bulk", *args, "--master", self.master, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    hidden = tmp_path_factory.mktemp("driver-only")
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        for _ in range(2):
            standalone.add_worker(hidden)
        yield Cluster(standalone.master, hidden)
    finally:
        standalone.stop()


class Driver:
    """One spark-submit driver on the cluster, told ``--conf`` settings that differ from duetime's
    defaults (a time zone other than UTC, the UI on): every job below runs under them."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        self.log = work / "driver.log"
        env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
        env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "COLUMNS": "200"}
        command = [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master", cluster.master,
            "--conf", "spark.sql.session.timeZone=America/New_York",
            "--conf", "spark.ui.enabled=true",
            *(arg for key, value in sftp_server.spark_conf().items() for arg in ("--conf", f"{key}={value}")),
            str(WARM_DRIVER),
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, preexec_fn=die_with_parent
            )
        self.settings: dict[str, object] = json.loads(self._line("settings "))
        self.port = int(self._line("port "))

    def _line(self, prefix: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line.removeprefix(prefix)
            if self.process.poll() is not None:
                break
            time.sleep(0.3)
        raise AssertionError(f"the driver did not print {prefix!r}:\n" + self.log.read_text()[-4000:])

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``duetime bulk <args>`` in this driver, as spark-submit … spark_job.py <args> would run it."""
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as connection,
            connection.makefile("rw", encoding="utf-8") as stream,
        ):
            stream.write(json.dumps(list(args)) + "\n")
            stream.flush()
            answer = json.loads(stream.readline())
        return subprocess.CompletedProcess(list(args), answer["code"], answer["stdout"], answer["stderr"])

    def stop(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as connection:
                connection.sendall(b'"stop"\n')
            self.process.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


class WarmDriver:
    """The driver of this module, started when a test first needs it. A standalone cluster gives a
    running application every core, so a test that starts its own application stops it first."""

    def __init__(self, cluster: Cluster, work: Path) -> None:
        self.cluster, self.work = cluster, work
        self.running: Driver | None = None

    def get(self) -> Driver:
        if self.running is None:
            self.running = Driver(self.cluster, self.work)
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None


@pytest.fixture(scope="module")
def warm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmDriver]:
    holder = WarmDriver(cluster, tmp_path_factory.mktemp("driver"))
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def driver(warm: WarmDriver) -> Driver:
    return warm.get()


@pytest.fixture(scope="module")
def sftp(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sftp]:
    root = cluster.hidden / "sftp"
    root.mkdir()
    server = Sftp(root, tmp_path_factory.mktemp("sftp"))  # executors reach it over the network
    try:
        yield server
    finally:
        server.stop()


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


@pytest.mark.timeout(420)
def test_a_folder_only_the_driver_has_is_refused_before_anything_moves(
    cluster: Cluster, warm: WarmDriver
) -> None:
    warm.stop()  # the command line starts an application of its own: it needs the cores
    with postgres_schema() as pg:
        seed_store(pg, "Keep", 300)
        target = cluster.hidden / "out"
        result = cluster.run(
            "migrate", "--from", pg, "--to", f"parquet:{target}", "--endpoint", "Keep", "--mode", "migrate"
        )
        assert result.returncode == 1
        # the one-line error; on a loaded machine the JVM may log its own shutdown after it
        assert "not a place every machine of the cluster shares" in result.stderr
        assert "Traceback" not in result.stderr
        assert len(store_rows(pg, "Keep")) == 300  # nothing left the source
        assert not target.exists()  # export and schedule's rejects ask the same check_writable


@pytest.mark.timeout(600)  # with the driver's start: five jobs
def test_migrate_then_export_and_import_row_for_row_and_new_files_are_a_new_import(
    driver: Driver, tmp_path: Path
) -> None:
    with postgres_schema() as pg:
        # a legacy TimeoutData table moves into a duetime store, batch by batch, on both executors
        rows = timeout_rows(6_000)
        legacy = create_timeoutdata(pg, "Orders_TimeoutData", rows)
        out = _ok(
            driver.run(
                "migrate",
                "--from",
                pg + "&layout=timeoutdata",
                "--to",
                pg,
                "--endpoint",
                "Orders",
                "--mode",
                "migrate",
                "--batch-rows",
                "1000",
                "--json",
            )
        )
        assert json.loads(out)["inserted"] == 6_000 and count(legacy, "Orders_TimeoutData") == 0
        moved = store_rows(pg, "Orders")
        assert {m.message_id: m.body for m in moved.values()} == {str(r[0]): r[3] for r in rows}
        # the store's table was filled from empty: its planner statistics were refreshed on the way
        assert store_planner_rows(pg, "Orders") >= 1_000

        # export, then import into another store: row for row
        exported = tmp_path / "export"
        _ok(driver.run("export", "--from", pg, "--to", f"parquet:{exported}", "--endpoint", "Orders"))
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        imported = json.loads(
            _ok(driver.run("import", "--from", f"parquet:{exported}", "--to", copy, "--json"))
        )
        assert imported["inserted"] == 6_000
        assert store_rows(copy, "Orders") == moved

        # different files under the same path are a new import, not "written before"
        other = f"sqlite:///{tmp_path / 'other.db'}"
        others = seed_store(other, "Later", 500, start=datetime.now(UTC) + timedelta(days=3))
        _ok(driver.run("export", "--from", other, "--to", f"parquet:{exported}"))
        again = json.loads(_ok(driver.run("import", "--from", f"parquet:{exported}", "--to", copy, "--json")))
        assert again["inserted"] == 500, again
        assert store_rows(copy, "Orders") == moved
        assert set(store_rows(copy, "Later")) == {m.message_id for m in others}


@pytest.mark.timeout(420)
def test_a_networked_filesystem_takes_a_migration_gives_it_back_and_takes_an_export(
    driver: Driver, sftp: Sftp, tmp_path: Path
) -> None:
    """``sftp://`` stands for HDFS, S3 and the like: a Hadoop filesystem the cluster is configured
    with (``--conf spark.hadoop.fs.sftp.impl=…``), reached over the network, whose files no local
    path of an executor or of the driver names. Every file operation of the jobs (the probe, the
    committed folder, the run's listing, the reads) goes through it."""
    with postgres_schema() as pg:
        messages = {m.message_id: m for m in seed_store(pg, "Net", 3_000)}
        moved = json.loads(
            _ok(
                driver.run(
                    "migrate", "--from", pg, "--to", f"parquet:{sftp.url}/timeouts", "--endpoint", "Net",
                    "--mode", "migrate", "--json",
                )
            )
        )  # fmt: skip
        assert moved["inserted"] == 3_000 and store_rows(pg, "Net") == {}
        assert len(list((sftp.root / "timeouts").glob("run=*/_SUCCESS"))) == 1
        assert not list((sftp.root / "timeouts").glob("**/_duetime_probe-*"))  # the probe cleaned up
        copy = f"sqlite:///{tmp_path / 'copy.db'}"
        back = json.loads(
            _ok(driver.run("import", "--from", f"parquet:{sftp.url}/timeouts", "--to", copy, "--json"))
        )
        assert back["inserted"] == 3_000 and store_rows(copy, "Net") == messages
        _ok(driver.run("export", "--from", copy, "--to", f"jsonl:{sftp.url}/export"))
        exported = [
            json.loads(line)
            for f in (sftp.root / "export").glob("part-*")
            for line in f.read_text().splitlines()
        ]
        assert sorted(row["message_id"] for row in exported) == sorted(messages)
        assert (sftp.root / "export" / "_SUCCESS").exists()


@pytest.mark.timeout(300)
def test_an_error_of_ours_in_an_executor_is_the_one_line_it_says(
    cluster: Cluster, driver: Driver, tmp_path: Path
) -> None:
    """A SQLite store on the driver's disk, which the executors do not have: the driver makes the
    tables, then each task's connection fails. Spark hands the driver that failure inside its own
    (a Python traceback in a Java exception), which came out as "internal error" and a stack."""
    rows = tmp_path / "rows"
    seed_store(f"sqlite:///{tmp_path / 'source.db'}", "Local", 200)
    _ok(driver.run("export", "--from", f"sqlite:///{tmp_path / 'source.db'}", "--to", f"parquet:{rows}"))
    stores = cluster.hidden / "stores"
    stores.mkdir()
    result = driver.run("import", "--from", f"parquet:{rows}", "--to", f"sqlite:///{stores}/store.db")
    assert result.returncode == 1, result.stdout
    # the progress line that a job taking over 10 s prints off a terminal (a loaded machine) aside
    said = [line for line in result.stderr.strip().splitlines() if not line.startswith("importing: ")]
    assert len(said) == 1, result.stderr
    assert said[0].startswith("error: Folder ") and "does not exist; create it" in said[0]
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.timeout(420)
def test_schedule_from_several_files_then_migrate_into_a_folder(driver: Driver, tmp_path: Path) -> None:
    with postgres_schema() as pg:
        # schedule from Parquet in several files (several tasks), with a reject
        import pyarrow as pa
        import pyarrow.parquet as pq

        due = datetime(2031, 5, 1, tzinfo=UTC)
        source = tmp_path / "reminders"
        source.mkdir()
        for part in range(4):
            ids = [f"r{part}-{i}" for i in range(750)]
            pq.write_table(
                pa.table(
                    {
                        "id": ids,
                        "destination": ["crm"] * 750,
                        "due_at": [due] * 750,
                        "body": [i.encode() for i in ids],
                    }
                ),
                source / f"part-{part}.parquet",
            )
        pq.write_table(
            pa.table({"id": ["bad"], "destination": [""], "due_at": [due], "body": [b""]}),
            source / "part-9.parquet",
        )
        rejects = tmp_path / "rejects"
        done = _ok(
            driver.run(
                "schedule",
                f"parquet:{source}",
                "--to",
                pg,
                "--endpoint",
                "crm",
                "--job",
                "rem",
                "--rejects",
                str(rejects),
            )
        )
        assert "3,001 rows: 3,000 stored, 0 already scheduled, 1 rejected" in done
        assert len(store_rows(pg, "crm")) == 3_000
        assert [
            json.loads(line)["message_id"]
            for f in rejects.glob("part-*")
            for line in f.read_text().splitlines()
        ] == ["bad"]

        # a migration into a folder: the source lets go only of what the committed files hold
        folder = tmp_path / "moved"
        out = _ok(
            driver.run(
                "migrate",
                "--from",
                pg,
                "--to",
                f"jsonl:{folder}",
                "--endpoint",
                "crm",
                "--mode",
                "migrate",
                "--batch-rows",
                "1000",
                "--json",
            )
        )
        assert json.loads(out)["inserted"] == 3_000 and store_rows(pg, "crm") == {}
        lines = [json.loads(x) for f in folder.glob("run=*/part-*") for x in f.read_text().splitlines()]
        assert sorted(x["message_id"] for x in lines) == sorted(
            f"r{p}-{i}" for p in range(4) for i in range(750)
        )


@pytest.mark.timeout(420)
def test_through_spark_submit_the_clusters_settings_win_and_the_driver_is_not_bound_to_loopback(
    driver: Driver, cluster: Cluster
) -> None:
    # duetime's defaults (UTC, no UI) gave way to what spark-submit was told
    host = driver.settings.pop("driver_host")
    assert driver.settings == {
        "tz": "America/New_York",
        "ui": "true",
        "local_ip": None,
        "master": cluster.master,
    }
    assert host and not host.startswith("127."), host  # an address executors elsewhere reach
    with postgres_schema() as pg:
        seed_store(pg, "Report", 2_000)
        reported = driver.run("report", "--store", pg)
    assert "2,000 stored messages" in _ok(reported)  # the report job ran on the cluster
    assert "reading: 2,000 of 2,000 rows (100%), " in reported.stderr  # its progress, in rows


def test_local_mode_binds_the_session_to_loopback_and_leaves_the_environment_alone(tmp_path: Path) -> None:
    """Loopback is a setting of the local session, not SPARK_LOCAL_IP in the process (a cluster
    session started later would be bound to it); a host the user gives wins."""
    code = (
        "import os; from duetime.bulk.spark_session import spark_session; import sys; "
        "s = spark_session('local[1]', dict(a.split('=', 1) for a in sys.argv[1:])); c = s.sparkContext.getConf(); "
        "print(c.get('spark.driver.host'), c.get('spark.driver.bindAddress'), os.environ.get('SPARK_LOCAL_IP'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_LOCAL_IP"}
    assert _printed(code, [], env, tmp_path) == ["127.0.0.1", "127.0.0.1", "None"]
    given = ["spark.driver.host=localhost"]
    assert _printed(code, given, env, tmp_path) == ["localhost", "127.0.0.1", "None"]


def test_spark_defaults_conf_wins_over_duetimes_defaults(tmp_path: Path) -> None:
    """A session started by duetime (no spark-submit) keeps what the cluster's spark-defaults.conf
    says, though duetime would pick UTC and no UI."""
    (tmp_path / "spark-defaults.conf").write_text(
        "# the cluster's own settings\nspark.sql.session.timeZone   Asia/Tokyo\nspark.ui.enabled=true\n"
    )
    code = (
        "from duetime.bulk.spark_session import spark_session; s = spark_session('local[1]'); "
        "print(s.conf.get('spark.sql.session.timeZone'), s.sparkContext.getConf().get('spark.ui.enabled'))"
    )
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path)}
    assert _printed(code, [], env, tmp_path) == ["Asia/Tokyo", "true"]


def _printed(code: str, args: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """The words ``code`` prints, run in a fresh Python (a Spark session of its own)."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()
