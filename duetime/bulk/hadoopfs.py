"""Files as the cluster sees them: through Hadoop filesystems (``file:``, ``hdfs:``, ``s3a:``, …).

A Python ``open`` in a Spark task writes to the disk of whichever machine ran the task, and a
driver's ``pathlib`` sees only the driver's disk: on a cluster both lose data quietly. So bulk jobs
read and write files only with Spark's DataFrame readers and writers (whose output commits
atomically: a folder is complete once ``_SUCCESS`` is in it), and the driver lists, checks and
removes through the Hadoop API of the same session, for whichever filesystems the cluster has.
A path without a scheme means what it means to Spark: the cluster's default filesystem.
"""

from __future__ import annotations

import glob
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from duetime.bulk.spark_session import first_line, local_path
from duetime.errors import ConfigurationError

#: Spark's writers mark a completely committed folder with this file.
COMMITTED = "_SUCCESS"


@dataclass(frozen=True)
class Listed:
    path: str
    size: int
    modified_ms: int


class Folder:
    """A path on one of the cluster's filesystems, seen from the driver."""

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        try:
            raw = jvm.org.apache.hadoop.fs.Path(path)
            self._fs = raw.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            self._path = self._fs.makeQualified(raw)
        except Exception as error:
            raise ConfigurationError(_why(path, error)) from None
        #: The full URI, as the executors will resolve it (scheme, host, absolute path).
        self.uri = str(self._path.toString())

    @property
    def one_writer(self) -> bool:
        """Whether Spark's tasks must write here one at a time. Hadoop's SFTP and FTP filesystems
        make a folder by looking, then creating each missing parent, so two tasks starting at once
        both find the job's ``_temporary`` folder missing and the second fails ("Can't make
        directory"). One server behind one connection is no faster written by several anyway."""
        return str(self._path.toUri().getScheme() or "").lower() in ("sftp", "ftp")

    def written_by(self, frame: Any) -> Any:
        """``frame`` as it should reach this folder's writer: in one partition where only one task
        may write (:attr:`one_writer`), as it is elsewhere. What comes before is read in parallel
        still."""
        return frame.repartition(1) if self.one_writer else frame

    def child(self, name: str) -> Folder:
        return Folder(self.spark, f"{self.uri.rstrip('/')}/{name}")

    def exists(self) -> bool:
        return bool(self._call(lambda: self._fs.exists(self._path)))

    def committed(self) -> bool:
        """Spark's writer finished and committed this folder."""
        return self.child(COMMITTED).exists()

    def delete(self) -> None:
        self._call(lambda: self._fs.delete(self._path, True))

    def rename_suffix(self, old: str, new: str) -> None:
        """Give each data file in the folder that ends in ``old`` the ending ``new`` (Spark's text
        writer names every file ``.txt``, whatever it holds)."""

        def rename() -> None:
            for listed in self.files():
                if listed.path.endswith(old):
                    here = self._jvm.org.apache.hadoop.fs.Path(listed.path)
                    there = self._jvm.org.apache.hadoop.fs.Path(listed.path[: -len(old)] + new)
                    if not self._fs.rename(here, there):
                        raise OSError(f"could not rename {listed.path}")

        self._call(rename)

    def names(self) -> list[str]:
        """The names directly in the folder (files and folders, hidden ones too); empty when it is
        not there."""

        def listing() -> list[str]:
            if not self._fs.exists(self._path):
                return []
            return sorted(str(s.getPath().getName()) for s in self._fs.listStatus(self._path))

        result: list[str] = self._call(listing)
        return result

    @property
    def on_this_disk(self) -> str | None:
        """The folder on this machine's disk, for a ``file:`` path; None on any other filesystem."""
        uri = self.uri
        return uri.removeprefix("file:") if uri.startswith("file:") else None

    def files(self) -> list[Listed]:
        """Every data file under the folder, or under each path a glob (``/in/*.parquet``, as
        Spark's readers take them) matches, in path order; empty when nothing is there. Spark's
        rule: names starting ``_`` or ``.`` are not data."""

        def walk() -> list[Listed]:
            found: list[Listed] = []
            for match in self._fs.globStatus(self._path) or []:
                top = str(match.getPath().toString())
                it = self._fs.listFiles(match.getPath(), True)
                while it.hasNext():
                    status = it.next()
                    path = str(status.getPath().toString())
                    relative = path[len(top) :].strip("/").split("/")
                    if any(part.startswith(("_", ".")) for part in relative if part):
                        continue
                    found.append(Listed(path, int(status.getLen()), int(status.getModificationTime())))
            return sorted(found, key=lambda f: f.path)

        result: list[Listed] = self._call(walk)
        return result

    def _call(self, action: Any) -> Any:
        try:
            return action()
        except Exception as error:
            raise ConfigurationError(_why(self.uri, error)) from None


