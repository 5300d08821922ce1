"""What a message that travelled the native delay levels looks like on arrival, and how to tidy it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from duetime.message import DUE_AT_HEADER
from duetime.nservicebus_wire import DELAY_IN_SECONDS

#: Bookkeeping RabbitMQ adds when it dead-letters; stripped on arrival.
DEATH_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
)


#: What the native delay levels add to a message, removed on arrival (as NServiceBus's receiver
#: does): the dead-letter bookkeeping, and the delay every native publish carries.
ARRIVAL_BOOKKEEPING = frozenset((*DEATH_HEADERS, DELAY_IN_SECONDS))


def arrival_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """Headers without the bookkeeping the native delays added."""
    return {k: v for k, v in headers.items() if k not in ARRIVAL_BOOKKEEPING}


def early_by(headers: dict[str, Any], now: datetime) -> timedelta:
    """How long before its due time a message arrived (clock skew); zero when on time."""
    raw = headers.get(DUE_AT_HEADER)
    if raw is None:
        return timedelta(0)
    try:
        due = datetime.fromisoformat(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        return timedelta(0)
    return max(timedelta(0), due - now)
