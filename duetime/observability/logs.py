"""Logs a machine can ingest: one record per line, ISO 8601 UTC timestamps, text or JSON.

A service's log goes to journald, Kubernetes or a collector, not to a person's terminal: records
are never wrapped or split over lines (a traceback, where one is logged, is folded into the same
record), and ``--log-format json`` (or ``DUETIME_LOG_FORMAT=json``) gives one JSON object a line.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime

from duetime.inputs.urls import scrub


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``2026-11-22T10:28:13.123Z WARNING duetime.dispatcher message`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        text = text.replace("\n", " | ")
        return scrub(f"{_timestamp(record)} {record.levelname} {record.name} {text}")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception, if any), plus
    the numbers of a record logged with ``extra={"fields": {...}}`` (the dispatcher's summary)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):
            entry.update({key: value for key, value in fields.items() if key not in entry})
        return json.dumps(
            {k: scrub(v) if isinstance(v, str) else v for k, v in entry.items()}, ensure_ascii=False
        )


#: Drivers that log every failed connection attempt with a traceback; duetime says it once.
DRIVER_LOGGERS = ("aiormq", "aio_pika", "psycopg.pool", "nats")


def quiet_drivers(verbose: bool = False) -> None:
    """Only the drivers' critical records, unless debugging (``-v`` or ``DUETIME_DEBUG``)."""
    for name in DRIVER_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.CRITICAL)


#: The format :func:`configure` set last; None before (a command that keeps no log).
_configured: LogFormat | None = None


def logging_json() -> bool:
    """Whether this process logs JSON: then its last word (an error it stops on) is a record too,
    not a line of text among the JSON that a collector would have to guess at."""
    return _configured is LogFormat.JSON


def configure(level: int, fmt: LogFormat = LogFormat.TEXT) -> None:
    """Send duetime's records (and its drivers' warnings) to stderr, one line each."""
    global _configured
    _configured = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("duetime").setLevel(level)
    quiet_drivers(verbose=level <= logging.DEBUG)
