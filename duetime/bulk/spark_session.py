"""The SparkSession every bulk job runs in: local mode by default, any cluster by ``--master``."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from duetime.errors import ConfigurationError, MissingExtra
from duetime.settings import ENCRYPTION_KEYS_VARIABLE, SPARK_LOGS_VARIABLE, variable

DEFAULT_MASTER = "local[*]"
#: Set (to anything) to see Spark's own console output; it goes to a log file otherwise.
#: What duetime prefers where nobody said otherwise (``--conf``, spark-submit, spark-defaults.conf).
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    # Parquet times as TIMESTAMP(MICROS, UTC): Spark's default, the legacy INT96, is read as a
    # time without a zone by pyarrow, pandas and DuckDB (``bulk export``'s due_at)
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

#: Local mode needs no other interface; on a cluster the driver must advertise one the executors
#: reach, so these apply to ``local[…]`` only. Settings of the session, not the process's
#: environment (``SPARK_LOCAL_IP``), so a cluster session started later in the same process is
#: not bound to loopback.
LOCAL_DEFAULTS = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


def spark_session(
    master: str | None = None, conf: Mapping[str, str] | None = None, app: str = "duetime-bulk"
) -> Any:
    """Get (or reuse) a SparkSession. Under ``spark-submit`` the master it was given wins."""
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError:
        raise MissingExtra.of(
            "`duetime bulk`", "spark", library="pyspark", also=" (and Java 17 or newer)"
        ) from None
    # Executors must run this interpreter (with duetime and its drivers), not whatever is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submitted = _submitted()
    if master:
        check_master(master)
    settings = {"spark.app.name": app}
    if master or not submitted:
        settings["spark.master"] = master or DEFAULT_MASTER
    given = _configured(submitted) | set(conf or {})
    local = runs_here(master)
    for key, value in (DEFAULTS | (LOCAL_DEFAULTS if local else {})).items():
        if key not in given:  # spark-submit --conf, spark-defaults.conf and the cluster win
            settings[key] = value
    settings |= dict(conf or {})
    # The tasks seal what they write with the driver's keyring: its file, at the same path (a
    # cluster's executors need the file there; a task without it stops, never writes plaintext).
    keys, keys_setting = variable(ENCRYPTION_KEYS_VARIABLE), f"spark.executorEnv.{ENCRYPTION_KEYS_VARIABLE}"
    if keys and keys_setting not in given:
        settings[keys_setting] = os.path.abspath(keys)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    log = None
    try:
        if not submitted and not variable(SPARK_LOGS_VARIABLE) and not _gateway_running():
            log = os.path.join(tempfile.gettempdir(), f"duetime-spark-{os.getpid()}.log")
            _start_quietly(settings, log)
        session = builder.getOrCreate()
        if log is not None:  # started: the log is only noise now, gone with the process
            atexit.register(_remove, log)
    except Exception as error:  # the JVM's reason is on stderr (or in its log); this is one line
        where = f"; Spark's own log: {log}" if log else ""
        raise ConfigurationError(
            f"Spark did not start ({first_line(error)[:300]}); check --master, --conf and Java (17 or newer){where}."
        ) from None
    session.sparkContext.setLogLevel("ERROR")
    return session


def _gateway_running() -> bool:
    """Whether this process has started Spark's JVM already (a session stopped and started again
    reuses it). PySpark has no public way to ask: its SparkContext keeps the gateway it launched."""
    from pyspark import SparkContext

    return getattr(SparkContext, "_gateway", None) is not None


def _start_quietly(settings: Mapping[str, str], path: str) -> None:
    """Start Spark's JVM with its console output (about eight lines of start-up notices and
    warnings on every run) in the log file ``path`` instead of the terminal (an error starting
    Spark points at it). ``DUETIME_SPARK_LOGS=1`` leaves them on the terminal."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    spark_conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    with open(path, "ab") as log:  # the JVM keeps its own copy of the file; ours closes here
        gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": log, "stderr": log})  # type: ignore[no-untyped-call]
    SparkContext(conf=spark_conf, gateway=gateway)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _submitted() -> bool:
    """Under spark-submit the JVM gateway already runs, started with the --master it was given."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def runs_here(master: str | None) -> bool:
    """Whether a job started with ``master`` runs in local mode in this process (driver and
    executors on this machine), not under spark-submit or on a cluster."""
    return not _submitted() and (master or DEFAULT_MASTER).startswith("local")


def first_line(error: Exception) -> str:
    """A JVM error's first line: what failed, without the Java stack."""
    text = str(getattr(error, "java_exception", None) or error)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)


