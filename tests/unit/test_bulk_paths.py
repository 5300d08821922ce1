"""Which input paths a bulk job can check on this machine before Spark starts."""

from __future__ import annotations

import pytest

from duetime.bulk.spark_session import local_path


@pytest.fixture(autouse=True)
def _no_cluster_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "PYSPARK_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_file_paths_are_this_machines_whatever_the_master() -> None:
    assert local_path("file:///data/in", "spark://m:7077", {}) == "/data/in"
    assert local_path("file:/data/in", None, {}) == "/data/in"
    assert local_path("FILE:/data/in", "yarn", {}) == "/data/in"


def test_other_filesystems_are_for_spark_to_answer() -> None:
    for path in ("hdfs://nn/data", "s3a://bucket/data", "abfss://c@a.dfs.core.windows.net/d", "gs://b/d"):
        assert local_path(path, None, {}) is None


def test_a_path_without_a_scheme_is_local_only_in_local_mode_with_no_other_default_filesystem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert local_path("/data/in", None, {}) == "/data/in"
    assert local_path("data/in", "local[2]", {}) == "data/in"
    assert local_path("/data/in", "spark://m:7077", {}) is None  # the cluster's default filesystem
    assert local_path("/data/in", None, {"spark.hadoop.fs.defaultFS": "hdfs://nn"}) is None
    monkeypatch.setenv("HADOOP_CONF_DIR", "/etc/hadoop")  # core-site.xml may name another
    assert local_path("/data/in", None, {}) is None
    monkeypatch.delenv("HADOOP_CONF_DIR")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # spark-submit's master, whatever it is
    assert local_path("/data/in", None, {}) is None
