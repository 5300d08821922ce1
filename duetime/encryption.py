"""Encryption at rest: what a message holds is sealed before any store keeps it.

A *keyring* (a JSON file, ``duetime keys new FILE`` writes it, ``DUETIME_ENCRYPTION_KEYS`` names
it) holds 256-bit keys by id and says which is the primary. With a keyring, every duetime store
(the shared rules in ``duetime.backends._store``, so no reader or writer can forget it) seals a
message on its way in and opens it on its way out:

- the body, and the value of every header whose name does not begin ``duetime-`` (duetime's own:
  a tick's planned time, the error reasons, this module's key header), are encrypted with
  AES-256-GCM (``cryptography``);
- each message gets a key of its own, derived (HKDF-SHA256) from the keyring's key and a random
  salt, so the number of messages one key seals has no limit a random nonce would set;
- the message id, the destination, the key id and the field's name are authenticated with it, so
  a sealed body or header value moved to another message, destination or header does not open;
- ``duetime-encryption-key: <key id> <salt>`` says a message is sealed and with which key.

The due time is not authenticated: it changes in place on every retry, hold and reschedule, and
a changed due time changes when a message goes, never what it says or to whom.

A message that cannot be opened (its key is not in the keyring, or it fails to authenticate) is
never delivered as ciphertext: it comes out still sealed, with :data:`PROBLEM_HEADER` saying why,
and a dispatcher puts it on the error queue with that reason (:func:`sealed_problem`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from duetime.errors import ConfigurationError, MissingExtra
from duetime.message import DelayedMessage
from duetime.recurring.schedule import Schedule
from duetime.settings import ENCRYPTION_KEYS_VARIABLE, variable

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The header that says a message is sealed: ``<key id> <salt, base64>`` (and, on a recurring
#: schedule's tick, ``schedule:<id>``: what its sealed body is bound to).
KEY_HEADER = "duetime-encryption-key"
#: Set on a message that came out of a store still sealed: why it could not be opened.
PROBLEM_HEADER = "duetime-encryption-problem"
#: Headers duetime itself writes and reads stay readable (planned times, error reasons, the key).
OWN_PREFIX = "duetime-"
#: A sealed header value: this, then the ciphertext in base64.
SEALED_VALUE = "sealed:"
KEYRING_FORMAT = "duetime-keyring/1"
KEY_BYTES = 32
SALT_BYTES = 16
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
_CONTEXT = b"duetime/sealed/1"
#: What a schedule's body and headers are bound to (the ticks copy them sealed, as they are).
SCHEDULE_BINDING = "schedule:"


class Unreadable(Exception):
    """A sealed message this keyring cannot open; the text says why, in one line."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass(frozen=True)
