"""Who may call the HTTP API: API keys, their scopes, and each key's rate.

Every request but the health checks needs ``Authorization: Bearer <secret>`` once the store holds
a key; a server bound to this machine only (loopback) with no key at all is open, and one that
other machines reach is refused at start unless there is a key (:class:`duetime.api.HttpApi`).

The keys are read from the store and kept for :data:`KEYS_FRESH_FOR`: a key made or revoked with
``duetime api-keys`` counts within that time on every server of the store, and a request costs no
read of the store for its key.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from duetime.api.problems import ApiProblem, retry_after
from duetime.api_keys import ApiKey, Scope, secret_hash
from duetime.interfaces import ApiKeyStore

#: Seconds a read of the keys stands before the next request reads them again.
KEYS_FRESH_FOR = 2.0


@dataclass(slots=True)
class Bucket:
    """A token bucket: ``rate`` a second, up to one second's worth at once (at least one)."""

    rate: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """0 if a request may go now (and take its token), else the seconds until it may."""
        burst = max(self.rate, 1.0)
        self.tokens = min(burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request came from: a key's name, or ``None`` on an open server."""

    key: ApiKey | None

    @property
    def name(self) -> str:
        return self.key.name if self.key else "-"


@dataclass
class Access:
    """The keys of one store, read at most every :data:`KEYS_FRESH_FOR` seconds, and the rate
    buckets of the keys that made requests (in this process: a server of its own per machine
    holds each key to its rate on that server)."""

    store: ApiKeyStore
    clock: Callable[[], float] = time.monotonic
    _by_hash: dict[str, ApiKey] = field(default_factory=dict)
    _any: bool = False
    _read_at: float = -math.inf
    _reading: asyncio.Lock = field(default_factory=asyncio.Lock)
    _buckets: dict[str, Bucket] = field(default_factory=dict)

    async def keys(self) -> list[ApiKey]:
        await self._fresh()
        return list(self._by_hash.values())

    async def any_key(self) -> bool:
        """Whether the store holds a key in use (then every request needs one)."""
        await self._fresh()
        return self._any

    async def _fresh(self) -> None:
        if self.clock() - self._read_at < KEYS_FRESH_FOR:
            return
        async with self._reading:
            if self.clock() - self._read_at < KEYS_FRESH_FOR:
                return
            found = [k for k in await self.store.api_keys() if k.active]
            self._by_hash = {k.hashed: k for k in found}
            self._any = bool(found)
            self._read_at = self.clock()

    async def caller(self, authorization: str | None, scope: Scope) -> Caller:
        """The caller of a request needing ``scope``; 401, 403 or 429 as a problem otherwise."""
        if not await self.any_key() and not authorization:
            return Caller(None)
        secret = _bearer(authorization)
        key = self._by_hash.get(secret_hash(secret))  # only keys in use are there
        if key is None:
            raise ApiProblem(
                401,
                "unauthorized",
                "that API key is not known here (revoked, or of another store); make one with "
                "`duetime api-keys create NAME --scope ...`",
                {"WWW-Authenticate": 'Bearer realm="duetime"'},
            )
        if scope not in key.scopes:
            held = ",".join(sorted(s.value for s in key.scopes))
            raise ApiProblem(
                403, "forbidden", f"key {key.name!r} may {held}, and this needs the {scope.value} scope"
            )
        self._limit(key)
        return Caller(key)

    def _limit(self, key: ApiKey) -> None:
        now = self.clock()
        bucket = self._buckets.get(key.name)
        if bucket is None or bucket.rate != key.rate:
            bucket = self._buckets[key.name] = Bucket(key.rate, max(key.rate, 1.0), now)
        wait = bucket.take(now)
        if wait:
            raise ApiProblem(
                429,
                "rate-limited",
                f"key {key.name!r} may make {key.rate:g} requests a second; wait and send again "
                "(Retry-After), or batch them (POST /v1/batches)",
                retry_after(wait),
            )


def _bearer(authorization: str | None) -> str:
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiProblem(
            401,
            "unauthorized",
            "send an API key as 'Authorization: Bearer <secret>' (`duetime api-keys create` makes one)",
            {"WWW-Authenticate": 'Bearer realm="duetime"'},
        )
    return secret.strip()
