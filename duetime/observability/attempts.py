"""The webhook attempts a dispatcher's transport has counted, found through every route it is made
of: what the metrics export and the heartbeat records for the dashboard."""

from __future__ import annotations

from collections.abc import Iterable

from duetime.interfaces import CountsAttempts, HoldsTransports, Transport
from duetime.webhooks import AttemptLog


def parts_of(transport: Transport) -> Iterable[Transport]:
    """``transport`` and every transport it is made of, each once."""
    seen: set[int] = set()
    todo = [transport]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        yield t
        if isinstance(t, HoldsTransports):
            todo.extend(t.parts)


def attempt_logs(transport: Transport) -> list[AttemptLog]:
    """The attempt logs of ``transport``'s parts that count attempts (its webhooks)."""
    return [
        t.attempt_log
        for t in parts_of(transport)
        if isinstance(t, CountsAttempts) and isinstance(t.attempt_log, AttemptLog)
    ]
