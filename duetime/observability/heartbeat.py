"""The dispatcher's heartbeat: its presence record (:mod:`duetime.live_dispatchers`), refreshed in the store.

Best effort by design: a store that cannot take the record is logged once (and again when it
recovers), never a reason to stop delivering.
"""

from __future__ import annotations

import logging

from duetime.engine.companions import Reported, until_started
from duetime.engine.deadline import within
from duetime.errors import one_line
from duetime.interfaces import DispatcherRegistry
from duetime.live_dispatchers import HEARTBEAT_INTERVAL, DispatcherInfo
from duetime.observability.attempts import attempt_logs
from duetime.webhooks import endpoint_health

log = logging.getLogger("duetime.heartbeat")


class Heartbeat:
    """Writes ``info`` for ``dispatcher`` every ``interval`` seconds, and "stopped" at the end."""

    def __init__(
        self, dispatcher: Reported, transport: str, *, interval: float = HEARTBEAT_INTERVAL.total_seconds()
    ) -> None:
        self.dispatcher = dispatcher
        self.interval = interval
        self.info = DispatcherInfo.new(
            dispatcher.endpoint, dispatcher.mode.value, transport, dispatcher.clock.now()
        )
        self._failing = False
        self._beaten = False

    def current(self, *, stopped: bool = False) -> DispatcherInfo:
        d = self.dispatcher
        now = d.clock.now()
        holding = d.in_flight if not stopped else 0
        return self.info.with_changes(
            last_seen=now,
            last_batch_at=d.last_batch_at,
            forwarded=d.stats.forwarded,
            dead_lettered=d.stats.dead_lettered,
            lateness=d.lateness.sparse(),
            breakers={
                name: None if armed is None else round(armed, 1) for name, armed in d.breakers_armed().items()
            },
            webhooks=endpoint_health(attempt_logs(d.transport)),
            in_flight=holding,
            claims_end_by=d.claims_end_by if holding else None,
            stopped=stopped,
        )

    async def beat(self, *, stopped: bool = False) -> None:
        store = self.dispatcher.store
        if not isinstance(store, DispatcherRegistry):
            return
        try:
            await within(store.beat(self.current(stopped=stopped)), self.interval, "recording the heartbeat")
        except Exception as error:
            if not self._failing:
                log.warning("could not record this dispatcher as live in the store: %s", one_line(error))
            self._failing = True
            return
        if self._failing:
            log.info("recording this dispatcher as live in the store works again")
        self._failing = False
        self._beaten = True

    async def run(self) -> None:
        d = self.dispatcher
        await until_started(d)  # the store is bound to the endpoint first
        while not d.stopping:
            await self.beat()
            if await d.wait_for_stop(self.interval):
                break
        if self._beaten:  # say it stopped, rather than let it look gone in 15 s
            await self.beat(stopped=True)
