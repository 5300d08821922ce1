"""Flow control in the loop: what a claimed batch may send now, and what waits in the store.

The limits and pauses are the store's (:class:`duetime.interfaces.FlowControlStore`), read again
every :data:`REFRESH_SECONDS`, so a change from the command line reaches every dispatcher within
that time. For each claimed batch, messages go by destination (and by key, where the limit has
one) to their bucket: a paused destination sends none; a concurrency limit gives the slots still
free among every dispatcher's; a rate gives the turns its bucket has now. What may not go now is
held in the store until its turn (:meth:`~duetime.interfaces.FlowControlStore.hold`): unclaimed,
hidden from every claim, nothing of it changed. The held are spread one interval apart after the
last this dispatcher held for that bucket, so a backlog comes back at the limit's pace and is
not claimed again and again.

A store failure while asking is the store's: the batch is given back (claims released) and the
loop backs off as for a failed claim. Never is a message sent past a limit because the limit
could not be read.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase

from duetime.errors import ConfigurationError
from duetime.interfaces import Clock, FlowControlStore
from duetime.limits import Limit, Pause, limit_for, pause_for
from duetime.message import DelayedMessage

log = logging.getLogger("duetime.flow")

#: How often the limits and pauses are read again (a change reaches a dispatcher by then).
REFRESH_SECONDS = 2.0
#: How long a paused destination's message waits before it is looked at again; a resume gives
#: every held message back at once (the dispatcher that sees it releases them), so this only
#: bounds the work a long pause costs.
PAUSE_HOLD = timedelta(seconds=60)
#: The shortest a message waits for a concurrency slot, and the send time assumed until one is
#: measured.
SLOT_WAIT_LEAST = 0.01


@dataclass
class Admitted:
    """What a batch may send now, and the slots to give back once it is settled."""

    send: list[DelayedMessage]
    #: Bucket -> slots this batch took.
    slots: dict[str, int] = field(default_factory=dict)
    #: How many were held back (not sent now).
    held: int = 0


class FlowControl:
    """One dispatcher's side of the limits every dispatcher of a store shares."""

    def __init__(self, store: FlowControlStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        #: This dispatcher, as the holder of concurrency slots.
        self.holder = uuid.uuid4().hex
        self.limits: list[Limit] = []
        self.pauses: list[Pause] = []
        self._read_at: float | None = None
        self._seen: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        #: Bucket -> the latest time this dispatcher held a message of it until.
        self._horizon: dict[str, datetime] = {}
        #: Bucket -> a running mean of a send's seconds (how soon a slot comes free).
        self._send_seconds: dict[str, float] = {}
        #: The store keeps no limits (it said so once): nothing is asked again.
        self.unkept = False
        #: Limits and pauses seen gone, by destination or pattern, and when: a message due before
        #: one ended waited for it (a resumed destination's backlog is held time, not lateness).
        self._ended: dict[str, datetime] = {}

    @property
    def active(self) -> bool:
        return bool(self.limits or self.pauses)

    @property
    def stale(self) -> bool:
        """Whether the limits are due to be read again (a round asks this first: reading costs a
        store call, asking costs nothing)."""
        if self.unkept:
            return False
        return self._read_at is None or self.clock.monotonic() - self._read_at >= REFRESH_SECONDS

    @property
    def needed(self) -> bool:
        """Whether a batch must be looked at: limits or pauses are set, or not read lately."""
        return self.active or self.stale

    @property
    def measures_held(self) -> bool:
        """Whether any delivery may be held time (a limit or pause now, or one that ended today)."""
        return self.active or bool(self._ended)

    def limited(self, destination: str, due_at: datetime) -> bool:
        """Whether a limit or a pause governed ``destination`` at some moment since ``due_at``:
        the message's wait from its due time is then the limit's ("held"), never counted as
        duetime's lateness (a paused destination's backlog, sent once it is resumed, included)."""
        if limit_for(self.limits, destination) is not None or pause_for(self.pauses, destination) is not None:
            return True
        return any(ended >= due_at and fnmatchcase(destination, name) for name, ended in self._ended.items())

    async def refresh(self) -> None:
        """Read the limits and pauses again when they are older than :data:`REFRESH_SECONDS`.
        When they changed, every held message is given back so that it takes its turn by the
        new ones (a resume, a raised limit)."""
        if not self.stale:
            return
        now = self.clock.monotonic()
        try:
            limits, pauses = await self.store.limits(), await self.store.paused()
        except ConfigurationError as error:  # a store of the user's that keeps no limits
            log.info("%s", error)
            self.unkept = True
            return
        self._read_at = now
        seen = (tuple(x.to_json() for x in limits), tuple(p.to_json() for p in pauses))
        changed = self._seen is not None and seen != self._seen
        if changed:
            wall = self.clock.now()
            gone = {x.destination for x in self.limits} | {p.destination for p in self.pauses}
            gone -= {x.destination for x in limits} | {p.destination for p in pauses}
            self._ended.update(dict.fromkeys(gone, wall))
            day_ago = wall - timedelta(days=1)
            self._ended = {n: t for n, t in self._ended.items() if t > day_ago}
        self.limits, self.pauses, self._seen = limits, pauses, seen
        if changed:
            self._horizon.clear()
            released = await self.store.release_held()
            log.info("the flow-control limits changed; %d held messages take their turn again", released)

    async def admit(self, batch: Sequence[DelayedMessage]) -> Admitted:
        """What of ``batch`` may be sent now; the rest is held in the store until its turn."""
        await self.refresh()
        if not self.active:
            return Admitted(list(batch))
        now = self.clock.now()
        free: list[DelayedMessage] = []
        groups: dict[str, tuple[Limit, list[DelayedMessage]]] = {}
        hold: dict[str, datetime] = {}
        for m in batch:
            if pause_for(self.pauses, m.destination) is not None:
                hold[m.message_id] = now + PAUSE_HOLD
                continue
            limit = limit_for(self.limits, m.destination)
            if limit is None:
                free.append(m)
                continue
            bucket = limit.bucket(m.destination, m.headers)
            groups.setdefault(bucket, (limit, []))[1].append(m)
        admitted = Admitted(free)
        for bucket, (limit, messages) in groups.items():
            go = await self._take(bucket, limit, messages, now, admitted, hold)
            admitted.send += go
        if hold:
            await self.store.hold(hold)
            admitted.held = len(hold)
        if admitted.send and len(admitted.send) < len(batch):
            order = {m.message_id: i for i, m in enumerate(batch)}
            admitted.send.sort(key=lambda m: order[m.message_id])
        return admitted

    async def _take(
        self,
        bucket: str,
        limit: Limit,
        messages: list[DelayedMessage],
        now: datetime,
        admitted: Admitted,
        hold: dict[str, datetime],
    ) -> list[DelayedMessage]:
        """The messages of one bucket that go now; the others put in ``hold`` with their turns."""
        n = len(messages)
        slots = n
        if limit.concurrency is not None:
            slots = await self.store.take_slots(bucket, self.holder, n, limit.concurrency, now)
        go = slots
        first_at, step = now, 0.0
        if limit.rate is not None and slots:
            grant = await self.store.take_rate(bucket, limit.rate, slots, now)
            go, first_at, step = grant.granted, grant.next_at, grant.interval_seconds
        if limit.concurrency is not None:
            if slots > go:
                await self.store.give_slots(bucket, self.holder, slots - go, now)
            if go:
                admitted.slots[bucket] = go
            if go == slots:  # held for a slot, not for the rate
                wait = max(self._send_seconds.get(bucket, SLOT_WAIT_LEAST), SLOT_WAIT_LEAST)
                step = max(step, wait / limit.concurrency)
                first_at = max(first_at, now + timedelta(seconds=wait))
        rest = messages[go:]
        if rest:
            last = self._horizon.get(bucket)
            start = first_at if last is None else max(first_at, last + timedelta(seconds=step))
            turns = [start + timedelta(seconds=i * step) for i in range(len(rest))]
            for m, turn in zip(rest, turns, strict=True):
                hold[m.message_id] = turn
            self._horizon[bucket] = turns[-1]
        if len(self._horizon) > 10_000:
            cut = now - timedelta(minutes=1)
            self._horizon = {b: t for b, t in self._horizon.items() if t > cut}
        return messages[:go]

    async def settled(self, admitted: Admitted, seconds: float) -> None:
        """The admitted batch is settled ``seconds`` after it was admitted: its slots given back,
        the time a send takes noted for the next wait."""
        if not admitted.slots:
            return
        now = self.clock.now()
        for bucket, count in admitted.slots.items():
            before = self._send_seconds.get(bucket, seconds)
            self._send_seconds[bucket] = before * 0.8 + seconds * 0.2
            await self.store.give_slots(bucket, self.holder, count, now)
