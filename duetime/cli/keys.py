"""`duetime keys new | list | use | rotate | retire`: the keyring of encryption at rest.

A keyring (:mod:`duetime.encryption`) is a file of keys by id, one of them the primary, which
seals every message stored from then on. Whoever can read the file can read every message; lose
it and no one can. Rotation seals what is stored again with the primary key, online.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from duetime.audit import Action
from duetime.cli.common import DEFAULT_STORE, EndpointOpt, StoreOpt, app, record_change, with_capability
from duetime.cli.terminal import console, err, fail, table
from duetime.cli.terminal import show as show_table
from duetime.encryption import Keyring, as_dict
from duetime.errors import ConfigurationError
from duetime.interfaces import SealingStore
from duetime.settings import DEFAULT_ENDPOINT, ENCRYPTION_KEYS_VARIABLE, variable

keys_app = typer.Typer(
    help="Encryption at rest: the keyring that seals what messages hold (bodies, header values) "
    f"before any store keeps it. Name the file in {ENCRYPTION_KEYS_VARIABLE} for every process "
    "that schedules, dispatches or reads messages.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")

FileArg = Annotated[
    str | None,
    typer.Argument(
        help=f"The keyring file; by default the one {ENCRYPTION_KEYS_VARIABLE} names.", show_default=False
    ),
]
BATCH_DEFAULT = 500


def _file(given: str | None) -> str:
    path = given or variable(ENCRYPTION_KEYS_VARIABLE)
    if path is None:
        raise ConfigurationError(
            f"no keyring file given: pass FILE or set {ENCRYPTION_KEYS_VARIABLE} (`duetime keys new FILE` makes one)."
        )
    return path


@keys_app.command("new")
def new(
    file: Annotated[str, typer.Argument(help="The keyring file to make, or to add a key to.")],
    key_id: Annotated[
        str | None,
        typer.Option(
            "--id",
            help="The new key's id (by default the date and six random hex digits).",
            show_default=False,
        ),
    ] = None,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            help="Add the key without making it the primary: copy the file to every host, then "
            "`duetime keys use ID` (no process meets a key it does not have).",
        ),
    ] = False,
) -> None:
    """Make a keyring of one new key, or add a new key to a keyring.

      duetime keys new /etc/duetime/keys.json
      export DUETIME_ENCRYPTION_KEYS=/etc/duetime/keys.json

    A new key becomes the primary: it seals every message stored from then on, and the old keys
    still open what they sealed until `duetime keys rotate` seals it again. The file is written
    readable by you only, in one step. Keep it as a secret, and keep a copy: a message whose key
    is lost cannot be read by anyone.
    """
    path = Path(file)
    ring = Keyring.read(path) if path.exists() else None
    primary = ring.primary if ring is not None else None
    ring = Keyring.new(key_id) if ring is None else ring.with_new_key(key_id)
    added = ring.primary
    if standby and primary is not None:
        ring = ring.using(primary)
    ring.write(path)
    role = (
        "a standby key (`duetime keys use` makes it the primary)" if ring.primary != added else "the primary"
    )
    console.print(f"{'made' if primary is None else 'added'} key {added} in {file}: {role}")


@keys_app.command("use")
def use(
    key_id: Annotated[str, typer.Argument(help="The key to make the primary.")],
    file: FileArg = None,
) -> None:
    """Make a key of the keyring the primary: it seals every message stored from then on.

    Processes take it up within a second of the file changing.
    """
    path = _file(file)
    Keyring.read(path).using(key_id).write(path)
    console.print(f"key {key_id} is the primary in {path}")


@keys_app.command("list")
def list_(
    file: FileArg = None,
    count: Annotated[
        bool,
        typer.Option(
            "--count", help="Also count the stored messages and schedules each key seals (reads them all)."
        ),
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """The keyring's keys: id, which is the primary, when it was made (never a key itself)."""
    path = _file(file)
    listed = as_dict(Keyring.read(path))["keys"]
    used: Mapping[str, int] = _uses(store, endpoint, BATCH_DEFAULT) if count else {}
    if as_json:
        for k in listed:
            sys.stdout.write(json.dumps(k | ({"messages": used.get(k["id"], 0)} if count else {})) + "\n")
        return
    grid = table("key", "primary", "made", *(["sealing"] if count else []))
    for k in listed:
        grid.add_row(
            k["id"],
            "yes" if k["primary"] else "",
            k["created"] or "-",
            *([str(used.get(k["id"], 0))] if count else []),
        )
    show_table(grid)
    if count and used.get(""):
        err.print(f"{used['']:,} stored in plaintext (`duetime keys rotate` seals them)")


