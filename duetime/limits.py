"""Flow control: the limits a destination is sent to at, and the pauses that stop it.

A limit names a destination (``billing``) or a pattern of them (``partner-*``), and holds a
**rate** (so many a second or a minute, with a burst), a **concurrency** (messages sent and not
yet settled), or both; with a **key** (a header's name, such as ``customer-id``) each value of
that header has a limit of its own, so that one customer's storm cannot hold back the others.
A **pause** stops a destination until it is resumed.

The store that holds the messages keeps the limits and the state they share
(:class:`duetime.interfaces.FlowControlStore`), so that every dispatcher of it obeys one limit, and
a restart or a new dispatcher changes nothing. Over a limit a message waits *in the store*,
unclaimed and hidden until its turn (:meth:`~duetime.interfaces.FlowControlStore.hold`): never
dropped, never sent early, its due time never rewritten, and a cancel, reschedule or replace
still reaches it.

The rate is the generic cell rate algorithm (GCRA, the "virtual scheduling" form of ITU-T
I.371): one number per bucket, the *theoretical arrival time* of the next message. A message
conforms at ``t`` when ``t >= tat - tolerance``; sending it moves ``tat`` to
``max(tat, t) + interval``. Over any window of ``w`` seconds no more than ``w * rate + burst``
are sent, whatever the number of dispatchers, because each takes its turn by a compare-and-set of
that one number. This module is the rules (stdlib only); the stores keep the numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase

from duetime.errors import ConfigurationError

#: The record kinds the store keeps for flow control (its named records table).
LIMITS, PAUSES, RATE_STATE, SLOT_STATE = "limit", "pause", "pace", "slots"
#: The longest destination name or pattern a limit or a pause takes: a message's destination's.
NAME_MOST = 200
#: The longest record name a store keeps (its column): a longer destination is kept by digest.
RECORD_NAME_MOST = 100
#: The units a rate is given in, as ``50/s`` or ``600/min`` takes them.
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNITS |= {"h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
#: The most a rate may say (a million a second) and the most a concurrency or a burst may be.
RATE_MOST, COUNT_MOST = 1_000_000.0, 100_000
#: The lateness a turn may have and still keep the pace (microseconds): a dispatcher wakes for a
#: held message's turn a millisecond or so after it (tens of them on a busy machine), and GCRA
#: without slack starts the next interval from that late moment, losing the turn (measured: 28.6
#: of 50 a second with no slack; 35-45 with 20 ms while the test suite ran beside it, and with
#: 200 ms a 10 s window of 474 of 500 once, three dispatchers under CI's load; with 400 ms the
#: windows went to 532 with both cores kept busy). Turns missed by up to this are made up, so a
#: window holds at most this long's worth more (15 at 50 a second).
TURN_SLACK_MICROS = 300_000
#: How long a dispatcher's concurrency slots are its own without a word from it: a dispatcher
#: killed with slots taken gives them back by this (its claims lapse too).
SLOT_LEASE_SECONDS = 60.0


def _micros(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _at(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, UTC)


def check_destination(name: object, what: str = "destination") -> str:
    """A destination name or a pattern (``*`` any characters, ``?`` one), as a message's
    destination is written (text, not blank, no NUL) and at most :data:`NAME_MOST` characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MOST or "\x00" in name:
        raise ConfigurationError(
            f"{what} {name!r} is not allowed: give a destination's name or a pattern such as "
            f"'partner-*' (1-{NAME_MOST} characters, not blank)."
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} {name!r} is not valid text; pass proper UTF-8.") from None
    return name


def record_name(destination: str) -> str:
    """The name a limit or pause of ``destination`` is kept under: the destination itself, or a
    digest of it when it is longer than a record's name may be."""
    if len(destination) <= RECORD_NAME_MOST:
        return destination
    return "sha256:" + hashlib.sha256(destination.encode()).hexdigest()


