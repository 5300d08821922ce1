"""A consumer thread that records every arrival, as a receiving program would see them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from duetime.backends.sqlite import SyncSqliteQueue
from duetime.interfaces import ReceivedMessage
from duetime.message import DUE_AT_HEADER


class QueueLike(Protocol):
    def receive(self, queue: str, max_messages: int = ..., wait: float = ...) -> list[ReceivedMessage]: ...
    def acknowledge(self, messages: Sequence[ReceivedMessage]) -> int: ...
    def close(self) -> None: ...


class RecordingConsumer(threading.Thread):
    """Consumes ``queue`` from a SQLite file (a Path) or any queue a factory opens."""

    def __init__(self, source: Path | Callable[[], QueueLike], queue: str) -> None:
        super().__init__(daemon=True)
        self.source, self.queue = source, queue
        self.arrivals: list[tuple[str, datetime, datetime]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        q: QueueLike = SyncSqliteQueue(self.source) if isinstance(self.source, Path) else self.source()
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