class Keyring:
    """Keys by id and which one seals (the primary); the others only open what they sealed."""

    primary: str
    keys: Mapping[str, bytes]
    #: When each key was made (ISO text), for ``duetime keys list``.
    created: Mapping[str, str]

    @classmethod
    def new(cls, key_id: str | None = None, now: datetime | None = None) -> Keyring:
        """A keyring of one new key."""
        return cls("", {}, {}).with_new_key(key_id, now)

    def with_new_key(self, key_id: str | None = None, now: datetime | None = None) -> Keyring:
        """This keyring with a new random key that becomes the primary (the old keys stay, to
        open what they sealed until ``duetime keys rotate`` has sealed it again)."""
        at = now or datetime.now(UTC)
        kid = key_id or f"{at:%Y%m%d}-{secrets.token_hex(3)}"
        check_key_id(kid)
        if kid in self.keys:
            raise ConfigurationError(f"the keyring has a key {kid!r} already; give another --id.")
        return Keyring(
            kid,
            {**self.keys, kid: secrets.token_bytes(KEY_BYTES)},
            {**self.created, kid: at.isoformat(timespec="seconds")},
        )

    def without(self, key_id: str) -> Keyring:
        """This keyring without ``key_id`` (never the primary)."""
        if key_id not in self.keys:
            raise ConfigurationError(
                f"the keyring has no key {key_id!r}; `duetime keys list` shows its keys."
            )
        if key_id == self.primary:
            raise ConfigurationError(
                f"{key_id!r} is the primary key, which seals new messages; make a new one first "
                "(`duetime keys new FILE`), rotate (`duetime keys rotate`), then retire this one."
            )
        return Keyring(
            self.primary,
            {k: v for k, v in self.keys.items() if k != key_id},
            {k: v for k, v in self.created.items() if k != key_id},
        )

    def using(self, key_id: str) -> Keyring:
        """This keyring with ``key_id`` as its primary."""
        if key_id not in self.keys:
            raise ConfigurationError(
                f"the keyring has no key {key_id!r}; `duetime keys list` shows its keys."
            )
        return Keyring(key_id, self.keys, self.created)

    def text(self) -> str:
        keys = {k: {"key": _b64(v), "created": self.created.get(k, "")} for k, v in self.keys.items()}
        return json.dumps({"format": KEYRING_FORMAT, "primary": self.primary, "keys": keys}, indent=2) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> Keyring:
        """The keyring in ``path``; ConfigurationError in one line for anything wrong with it."""
        where = repr(str(path))
        try:
            raw = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigurationError(
                f"the keyring {where} does not exist; make one with `duetime keys new {path}`."
            ) from None
        except OSError as error:
            raise ConfigurationError(f"cannot read the keyring {where}: {error.strerror or error}.") from None
        except UnicodeDecodeError:
            raise ConfigurationError(f"{where} is not a keyring (not text).") from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise ConfigurationError(f"{where} is not a keyring (not JSON).") from None
        if not isinstance(data, dict) or data.get("format") != KEYRING_FORMAT:
            raise ConfigurationError(f"{where} is not a keyring ({KEYRING_FORMAT!r} expected as its format).")
        entries, primary = data.get("keys"), data.get("primary")
        if not isinstance(entries, dict) or not entries:
            raise ConfigurationError(f"{where} holds no keys; make a keyring with `duetime keys new`.")
        keys: dict[str, bytes] = {}
        created: dict[str, str] = {}
        for kid, entry in entries.items():
            check_key_id(kid)
            value = entry.get("key") if isinstance(entry, dict) else None
            try:
                key = _unb64(value) if isinstance(value, str) else b""
            except (binascii.Error, ValueError):
                key = b""
            if len(key) != KEY_BYTES:
                raise ConfigurationError(f"{where}: key {kid!r} is not {KEY_BYTES} bytes in base64.")
            keys[kid] = key
            created[kid] = str(entry.get("created", ""))
        if not isinstance(primary, str) or primary not in keys:
            raise ConfigurationError(f"{where}: its primary {primary!r} is not one of its keys.")
        return cls(primary, keys, created)

    def write(self, path: str | Path) -> None:
        """Write the keyring to ``path`` readable by its owner only, replacing it in one step (a
        crash leaves the old file or the new one, never half)."""
        target = Path(path)
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.text())
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            raise ConfigurationError(
                f"cannot write the keyring {str(path)!r}: {error.strerror or error}."
            ) from None


def check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise ConfigurationError(
            f"key id {key_id!r}: use 1-40 letters, digits, '.', '_' or '-', starting with a letter or digit."
        )
    return key_id


def _aesgcm() -> type[AESGCM]:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise MissingExtra.of(
            "encryption at rest (DUETIME_ENCRYPTION_KEYS)", "encryption", "cryptography"
        ) from None
    return AESGCM


@functools.lru_cache(maxsize=4096)
def _nonce(field: str) -> bytes:
    """Each field of a message has its own nonce under the message's own key."""
    return hashlib.sha256(field.encode()).digest()[:12]


def _field_aad(binding: str, destination: str, key_id: str, field: str) -> bytes:
    return b"\x00".join((_CONTEXT, binding.encode(), destination.encode(), key_id.encode(), field.encode()))