def input_files(spark: Any, path: str) -> list[Listed]:
    """The data files a job is to read at ``path``; refused in one line when there are none (Spark
    would fail on a missing path with its own error, and read an empty folder as no rows)."""
    folder = Folder(spark, path)
    found = folder.files()
    if not found:
        globbed = any(c in path for c in "*?[{")
        what = (
            "holds no data files" if folder.exists() else "matches no file" if globbed else "does not exist"
        )
        raise ConfigurationError(f"{folder.uri}: {what}, so there is nothing to read; check the path.")
    return found


def check_readable_here(path: str, master: str | None, conf: Mapping[str, str]) -> None:
    """Refuse a path with nothing to read where this machine's disk can tell, before Spark takes
    seconds to start (:func:`input_files` says the same later for any filesystem)."""
    local = local_path(path, master, conf)
    if local is None or "{" in local:  # Hadoop's {a,b} has no counterpart in Python's glob
        return
    globbed = any(c in local for c in "*?[")
    if glob.glob(local, include_hidden=True) if globbed else os.path.exists(local):
        return
    what = "matches no file" if globbed else "does not exist"
    raise ConfigurationError(
        f"file:{os.path.abspath(local)}: {what}, so there is nothing to read; check the path."
    )


def check_writable(spark: Any, path: str) -> Folder:
    """Refuse, before anything is read or moved, a folder the job could not write for real.

    The executors write a small probe through Spark's writer; the driver must then see every file
    they wrote. A path on a disk only some machines have (the driver's own ``/tmp``, a worker's
    scratch folder) fails here, as does a scheme the cluster has no filesystem for.
    """
    folder = Folder(spark, path)
    existed = folder.exists()
    probe = folder.child(f"_duetime_probe-{uuid.uuid4().hex[:12]}")
    parts = 1 if folder.one_writer else max(2, int(spark.sparkContext.defaultParallelism))
    try:
        with quiet(spark):
            spark.range(0, parts, 1, parts).write.mode("overwrite").parquet(probe.uri)
    except Exception as error:
        probe_cleanup(probe if existed else folder)
        raise ConfigurationError(_why(folder.uri, error)) from None
    try:
        seen = len([f for f in probe.files() if f.path.endswith(".parquet")])
    finally:
        # a folder the probe made goes too: the job writes it again, and one that fails before
        # (a source that is not there) leaves no empty folder behind
        probe_cleanup(probe if existed else folder)
    if seen < parts:
        raise ConfigurationError(
            f"{folder.uri}: the executors wrote {parts} files there but the driver sees {seen}, so it is "
            "not a place every machine of the cluster shares. Write to a shared filesystem "
            "(hdfs://…, s3a://…, a mount every machine has), or run in local mode."
        )
    return folder


@contextmanager
def quiet(spark: Any) -> Iterator[None]:
    """Spark logs a failed task's Java stack on stderr; where we turn the failure into one line
    ourselves, it would only bury that line."""
    spark.sparkContext.setLogLevel("OFF")
    try:
        yield
    finally:
        spark.sparkContext.setLogLevel("ERROR")


def probe_cleanup(probe: Folder) -> None:
    with suppress(ConfigurationError):  # a probe we could not even create leaves nothing behind
        probe.delete()


def unreadable(path: str, fmt: str, error: Exception) -> str:
    """Why Spark could not read ``path`` as ``fmt`` (a file of another format, a broken one), in
    one line."""
    said = re.sub(r"^[\w.$]+(Exception|Error): ", "", first_line(error))  # the Java class's name
    return f"{path}: cannot be read as {fmt} ({said[:300]}); check the path and the format."


def _why(path: str, error: Exception) -> str:
    first = first_line(error)
    missing = "ClassNotFoundException" in first and "FileSystem" in first
    if missing or "No FileSystem for scheme" in first or "UnsupportedFileSystemException" in first:
        scheme = path.split(":", 1)[0]
        return (
            f"{path}: this Spark has no filesystem for {scheme!r} ({first.rsplit(':', 1)[-1].strip()}); "
            "add its connector to the cluster (e.g. hadoop-aws for s3a:) or use another filesystem."
        )
    return f"{path}: cannot be written or read ({first[:300]}); check the path and its permissions."