def local_path(path: str, master: str | None, conf: Mapping[str, str]) -> str | None:
    """The path on this machine's disk that a job's ``path`` names, where that is certain before
    Spark starts: a ``file:`` path, or one without a scheme in local mode with no other default
    filesystem configured (``fs.defaultFS`` in ``--conf``, spark-defaults.conf or a Hadoop
    configuration folder). None where only Spark can tell (``hdfs:``, ``s3a:``, a cluster)."""
    scheme = re.match(r"([A-Za-z][\w+.-]+):", path)
    if scheme is not None:
        return (
            re.sub(r"^file:(//[^/]*)?", "", path, flags=re.IGNORECASE)
            if scheme[1].lower() == "file"
            else None
        )
    if not runs_here(master) or any(os.environ.get(v) for v in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")):
        return None
    try:
        configured = _configured()
    except ModuleNotFoundError:  # no PySpark: starting Spark says so
        return None
    return None if "spark.hadoop.fs.defaultFS" in set(conf) | configured else path


#: The masters Spark takes (spark-submit's own check, and the standalone master's URL form).
_MASTER = re.compile(r"local(\[\s*(\*|\d+)\s*(,\s*\d+\s*)?\])?|local-cluster\[.+\]|yarn|k8s://.+|spark://.+")


def check_master(master: str) -> None:
    """Refuse a master Spark would not take, and a standalone master that does not answer, in one
    line and at once: Spark would print a Java stack, or retry for a minute before giving up."""
    if not _MASTER.fullmatch(master):
        raise ConfigurationError(
            f"--master {master!r} is not a Spark master: use local[*], spark://host:7077, yarn or "
            "k8s://https://host:port."
        )
    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master.removeprefix("spark://").split(","):  # several: a master and standbys
        host, colon, port = address.rpartition(":")
        if not colon or host.endswith(":"):  # no port (or a bare IPv6 address): Spark's default
            host, port = address, "7077"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            return
        except (OSError, ValueError) as error:
            reasons.append(f"{address}: {getattr(error, 'strerror', None) or error}")
    raise ConfigurationError(
        f"cannot connect to the Spark master {master} ({'; '.join(reasons)}); check that it runs "
        "and that this machine reaches it."
    )


def _configured(submitted: bool = False) -> set[str]:
    """The settings Spark already has: spark-submit's ``--conf`` (in the gateway it started) and
    spark-defaults.conf (which a gateway we start reads, under our settings otherwise)."""
    from pyspark import SparkConf, SparkContext

    if submitted:  # connect to spark-submit's gateway (starting ours here would lose driver memory)
        SparkContext._ensure_initialized()
    given = {key for key, _ in SparkConf().getAll()} if SparkContext._jvm is not None else set()
    folder = os.environ.get("SPARK_CONF_DIR") or os.path.join(_spark_home(), "conf")
    try:
        with open(os.path.join(folder, "spark-defaults.conf"), encoding="utf-8") as lines:
            for line in lines:
                words = line.split(None, 1)
                if words and not words[0].startswith("#"):
                    given.add(words[0].split("=", 1)[0])
    except OSError:
        pass  # no defaults file: nothing configured there
    return given


def _spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return str(os.environ.get("SPARK_HOME") or _find_spark_home())


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``--conf key=value`` pairs, as spark-submit takes them."""
    conf: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"--conf {pair!r} is not key=value; e.g. --conf spark.executor.memory=4g."
            )
        conf[key.strip()] = value
    return conf
