"""Bulk work over delayed messages on Apache Spark (``pip install 'duetime[spark]'``).

Only this package imports PySpark. Each job has a Python function and a ``duetime bulk`` command:
:func:`migrate` / :func:`preview` / :func:`abort`, :func:`schedule`, :func:`export` / :func:`import_`,
and :func:`backlog` / :func:`lateness` for reports. Get a session with :func:`spark_session`.
"""

from duetime.bulk.export_import import Exported, export, import_
from duetime.bulk.filetarget import FileTarget
from duetime.bulk.migrate import MigrationResult, MigrationSpec, abort, migrate
from duetime.bulk.preview import Preview, preview
from duetime.bulk.report import Report, backlog, lateness, write_csv, write_html
from duetime.bulk.schedule import Scheduled, schedule
from duetime.bulk.spark_session import spark_session
from duetime.bulk.targets import StoreTarget, Target, open_target

__all__ = [
    "Exported",
    "FileTarget",
    "MigrationResult",
    "MigrationSpec",
    "Preview",
    "Report",
    "Scheduled",
    "StoreTarget",
    "Target",
    "abort",
    "backlog",
    "export",
    "import_",
    "lateness",
    "migrate",
    "open_target",
    "preview",
    "schedule",
    "spark_session",
    "write_csv",
    "write_html",
]
