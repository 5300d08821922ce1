"""The SparkSession every bulk job runs in: local mode by default, any cluster by ``--master``."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from duetime.errors import ConfigurationError

DEFAULT_MASTER = "local[*]"


def spark_session(
    master: str | None = None, conf: Mapping[str, str] | None = None, app: str = "duetime-bulk"
) -> Any:
    """Get (or reuse) a SparkSession. Under ``spark-submit`` the master it was given wins."""
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError:
        raise ConfigurationError(
            "Bulk jobs need PySpark: pip install 'duetime[spark]' (and Java 17)."
        ) from None
    # Executors must run this interpreter (with duetime and its drivers), not whatever is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode needs no other interface
    builder = SparkSession.builder.appName(app)
    # Under spark-submit the JVM gateway already runs, started with the --master it was given.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not submitted:
        builder = builder.master(master or DEFAULT_MASTER)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
    }
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


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