def _one_line(value: str, what: str, most: int) -> str:
    if len(value) > most or any(c in value for c in "\x00\r\n"):
        raise ConfigurationError(f"{what} is at most {most} characters on one line.")
    return value


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` messages every ``per`` seconds, ``burst`` of them at once after a quiet spell."""

    count: float
    per: float
    burst: int = 1

    @classmethod
    def parse(cls, text: str, burst: int | None = None) -> Rate:
        """``50/s``, ``600/min``, ``2/h`` (and ``second``, ``minute``, ``hour``)."""
        match = _RATE.match(text.lower()) if isinstance(text, str) else None
        if match is None or match.group(2) not in _UNITS:
            raise ConfigurationError(
                f"rate {text!r} is not one duetime reads: give a number, a slash and a unit, "
                "such as 50/s, 600/min or 2/h."
            )
        count, per = float(match.group(1)), _UNITS[match.group(2)]
        if not 0 < count / per <= RATE_MOST:
            raise ConfigurationError(
                f"rate {text!r} is out of range: give more than none and at most {RATE_MOST:,.0f} a second."
            )
        return cls(count, per, check_count(burst if burst is not None else 1, "burst"))

    @property
    def interval_micros(self) -> int:
        """The time one message takes of the rate."""
        return max(1, round(self.per / self.count * 1_000_000))

    @property
    def per_second(self) -> float:
        return self.count / self.per

    def text(self) -> str:
        unit = {1.0: "s", 60.0: "min", 3600.0: "h"}[self.per]
        count = int(self.count) if self.count == int(self.count) else self.count
        return f"{count}/{unit}"


def check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= COUNT_MOST:
        raise ConfigurationError(
            f"{what} {value!r} is out of range: give a whole number from 1 to {COUNT_MOST:,}."
        )
    return value


def check_key(header: object) -> str:
    if not isinstance(header, str) or not _HEADER.match(header):
        raise ConfigurationError(
            f"key {header!r} is not a header's name: give the header whose value each gets a "
            "limit of its own, such as customer-id."
        )
    return header


@dataclass(frozen=True, slots=True)
class Limit:
    """How fast, and how many at once, a destination (or each key of it) is sent to."""

    destination: str
    rate: Rate | None = None
    concurrency: int | None = None
    #: A header's name: each of its values has the limit of its own ("" for a message without it).
    key: str | None = None
    set_by: str = ""
    set_at: datetime | None = None

    def __post_init__(self) -> None:
        check_destination(self.destination)
        if self.rate is None and self.concurrency is None:
            raise ConfigurationError(
                f"a limit for {self.destination!r} needs a rate (--rate 50/s) or a concurrency "
                "(--concurrency 4), or both."
            )
        if self.concurrency is not None:
            check_count(self.concurrency, "concurrency")
        if self.key is not None:
            check_key(self.key)

    def matches(self, destination: str) -> bool:
        return fnmatchcase(destination, self.destination)

    def bucket(self, destination: str, headers: Mapping[str, str]) -> str:
        """The name the shared state of this message's share of the limit is kept under: one per
        limit, or one per key value. A digest, so that a header's value (anyone's input) is
        never a record's name, and every name is as long."""
        value = headers.get(self.key, "") if self.key is not None else ""
        text = json.dumps([self.destination, self.key, value])
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def said(self) -> str:
        parts = []
        if self.rate is not None:
            burst = f" (burst {self.rate.burst})" if self.rate.burst > 1 else ""
            parts.append(f"{self.rate.text()}{burst}")
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        if self.key is not None:
            parts.append(f"for each {self.key}")
        return ", ".join(parts)

    def to_json(self) -> str:
        return json.dumps(
            {
                "destination": self.destination,
                "rate": None if self.rate is None else [self.rate.count, self.rate.per, self.rate.burst],
                "concurrency": self.concurrency,
                "key": self.key,
                "set_by": self.set_by,
                "set_at": None if self.set_at is None else self.set_at.isoformat(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Limit:
        data = json.loads(text)
        rate = data.get("rate")
        return cls(
            data["destination"],
            None if rate is None else Rate(float(rate[0]), float(rate[1]), int(rate[2])),
            data.get("concurrency"),
            data.get("key"),
            data.get("set_by", ""),
            None if data.get("set_at") is None else datetime.fromisoformat(data["set_at"]),
        )


@dataclass(frozen=True, slots=True)
class Pause:
    """A destination (or a pattern of them) that nothing is sent to until it is resumed."""

    destination: str
    by: str
    at: datetime
    reason: str = ""

    def __post_init__(self) -> None:
        check_destination(self.destination)
        _one_line(self.reason, "a pause's reason", 500)
        _one_line(self.by, "who paused", 200)

    def matches(self, destination: str) -> bool:
        return fnmatchcase(destination, self.destination)

    def to_json(self) -> str:
        return json.dumps(
            {"destination": self.destination, "by": self.by, "at": self.at.isoformat(), "reason": self.reason}
        )

    @classmethod
    def from_json(cls, text: str) -> Pause:
        data = json.loads(text)
        return cls(
            data["destination"], data["by"], datetime.fromisoformat(data["at"]), data.get("reason", "")
        )


def limit_for(limits: Iterable[Limit], destination: str) -> Limit | None:
    """The limit a destination is sent at: the one naming it exactly, else the longest pattern
    matching it (the most particular), so one rule answers and two never add up."""
    best: Limit | None = None
    for limit in limits:
        if limit.destination == destination:
            return limit
        if limit.matches(destination) and (best is None or len(limit.destination) > len(best.destination)):
            best = limit
    return best


def pause_for(pauses: Iterable[Pause], destination: str) -> Pause | None:
    return next((p for p in pauses if p.matches(destination)), None)


@dataclass(frozen=True, slots=True)
class DestinationState:
    """A destination as every listing shows it (``destinations list``, the HTTP API, the
    dashboard): what is stored for it, the limit it is sent at, and its pause."""

    destination: str
    stored: int
    limit: Limit | None
    pause: Pause | None

    def as_json(self) -> dict[str, object]:
        p = self.pause
        return {
            "destination": self.destination,
            "stored": self.stored,
            "limit": self.limit.said() if self.limit else None,
            "paused_by": p.by if p else None,
            "paused_at": p.at.isoformat() if p else None,
            "reason": p.reason if p else None,
        }


def destination_states(
    stored: Mapping[str, int], limits: Sequence[Limit], pauses: Sequence[Pause]
) -> list[DestinationState]:
    """Every destination with messages stored, then every limit's and pause's own name not
    among them (a pattern, a drained destination), each with the limit and pause that govern it."""
    names = list(stored)
    names += [
        n
        for n in dict.fromkeys([*(x.destination for x in limits), *(p.destination for p in pauses)])
        if n not in stored
    ]
    return [DestinationState(n, stored.get(n, 0), limit_for(limits, n), pause_for(pauses, n)) for n in names]


@dataclass(frozen=True, slots=True)
class RateGrant:
    """What a bucket gave: ``granted`` to send now; the rest conform from ``next_at`` on, one an
    ``interval`` after the other (the times the held ones wait for)."""

    granted: int
    next_at: datetime
    interval_seconds: float


def take_rate(state: str | None, rate: Rate, wanted: int, now: datetime) -> tuple[RateGrant, str]:
    """GCRA for ``wanted`` messages at ``now`` from a bucket's ``state`` (its text, None: new):
    how many conform and when the next one would, and the state after them."""
    t = _micros(now)
    tat = int(json.loads(state)) if state is not None else t
    interval = rate.interval_micros
    tolerance = max((rate.burst - 1) * interval, TURN_SLACK_MICROS)
    tat = max(tat, t)
    room = (t + tolerance - tat) // interval + 1  # how many fit before the tolerance is used up
    granted = max(0, min(wanted, room))
    if granted == 0 and state is not None:
        # Nothing changes. A state read earlier is never ahead of the store's (a bucket's time
        # only grows), so a "none yet" from it is the store's answer too.
        return RateGrant(0, _at(max(t, tat - tolerance)), rate.per / rate.count), state
    tat += granted * interval
    grant = RateGrant(granted, _at(max(t, tat - tolerance)), rate.per / rate.count)
    return grant, json.dumps(tat)


def take_slots(state: str | None, holder: str, wanted: int, most: int, now: datetime) -> tuple[int, str]:
    """Concurrency: up to ``wanted`` of ``most`` slots for ``holder``, from a bucket's ``state``
    (who holds how many, until when). A holder's slots lapse :data:`SLOT_LEASE_SECONDS` after
    its last take, so a dispatcher killed with slots taken gives them back by then."""
    t = _micros(now)
    held = _live_slots(state, t)
    free = most - sum(count for count, _ in held.values())
    granted = max(0, min(wanted, free))
    count = held.get(holder, (0, 0))[0] + granted
    held[holder] = (count, t + int(SLOT_LEASE_SECONDS * 1_000_000))
    return granted, json.dumps({h: list(v) for h, v in sorted(held.items()) if v[0] > 0})


def give_slots(state: str | None, holder: str, count: int, now: datetime) -> str:
    """Give back ``count`` of ``holder``'s slots."""
    t = _micros(now)
    held = _live_slots(state, t)
    left = held.get(holder, (0, 0))[0] - count
    if left > 0:
        held[holder] = (left, held[holder][1])
    else:
        held.pop(holder, None)
    return json.dumps({h: list(v) for h, v in sorted(held.items())})


def _live_slots(state: str | None, now_micros: int) -> dict[str, tuple[int, int]]:
    held: dict[str, list[int]] = json.loads(state) if state else {}
    return {h: (int(c), int(u)) for h, (c, u) in held.items() if int(u) > now_micros}


def spread_offset(key: str, window: timedelta) -> timedelta:
    """A storm spread on purpose: how far into ``window`` the one named ``key`` goes, from a
    digest of it, so that a second try of the same work (a retry cut short, a planning done
    again) gives each the same time, and many keys fill the window evenly."""
    if window <= timedelta(0):
        return timedelta(0)
    share = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return timedelta(microseconds=int(share * (window / timedelta(microseconds=1))))


def rate_window(rate: Rate, seconds: float) -> int:
    """The most a rate lets through in a window of ``seconds``."""
    return math.floor(seconds * rate.per_second) + rate.burst
