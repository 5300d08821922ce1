"""What waits in a transport's queues, and whether they are the queues the dispatchers deliver to.

For ``duetime stats`` and the dashboard: an operator who looks at the wrong transport's queues
(the store's own queue tables, while the dispatchers deliver to a broker) is told so, in words,
with the way to look at the right ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from duetime.inputs.urls import redact
from duetime.interfaces import BrowsableQueue, InspectableQueue, Transport
from duetime.live_dispatchers import DispatcherInfo

#: A broker cannot list its queues: at most this many destinations are looked up by name.
MOST_LOOKED_UP = 50


async def queue_depths(transport: Transport, candidates: Iterable[str]) -> dict[str, int] | None:
    """Every queue and how many messages wait in it, where the transport can list its queues (the
    SQL queue tables); else each of ``candidates`` that is declared, looked up by name (a broker:
    RabbitMQ answers a passive declare with the count). None: the transport cannot tell."""
    if isinstance(transport, BrowsableQueue):
        return await transport.queues()
    if not isinstance(transport, InspectableQueue):
        return None
    found: dict[str, int] = {}
    for name in list(dict.fromkeys(candidates))[:MOST_LOOKED_UP]:
        if await transport.has_queue(name):
            found[name] = await transport.depth(name)
    return found


def without_queue(
    transport: Transport,
    depths: dict[str, int] | None,
    candidates: Iterable[str],
    destinations: Iterable[str],
) -> list[str]:
    """The ``destinations`` that :func:`queue_depths` found no queue for (as it was asked, with
    ``candidates`` first): their messages go to the error queue when due. Only those it looked
    at: a broker is asked about the first :data:`MOST_LOOKED_UP` names, the SQL tables list all."""
    if depths is None:
        return []
    wanted = list(dict.fromkeys(destinations))
    looked = wanted if isinstance(transport, BrowsableQueue) else list(dict.fromkeys([*candidates, *wanted]))
    checked = set(looked[:MOST_LOOKED_UP]) if not isinstance(transport, BrowsableQueue) else set(looked)
    return [name for name in wanted if name in checked and name not in depths]


def delivered_elsewhere(shown: str, dispatchers: Sequence[DispatcherInfo], now: datetime) -> list[str]:
    """The transports (as their records hold them: no secrets) that the endpoint's dispatchers
    deliver to, when that is not ``shown``: the live ones', else the last one's to run."""
    live = [d for d in dispatchers if d.status(now) == "live"]
    recent = live or sorted(dispatchers, key=lambda d: d.last_seen)[-1:]
    theirs = dict.fromkeys(d.transport for d in recent)
    return [t for t in theirs if t != redact(shown)]


def elsewhere_note(shown: str, elsewhere: Sequence[str], how: str = "give --transport") -> str:
    """One sentence saying which queues are shown, and how to see the ones the dispatchers use."""
    return (
        f"these are the queues of {redact(shown)}; this endpoint's dispatchers deliver to "
        f"{', '.join(elsewhere)}: {how} (or DUETIME_TRANSPORT) with that URL, password included, "
        "to see its queues"
    )
