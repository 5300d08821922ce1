"""Spark's JVM started for a test's job costs a third of what it did: a class archive of this
venv's Spark and a JIT that stops at its first tier, through ``SPARK_SUBMIT_OPTS`` (read by
``spark-submit``, which starts the driver's JVM for every job, in the tests' own processes and in
the ``duetime bulk`` commands they run).

Why: each job's JVM started from nothing spends about 20 CPU-seconds loading and compiling
Spark's classes before it reads a row (an empty ``bulk export`` measured here: 20 CPU-s and 12 s;
with both: 8 CPU-s and 6 s). The suite starts that JVM about a hundred times on two cores, and
six workers starting theirs at once starved each other past their timeouts. The jobs' rows and
results are the same; only the JVM's start-up changes. The archive is built once per venv (about
half a minute, under a lock the parallel workers share), kept beside the venv's Spark, and
rebuilt when Java or Spark changes. Anything going wrong here leaves the JVM as it was.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

#: Stop the JIT at C1: a test's job is over before C2's compilations would pay for themselves.
FIRST_TIER = "-XX:TieredStopAtLevel=1"

_BUILD = """
from pyspark import SparkContext
from duetime.bulk.spark_session import spark_session

spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "4"})
proc = SparkContext._gateway.proc
rows = spark.range(1000).selectExpr("id", "cast(id as string) as body", "current_timestamp() as due_at")
rows.write.parquet(sys.argv[1])
spark.read.parquet(sys.argv[1]).groupBy("body").count().collect()
spark.stop()
proc.stdin.close()  # the JVM ends on end of input, and writes the archive as it ends
proc.wait(timeout=180)
"""


def options() -> str | None:
    """The JVM options that start Spark faster, or None (no pyspark, no Java, or no archive)."""
    try:
        import pyspark
    except ModuleNotFoundError:
        return None
    try:
        java = subprocess.run(
            [_java(), "-version"], capture_output=True, text=True, timeout=60, check=True
        ).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256(f"{java}\0{pyspark.__file__}\0{pyspark.__version__}".encode()).hexdigest()[:16]
    folder = Path(sys.prefix) / "var" / "duetime-tests"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"spark-{key}.jsa"
    with (folder / "spark-archive.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait for its archive
        if not archive.exists() and not _build(archive):
            return FIRST_TIER
    return f"-XX:SharedArchiveFile={archive} {FIRST_TIER}"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


def _build(archive: Path) -> bool:
    """Run a small job whose JVM writes the classes it loaded to ``archive`` as it ends."""
    import tempfile

    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-XX:ArchiveClassesAtExit={partial}"}
    with tempfile.TemporaryDirectory() as work:
        try:
            subprocess.run(
                [sys.executable, "-c", "import sys\n" + _BUILD, os.path.join(work, "rows")],
                env=env,
                capture_output=True,
                timeout=300,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as error:
            sys.stderr.write(f"Spark's class archive was not built ({error}); Spark starts slower\n")
            return False
    if not partial.exists():
        return False
    partial.rename(archive)
    return True
