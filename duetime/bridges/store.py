"""The blocking duetime client a bridge stores through: opened on first use, once per process.

Celery's prefork pool and Dramatiq's worker processes fork after the application module is
imported; a connection opened before the fork must not be shared by the children (SQLite and
PostgreSQL connections break when two processes use them). The client is therefore opened lazily
and opened again in a process that inherited another's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from duetime.client import SyncDelayedMessageClient
from duetime.errors import ScheduleExists
from duetime.inputs.identifiers import check_name
from duetime.message import Delay, resolve_due_time
from duetime.recurring import Recurrence, Schedule
from duetime.registry import check_store_url, connect_sync, store_url


class ProcessClient:
    """``get()`` gives this process's client for ``url`` and ``endpoint``."""

    def __init__(self, url: str | None, endpoint: str) -> None:
        # checked now, where the application installs the bridge, not at its first delayed task
        self.url = check_store_url(store_url(url))
        self.endpoint = check_name("endpoint", endpoint)
        self._lock = threading.Lock()
        self._client: SyncDelayedMessageClient | None = None
        self._pid = 0

    def get(self) -> SyncDelayedMessageClient:
        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._client = connect_sync(self.url, endpoint=self.endpoint)
                self._pid = os.getpid()
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None and self._pid == os.getpid():
                self._client.close()
            self._client = None


_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def as_timedelta(delay: Delay) -> timedelta:
    """A delay as the client takes it (seconds, a timedelta, ``"10m"``), checked the same way."""
    return resolve_due_time(due_at=None, delay=delay, now=_EPOCH) - _EPOCH


def put_recurring(
    client: SyncDelayedMessageClient,
    schedule_id: str,
    destination: str,
    body: bytes,
    when: Recurrence,
    headers: Mapping[str, str],
) -> Schedule:
    """Add the schedule, or, if its id is there, make it this one (from its next tick): what a
    ``beat_schedule`` entry declared, so an app may say it at every start."""
    try:
        return client.add_recurring(schedule_id, destination, body, when=when, headers=headers)
    except ScheduleExists:
        return client.change_recurring(
            schedule_id, when=when, destination=destination, body=body, headers=headers
        )
