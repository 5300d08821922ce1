"""The keyring and the seal, alone: the file's rules, what is sealed and what is bound, a new key
taken up by a running process, and a dispatcher that never delivers what it cannot open."""

from __future__ import annotations

import base64
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duetime.backends.memory import MemoryStore, MemoryTransport
from duetime.encryption import (
    KEY_HEADER,
    PROBLEM_HEADER,
    Keyring,
    Sealer,
    Unreadable,
    as_dict,
    sealed_problem,
)
from duetime.engine.dispatcher import Dispatcher
from duetime.error_headers import ERROR_MESSAGE
from duetime.errors import ConfigurationError
from duetime.message import DelayedMessage
from duetime.settings import DelayedDeliverySettings, TransactionMode

T = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


def message(**changes: object) -> DelayedMessage:
    m = DelayedMessage("id-1", "orders", T, b"\x00secret\xff", {"card": "4111", "ü": "ß", "duetime-x": "own"})
    return m.with_changes(**changes)


def test_a_sealed_message_opens_to_the_same_bytes_and_only_duetimes_own_headers_stay_readable() -> None:
    sealer = Sealer(Keyring.new("k1"))
    sealed = sealer.seal(message())
    assert b"secret" not in sealed.body and "4111" not in json.dumps(dict(sealed.headers))
    assert sealed.headers["duetime-x"] == "own" and sealed.headers[KEY_HEADER].startswith("k1 ")
    assert sealer.open(sealed) == message()
    assert sealer.seal(sealed) == sealed  # sealed once, never twice
    assert sealer.open(message()) == message()  # plaintext passes through
    empty = message(body=b"", headers={})
    assert sealer.open(sealer.seal(empty)) == empty


@pytest.mark.parametrize(
    "change",
    [
        {"message_id": "id-2"},
        {"destination": "elsewhere"},
    ],
)
def test_a_sealed_message_moved_to_another_id_or_destination_does_not_open(change: dict[str, str]) -> None:
    sealer = Sealer(Keyring.new())
    moved = sealer.seal(message()).with_changes(**change)
    with pytest.raises(Unreadable, match="does not authenticate"):
        sealer.open(moved)


def test_a_header_value_moved_to_another_header_or_a_changed_byte_does_not_open() -> None:
    sealer = Sealer(Keyring.new())
    sealed = sealer.seal(message())
    swapped = dict(sealed.headers)
    swapped["card"], swapped["ü"] = swapped["ü"], swapped["card"]
    flipped = bytes([sealed.body[0] ^ 1]) + sealed.body[1:]
    for bad in (sealed.with_changes(headers=swapped), sealed.with_changes(body=flipped)):
        with pytest.raises(Unreadable, match="does not authenticate"):
            sealer.open(bad)
    opened = sealer.opened(sealed.with_changes(body=flipped))
    assert "does not authenticate" in opened.headers[PROBLEM_HEADER] and sealed_problem(opened)
    assert sealer.seal(opened).headers == sealed.headers  # the reason is never stored


def test_each_message_has_a_key_of_its_own() -> None:
    sealer = Sealer(Keyring.new())
    a, b = sealer.seal(message()), sealer.seal(message())
    assert a.body != b.body and a.headers[KEY_HEADER] != b.headers[KEY_HEADER]


def test_a_key_the_keyring_lacks_is_said_and_the_old_key_still_opens_after_a_new_primary() -> None:
    old = Keyring.new("old")
    sealed = Sealer(old).seal(message())
    with pytest.raises(Unreadable, match="key 'old', which the keyring does not hold"):
        Sealer(Keyring.new("other")).open(sealed)
    newer = old.with_new_key("new")
    assert newer.primary == "new" and Sealer(newer).open(sealed) == message()
    assert Sealer(newer).seal(message()).headers[KEY_HEADER].startswith("new ")
    assert Sealer(newer).needs_sealing(sealed) and not Sealer(old).needs_sealing(sealed)
    assert (
        sealed_problem(sealed)
        == "it is encrypted with key 'old' and no keyring is set (DUETIME_ENCRYPTION_KEYS)"
    )


def test_the_keyring_file_is_the_owners_alone_and_every_fault_in_it_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    ring = Keyring.new("a").with_new_key("b")
    ring.write(path)
    assert (path.stat().st_mode & 0o777) == 0o600 and Keyring.read(path) == ring
    listed = json.dumps(as_dict(ring))
    assert all(base64.b64encode(k).decode() not in listed for k in ring.keys.values())  # ids, never keys
    data = json.loads(path.read_text())
    for text, said in [
        ("{", "not a keyring (not JSON)"),
        ("[]", "not a keyring"),
        (json.dumps({**data, "primary": "zz"}), "primary 'zz' is not one of its keys"),
        (json.dumps({**data, "keys": {}}), "holds no keys"),
        (json.dumps({**data, "keys": {"a": {"key": "c2hvcnQ="}}, "primary": "a"}), "not 32 bytes"),
        (json.dumps({**data, "keys": {"bad id": data["keys"]["a"]}}), "letters, digits"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigurationError, match=re.escape(said)) as caught:
            Keyring.read(path)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigurationError, match="does not exist; make one with `duetime keys new"):
        Keyring.read(tmp_path / "missing.json")
    with pytest.raises(ConfigurationError, match="primary key"):
        ring.without("b")
    assert ring.without("a").keys.keys() == {"b"} and ring.using("a").primary == "a"


def test_a_running_process_takes_up_a_new_primary_and_a_key_it_has_not_read_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys.json"
    Keyring.new("first").write(path)
    monkeypatch.setenv("DUETIME_ENCRYPTION_KEYS", str(path))
    store = MemoryStore().sync
    store.setup_infrastructure("e")
    store.initialize("e", TransactionMode.AT_LEAST_ONCE)
    store.store(message(message_id="a"))
    # another host adds a key and seals with it before this process looks at the file again
    Keyring.read(path).with_new_key("second").write(path)
    other = Sealer(Keyring.read(path))
    store._insert([other.seal(message(message_id="b"))])
    assert store.get("b") == message(message_id="b")  # read again at once, not called unreadable
    time.sleep(1.1)
    store.store(message(message_id="c"))
    raw = store._get("c")
    assert raw is not None and raw.headers[KEY_HEADER].startswith("second ")
    assert store.get("a") == message(message_id="a")


async def test_a_dispatcher_never_delivers_what_it_cannot_open_it_goes_to_the_error_queue_with_why() -> None:
    store, transport = MemoryStore(), MemoryTransport()
    await transport.declare("orders")
    await transport.declare("error")
    await store.setup_infrastructure("duetime")
    await store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    now = datetime.now(UTC) - timedelta(seconds=1)
    store.sync.sealer = Sealer(Keyring.new("lost"))
    await store.store(message(message_id="sealed-elsewhere", due_at=now))
    store.sync.sealer = None  # this dispatcher has no keyring
    await store.store(message(message_id="plain", due_at=now))
    dispatcher = Dispatcher(
        store, transport, DelayedDeliverySettings(transaction_mode=TransactionMode.AT_LEAST_ONCE)
    )
    stats = await dispatcher.run_burst()
    assert (stats.forwarded, stats.dead_lettered) == (1, 1)
    delivered, failed = transport.messages("orders"), transport.messages("error")
    assert [m.message_id for m in delivered] == ["plain"] and delivered[0].body == message().body
    assert [m.message_id for m in failed] == ["sealed-elsewhere"]
    assert "encrypted with key 'lost' and no keyring is set" in failed[0].headers[ERROR_MESSAGE]
    assert b"secret" not in failed[0].body