def _uses(store: str, endpoint: str, batch: int) -> Counter[str]:
    """How many stored messages and schedules each key seals ("" for plaintext)."""

    async def look(s: SealingStore) -> Counter[str]:
        total: Counter[str] = Counter(await s.reseal_schedules(look_only=True))
        after = None
        while True:
            step = await s.reseal(after, batch, look_only=True)
            total.update(step.by_key)
            if step.after is None:
                return total
            after = step.after

    return with_capability(store, endpoint, SealingStore, "encrypted messages", look)  # type: ignore[type-abstract]


@keys_app.command("rotate")
def rotate(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    batch: Annotated[
        int, typer.Option(min=1, max=10_000, help="Messages read and sealed again in one change.")
    ] = BATCH_DEFAULT,
) -> None:
    """Seal every stored message and schedule again with the primary key, online.

      duetime keys new /etc/duetime/keys.json     # a new primary key
      duetime keys rotate
      duetime keys retire OLD-KEY-ID

    Messages in plaintext (stored before encryption was set) are sealed too. Dispatchers keep
    delivering meanwhile; a message one holds at that moment is left for the next run. Killed
    half-way, run it again: what is done is skipped.
    """
    if variable(ENCRYPTION_KEYS_VARIABLE) is None:
        raise fail(
            f"set {ENCRYPTION_KEYS_VARIABLE} to the keyring whose primary key seals (duetime keys new FILE)"
        )

    async def work(s: SealingStore) -> tuple[int, int, int, int, Mapping[str, int]]:
        schedules = await s.reseal_schedules()
        seen = resealed = busy = unreadable = steps = 0
        after = None
        while True:
            step = await s.reseal(after, batch)
            seen, resealed = seen + step.seen, resealed + step.resealed
            busy, unreadable, steps = busy + step.busy, unreadable + step.unreadable, steps + 1
            if steps % 20 == 0:
                err.print(f"  {seen:,} messages looked at, {resealed:,} sealed again")
            if step.after is None:
                primary = Keyring.read(variable(ENCRYPTION_KEYS_VARIABLE) or "").primary
                said = f"{resealed} messages and {sum(schedules.values())} schedules sealed again"
                await record_change(s, Action.KEY_ROTATE, primary, detail=said)
                return seen, resealed, busy, unreadable, schedules
            after = step.after

    seen, resealed, busy, unreadable, schedules = with_capability(
        store,
        endpoint,
        SealingStore,  # type: ignore[type-abstract]
        "encrypted messages",
        work,
    )
    console.print(
        f"looked at {seen:,} messages: sealed again {resealed:,}; {sum(schedules.values()):,} schedules sealed"
    )
    if busy:
        err.print(
            f"{busy:,} were being delivered or changed meanwhile: run `duetime keys rotate` again for them"
        )
    if unreadable:
        raise fail(
            f"{unreadable:,} are sealed with a key the keyring does not hold, or do not authenticate: left as "
            "they are (`duetime list` shows them)"
        )


@keys_app.command("retire")
def retire(
    key_id: Annotated[str, typer.Argument(help="The key to remove from the keyring.")],
    file: FileArg = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Remove a key from the keyring, once nothing stored is sealed with it.

    Refused while a stored message or schedule is sealed with it (`duetime keys rotate` first),
    and for the primary. What a store's own queue table holds is not looked at: let consumers
    take it first.
    """
    path = _file(file)
    ring = Keyring.read(path).without(key_id)  # says so when it is the primary or not there
    uses = _uses(store, endpoint, BATCH_DEFAULT).get(key_id, 0)
    if uses:
        raise fail(
            f"{uses:,} stored messages or schedules are sealed with {key_id}: run `duetime keys rotate` first"
        )
    ring.write(path)

    async def noted(s: SealingStore) -> None:
        await record_change(s, Action.KEY_RETIRE, key_id, detail=f"removed from {path}")

    with_capability(store, endpoint, SealingStore, "encrypted messages", noted)  # type: ignore[type-abstract]
    console.print(f"retired key {key_id}: nothing stored is sealed with it")