def _without_problem(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers as stored: without the reason a reader added when it could not open them."""
    return {k: v for k, v in headers.items() if k != PROBLEM_HEADER}


def own(name: str) -> bool:
    """Whether a header is duetime's own (kept readable)."""
    return name.startswith(OWN_PREFIX)


def sealed_with(headers: Mapping[str, str]) -> str | None:
    """The key id a message is sealed with, or None when it is not sealed."""
    value = headers.get(KEY_HEADER)
    return value.split(" ", 1)[0] if value else None


def sealed_problem(message: DelayedMessage) -> str | None:
    """Why ``message`` may not be delivered as it is: it is still sealed (no keyring here, its key
    is not in the keyring, or it failed to authenticate). None for a message that may go."""
    kid = sealed_with(message.headers)
    if kid is None:
        return None
    return message.headers.get(PROBLEM_HEADER) or (
        f"it is encrypted with key {kid!r} and no keyring is set (DUETIME_ENCRYPTION_KEYS)"
    )


def _rebuilt(message: DelayedMessage, body: bytes, headers: Mapping[str, str]) -> DelayedMessage:
    """``message`` with other body and headers, not checked again: sealing and opening change
    neither what a store checked when it was stored nor that it is text (a third of the cost of
    opening a message was checking it again)."""
    m = message
    return DelayedMessage.from_store(
        m.message_id, m.destination, m.due_at, body, MappingProxyType(dict(headers)), m.failure_count, m.group
    )


class Sealer:
    """Seals and opens messages and schedules with one keyring."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._cipher = _aesgcm()
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        self._hkdf, self._sha256, self._invalid = HKDF, hashes.SHA256, InvalidTag

    def _key(self, key_id: str, salt: bytes) -> AESGCM:
        info = _CONTEXT + b"\x00" + key_id.encode()
        derived = self._hkdf(self._sha256(), KEY_BYTES, salt, info).derive(self.keyring.keys[key_id])
        return self._cipher(derived)

    # --- the parts: every sealed thing is a body and headers bound to an id and a destination ---
    def seal_parts(
        self, binding: str, destination: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[bytes, dict[str, str]]:
        kid, salt = self.keyring.primary, secrets.token_bytes(SALT_BYTES)
        key = self._key(kid, salt)
        sealed = key.encrypt(_nonce("body"), body, _field_aad(binding, destination, kid, "body"))
        out: dict[str, str] = {}
        for name, value in headers.items():
            if own(name):
                out[name] = value
                continue
            field = "header:" + name
            data = key.encrypt(_nonce(field), value.encode(), _field_aad(binding, destination, kid, field))
            out[name] = SEALED_VALUE + _b64(data)
        # a schedule's ticks carry its sealed body as it is: the header names what it is bound to
        out[KEY_HEADER] = f"{kid} {_b64(salt)}" + (
            f" {binding}" if binding.startswith(SCHEDULE_BINDING) else ""
        )
        return sealed, out

    def open_parts(
        self, binding: str, destination: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[bytes, dict[str, str]]:
        """The plaintext of sealed parts (parts not sealed come back as they are); Unreadable."""
        value = headers.get(KEY_HEADER)
        if not value:
            return body, dict(headers)
        kid, _, rest = value.partition(" ")
        salt_text, _, bound_to = rest.partition(" ")
        if bound_to.startswith(SCHEDULE_BINDING):
            binding = bound_to  # a tick: sealed once, as its schedule's body
        if kid not in self.keyring.keys:
            raise Unreadable(f"it is encrypted with key {kid!r}, which the keyring does not hold")
        try:
            key = self._key(kid, _unb64(salt_text))
            plain = key.decrypt(_nonce("body"), body, _field_aad(binding, destination, kid, "body"))
            out: dict[str, str] = {}
            for name, item in headers.items():
                if name in (KEY_HEADER, PROBLEM_HEADER):
                    continue
                if own(name) or not item.startswith(SEALED_VALUE):
                    out[name] = item  # duetime's own, or added by a dispatcher after sealing
                    continue
                field = "header:" + name
                data = _unb64(item[len(SEALED_VALUE) :])
                out[name] = key.decrypt(
                    _nonce(field), data, _field_aad(binding, destination, kid, field)
                ).decode()
        except (self._invalid, binascii.Error, ValueError):
            raise Unreadable(
                f"it is encrypted with key {kid!r} but does not authenticate (changed or moved at rest)"
            ) from None
        return plain, out

    # --- messages -------------------------------------------------------------------------------
    def seal(self, message: DelayedMessage) -> DelayedMessage:
        """``message`` sealed with the primary key; one sealed already is left as it is (a failed
        copy sent back from the error queue, a retry of a store)."""
        if KEY_HEADER in message.headers:  # sealed already: as it was stored
            return replace(message, headers=_without_problem(message.headers))
        body, headers = self.seal_parts(
            message.message_id, message.destination, message.body, message.headers
        )
        return _rebuilt(message, body, headers)

    def open(self, message: DelayedMessage) -> DelayedMessage:
        """``message`` in plaintext; Unreadable when it cannot be opened."""
        if KEY_HEADER not in message.headers:
            return message
        body, headers = self.open_parts(
            message.message_id, message.destination, message.body, message.headers
        )
        return _rebuilt(message, body, headers)

    def opened(self, message: DelayedMessage) -> DelayedMessage:
        """``message`` in plaintext, or still sealed with :data:`PROBLEM_HEADER` saying why not."""
        try:
            return self.open(message)
        except Unreadable as error:
            return replace(message, headers={**message.headers, PROBLEM_HEADER: str(error)})

    def needs_sealing(self, message: DelayedMessage) -> bool:
        """Whether a stored message is not sealed with the primary key (what rotation does)."""
        return sealed_with(message.headers) != self.keyring.primary

    def reseal(self, message: DelayedMessage) -> DelayedMessage:
        """A stored message sealed again with the primary key; Unreadable if it cannot be opened."""
        return self.seal(self.open(message))

    # --- schedules: a schedule's body and headers are bound to the schedule's id ---------------
    def seal_schedule(self, schedule: Schedule) -> Schedule:
        if KEY_HEADER in schedule.headers:
            return schedule.with_changes(headers=_without_problem(schedule.headers))
        body, headers = self.seal_parts(
            SCHEDULE_BINDING + schedule.schedule_id, schedule.destination, schedule.body, schedule.headers
        )
        return schedule.with_changes(body=body, headers=headers)

    def open_schedule(self, schedule: Schedule) -> Schedule:
        """The schedule in plaintext; Unreadable when it cannot be opened."""
        if KEY_HEADER not in schedule.headers:
            return schedule
        body, headers = self.open_parts(
            SCHEDULE_BINDING + schedule.schedule_id, schedule.destination, schedule.body, schedule.headers
        )
        return schedule.with_changes(body=body, headers=headers)


class _KeyringFile:
    """The keyring a process reads, taken up again when its file changes: a new primary key seals
    from a second after it is written, and a message sealed with a key this process has not seen
    yet makes it read the file again at once (:meth:`refresh`) before it is called unreadable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mark: tuple[str, int, int] | None = None
        self._sealer: Sealer | None = None
        self._checked = 0.0

    def sealer(self, environ: Mapping[str, str] | None = None, *, now: bool = False) -> Sealer | None:
        path = variable(ENCRYPTION_KEYS_VARIABLE, environ)
        if path is None:
            return None
        with self._lock:
            if (
                not now
                and self._mark is not None
                and self._mark[0] == path
                and time.monotonic() - self._checked < 1
            ):
                return self._sealer
            try:
                info = os.stat(path)
            except OSError:
                Keyring.read(path)  # says what is wrong in one line
                raise
            mark = (path, info.st_mtime_ns, info.st_size)
            if mark != self._mark or self._sealer is None:
                self._sealer, self._mark = Sealer(Keyring.read(path)), mark
            self._checked = time.monotonic()
            return self._sealer


KEYRING_FILE = _KeyringFile()


def sealer_from_environment(environ: Mapping[str, str] | None = None, *, now: bool = False) -> Sealer | None:
    """The sealer of the keyring ``DUETIME_ENCRYPTION_KEYS`` names (read again when the file
    changed, looked at no more than once a second unless ``now``), or None when it is not set."""
    return KEYRING_FILE.sealer(environ, now=now)


def describe(headers: Mapping[str, str]) -> str | None:
    """What a reader shows in place of a body it cannot open: "encrypted with key K" (and why it
    did not open, when it was tried), or None for a message in plaintext."""
    kid = sealed_with(headers)
    if kid is None:
        return None
    problem = headers.get(PROBLEM_HEADER)
    return f"encrypted with key {kid}" + (f" ({problem})" if problem else "")


def as_dict(keyring: Keyring) -> dict[str, Any]:
    """What ``duetime keys list`` shows of a keyring: ids, which is primary, when made; never a key."""
    return {
        "primary": keyring.primary,
        "keys": [
            {"id": k, "primary": k == keyring.primary, "created": keyring.created.get(k, "")}
            for k in keyring.keys
        ],
    }
