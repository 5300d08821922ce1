"""A consumer thread that records every arrival, as a receiving program would see them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

from duetime.backends.sqlite import SyncSqliteQueue
from duetime.message import DUE_AT_HEADER


class RecordingConsumer(threading.Thread):
    def __init__(self, path: Path, queue: str) -> None:
        super().__init__(daemon=True)
        self.path, self.queue = path, queue
        self.arrivals: list[tuple[str, datetime, datetime]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        q = SyncSqliteQueue(self.path)
        while not self.halt.is_set():
            items = q.receive(self.queue, 500, wait=0.05)
            now = datetime.now(UTC)
            self.arrivals += [
                (i.message_id, datetime.fromisoformat(i.headers[DUE_AT_HEADER]), now) for i in items
            ]
            if items:
                q.acknowledge(items)
        q.close()

    def ids(self) -> list[str]:
        return [i for i, _, _ in self.arrivals]

    def early(self) -> list[str]:
        return [i for i, due, arrived in self.arrivals if arrived < due]
