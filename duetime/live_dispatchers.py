"""Live dispatchers: every ``duetime run`` says, in the store it serves, that it is there.

Operators ask "who is delivering this endpoint, and is anyone?" before they ask anything else. Each
dispatcher writes a small record (id, host, pid, version, mode, when it started, its last batch,
how many it forwarded, what it holds claimed) every few seconds; a record not refreshed for
``expiry`` is a dispatcher that is gone (killed, frozen, cut off), and what it held comes back to
the others when its claims end. A dispatcher that stops politely says so, and is shown as stopped.
Records nobody refreshed for a day are removed by a heartbeat (each store looks hourly).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

#: How often a dispatcher refreshes its record, and after how long without one it is "gone".
HEARTBEAT_INTERVAL = timedelta(seconds=5)
EXPIRY = timedelta(seconds=15)
#: Records not refreshed for this long are deleted (the list would otherwise grow forever).
FORGET_AFTER = timedelta(days=1)
#: How often a store looks for such records (on a heartbeat).
PRUNE_EVERY = timedelta(hours=1)

Status = Literal["live", "gone", "stopped"]


@dataclass(frozen=True, slots=True)
class DispatcherInfo:
    """One dispatcher as it last described itself."""

    dispatcher_id: str
    endpoint: str
    host: str
    pid: int
    version: str
    mode: str
    #: Where it delivers, with any password removed.
    transport: str
    started_at: datetime
    last_seen: datetime
    last_batch_at: datetime | None = None
    forwarded: int = 0
    #: Messages it holds claimed right now (a batch being sent, one claimed ahead).
    in_flight: int = 0
    #: When those claims end by themselves if it dies; None: they end with its connection (row
    #: locks) or it holds none.
    claims_end_by: datetime | None = None
    stopped: bool = False
    dead_lettered: int = 0
    #: Lateness of everything it forwarded since it started, as sparse histogram buckets
    #: (:class:`duetime.engine.summary.LatenessHistogram`): the dashboard charts the change between looks.
    lateness: dict[str, int] = field(default_factory=dict)
    #: Each circuit breaker's seconds armed (failing), None while it is closed.
    breakers: dict[str, float | None] = field(default_factory=dict)
    #: Each webhook endpoint it delivers to: its attempts by outcome since it started, what the
    #: latest came to and when, and the health that says (:func:`duetime.webhooks.endpoint_health`).
    webhooks: dict[str, dict[str, int | str]] = field(default_factory=dict)

    @classmethod
    def new(cls, endpoint: str, mode: str, transport: str, now: datetime) -> DispatcherInfo:
        from duetime.version import __version__

        host = socket.gethostname()
        return cls(
            dispatcher_id=f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            endpoint=endpoint,
            host=host,
            pid=os.getpid(),
            version=__version__,
            mode=mode,
            transport=transport,
            started_at=now,
            last_seen=now,
        )

    def status(self, now: datetime, expiry: timedelta = EXPIRY) -> Status:
        if self.stopped:
            return "stopped"
        return "live" if now - self.last_seen <= expiry else "gone"

    def with_changes(self, **changes: Any) -> DispatcherInfo:
        return replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    def as_dict(self, now: datetime | None = None) -> dict[str, Any]:
        """Times as ISO 8601 text; with ``now``, also the status."""
        data = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(self).items()}
        if now is not None:
            data["status"] = self.status(now)
        return data

    @classmethod
    def from_json(cls, text: str | bytes) -> DispatcherInfo:
        data = json.loads(text)
        for key in ("started_at", "last_seen", "last_batch_at", "claims_end_by"):
            if data.get(key) is not None:
                data[key] = datetime.fromisoformat(data[key])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def describe_claims(info: DispatcherInfo, now: datetime) -> str:
    """What a gone dispatcher's claims mean for the messages: when they come back."""
    if info.in_flight == 0:
        return "held nothing"
    if info.claims_end_by is None or info.claims_end_by <= now:
        return f"{info.in_flight:,} it held are claimable again"
    seconds = (info.claims_end_by - now).total_seconds()
    return f"{info.in_flight:,} it held come back in {seconds:.0f} s"
