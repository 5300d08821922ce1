"""A Spark driver that stays up and runs ``duetime bulk`` commands one after another, each as
``spark-submit … spark_job.py <command>`` would run it (the same ``bulk_app``, in a driver spark-submit
started), but on executors that are already warm.

Why: on a two-core machine every new Spark application costs 25 to 60 s before its first row (the
gateway, the session, two executor JVMs starting at once, cold executors), which the cluster tests
would otherwise pay once per job. Started by spark-submit, so its session is the one a cluster's own
tooling gives a job. It prints the settings that session ended up with, then ``port N``; each
connection sends a JSON list of arguments and reads back one JSON object: exit code, stdout, stderr.
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout

from duetime.bulk.spark_session import spark_session
from duetime.cli.bulk import bulk_app


def run(args: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            bulk_app(args, prog_name="duetime bulk")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except Exception:  # a bug the CLI let through: the test shows it, the driver stays up
            traceback.print_exc()
            code = 1
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    session = spark_session()
    conf = session.sparkContext.getConf()
    settings = {
        "tz": session.conf.get("spark.sql.session.timeZone"),
        "ui": conf.get("spark.ui.enabled"),
        "local_ip": os.environ.get("SPARK_LOCAL_IP"),
        "driver_host": conf.get("spark.driver.host"),
        "master": session.sparkContext.master,
    }
    print("settings " + json.dumps(settings), flush=True)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        print(f"port {server.getsockname()[1]}", flush=True)
        while True:
            connection, _ = server.accept()
            with connection, connection.makefile("rw", encoding="utf-8") as stream:
                request = json.loads(stream.readline())
                if request == "stop":
                    return
                stream.write(json.dumps(run(request)) + "\n")


if __name__ == "__main__":
    sys.exit(main())
