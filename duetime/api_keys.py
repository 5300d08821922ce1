"""API keys for the HTTP API: what a key is, how its secret is made and checked, and its scopes.

A key is a name, its scopes, a request rate and the SHA-256 of its secret. The secret itself is
shown once, when the key is made, and kept nowhere: a store holds only the hash, so a copy of the
store lets nobody in. A fast hash is right here (GitHub's and Stripe's tokens do the same): the
secret is 32 random bytes, not a password a person chose, so there is nothing to guess.

The store that holds the messages holds the keys (:class:`duetime.interfaces.ApiKeyStore`), one
record per name, written only by that store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_time

#: What every secret starts with: a secret pasted into a log or a repository is recognisable
#: (secret scanners look for a prefix), and a token of another system is told apart at once.
SECRET_PREFIX = "dtk_"
#: A key's name: what the request log shows, and what ``duetime api-keys revoke`` takes.
MAX_KEY_NAME = 64
#: Requests a second a key may make unless it was made with another ``--rate``.
DEFAULT_RATE = 100.0


class Scope(StrEnum):
    """What a key may do. Each request needs one scope; a key holds any set of them."""

    #: create, reschedule and cancel single messages
    SCHEDULE = "schedule"
    #: read messages, schedules, the error queue and the counts
    READ = "read"
    #: recurring schedules, the error queue's retry and discard, cancelling by group or destination
    MANAGE = "manage"


def read_scopes(text: str | Iterable[str]) -> frozenset[Scope]:
    """``schedule,read`` (or a list of words) as scopes; a word that is none is a one-line error."""
    words = [w.strip() for w in (text.split(",") if isinstance(text, str) else text)]
    words = [w for w in words if w]
    known = {s.value: s for s in Scope}
    unknown = [w for w in words if w not in known]
    if unknown or not words:
        raise ConfigurationError(
            f"scopes are a comma-separated list of {', '.join(known)}; got {','.join(words) or 'nothing'!r}."
        )
    return frozenset(known[w] for w in words)


def check_key_name(name: object) -> str:
    """A key's name: 1-64 letters, digits, '.', '_' or '-' (it is printed in every request's log line)."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_KEY_NAME:
        raise ConfigurationError(f"an API key's name is 1 to {MAX_KEY_NAME} characters; got {name!r}.")
    if not all(c.isascii() and (c.isalnum() or c in "._-") for c in name):
        raise ConfigurationError(
            f"an API key's name may hold letters, digits, '.', '_' and '-' only; got {name!r}."
        )
    return name


def check_rate(rate: object) -> float:
    """Requests a second: a number from 0.01 to a million."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.01 <= rate <= 1_000_000:
        raise ConfigurationError(f"a key's rate is requests a second, from 0.01 to 1000000; got {rate!r}.")
    return float(rate)


def secret_hash(secret: str) -> str:
    """The SHA-256 of a secret, in hex: all a store keeps of it."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key as a store keeps it: never its secret."""

    name: str
    scopes: frozenset[Scope]
    hashed: str
    #: The secret's first characters, shown by ``list`` so a key can be told from another
    hint: str
    created_at: datetime
    rate: float = DEFAULT_RATE
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def opens(self, secret: str) -> bool:
        """Whether ``secret`` is this key's (compared in constant time)."""
        return self.active and hmac.compare_digest(self.hashed, secret_hash(secret))

    def revoked(self, at: datetime) -> ApiKey:
        return replace(self, revoked_at=at)

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "scopes": sorted(s.value for s in self.scopes),
                "hashed": self.hashed,
                "hint": self.hint,
                "created_at": self.created_at.isoformat(),
                "rate": self.rate,
                "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ApiKey:
        data = json.loads(text)
        return cls(
            name=data["name"],
            scopes=read_scopes(data["scopes"]),
            hashed=data["hashed"],
            hint=data["hint"],
            created_at=parse_time(data["created_at"]),
            rate=float(data["rate"]),
            revoked_at=parse_time(data["revoked_at"]) if data.get("revoked_at") else None,
        )


def new_key(
    name: str, scopes: Iterable[Scope], now: datetime, rate: float = DEFAULT_RATE
) -> tuple[ApiKey, str]:
    """A new key and its secret (the only time the secret exists outside the caller's hands)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        name=check_key_name(name),
        scopes=frozenset(scopes),
        hashed=secret_hash(secret),
        hint=secret[: len(SECRET_PREFIX) + 4] + "…",
        created_at=now,
        rate=check_rate(rate),
    )
    return key, secret
