"""Encryption at rest for bulk jobs: the rows they write into a duetime store are sealed as the
store's own writer seals a message (:mod:`duetime.encryption`), so a keyring holds for every way
in, the bulk ones too.

The keyring is the one ``DUETIME_ENCRYPTION_KEYS`` names, read where the rows are written: in
each Spark task. The driver's target tells its tasks the key id it seals with (never a key), and
a task whose keyring does not hold it stops before writing a row (:func:`task_sealer`): an
executor that was not given the keyring would otherwise write plaintext into a store that
promises none.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from duetime.bulk.frames import checked_of
from duetime.bulk.records import Record, parse_headers
from duetime.encryption import KEY_HEADER, Sealer, Unreadable, sealer_from_environment
from duetime.errors import ConfigurationError
from duetime.message import dump_headers


def task_sealer(expected: str | None) -> Sealer | None:
    """In a task: the sealer of the keyring the driver had (``expected``: its primary key id).

    A task whose keyring is missing, or is another keyring (without the driver's key), raises
    ConfigurationError: the job stops with nothing written rather than leaving rows readable, or
    sealed with a key the dispatchers do not hold. A task with a keyring seals with it even when
    the driver has none: rows are never left readable where a keyring is known."""
    sealer = sealer_from_environment(now=True)
    if expected is None or (sealer is not None and expected in sealer.keyring.keys):
        return sealer  # the driver's keyring, or one rotated since (its key kept to open)
    if sealer is None:
        raise ConfigurationError(
            f"a Spark task has no keyring, and the job seals with key {expected!r}: give every executor "
            "the keyring file and DUETIME_ENCRYPTION_KEYS (spark.executorEnv.DUETIME_ENCRYPTION_KEYS)."
        )
    raise ConfigurationError(
        f"a Spark task's keyring does not hold key {expected!r}, which the job seals with: give every "
        "executor the same keyring file as the driver."
    )


def seal_record(sealer: Sealer, record: Record) -> Record:
    """``record`` with its body and headers sealed (one already sealed is left as it is: a move
    between stores keeps what a keyring sealed, bound to the message's id and destination)."""
    headers = parse_headers(record.headers)
    if KEY_HEADER in headers:
        return record
    body, sealed = sealer.seal_parts(record.message_id, record.destination or "", record.body, headers)
    return record._replace(body=body, headers=dump_headers(sealed))


def sealed_records(sealer: Sealer, rows: Sequence[Record] | Any) -> list[Record]:
    """Records, or an Arrow batch of checked records, sealed: the rows a store writes."""
    records: Iterable[Record] = (
        rows if isinstance(rows, Sequence) else (record for record, _ in checked_of([rows]))
    )
    return [seal_record(sealer, record) for record in records]


def opened_frame(frame: Any, expected: str, unreadable: Any) -> Any:
    """A record frame with every sealed row opened (``bulk export --decrypt``), in each task with
    its keyring, which must hold ``expected`` (the driver's primary key). A row this keyring cannot
    open stays as it is stored, and ``unreadable`` (a Spark accumulator) counts it."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        sealer = task_sealer(expected)
        assert sealer is not None  # task_sealer raises without a keyring holding ``expected``
        for batch in batches:
            opened, left = opened_batch(sealer, batch)
            if left:
                unreadable.add(left)
            yield opened

    return frame.mapInArrow(run, frame.schema)


def opened_batch(sealer: Sealer, batch: Any) -> tuple[Any, int]:
    """An Arrow batch of records with its sealed rows opened, and how many could not be."""
    import pyarrow as pa

    headers = batch.column("headers").to_pylist()
    if not any(text and KEY_HEADER in text for text in headers):
        return batch, 0
    bodies = batch.column("body").to_pylist()
    ids, destinations = batch.column("message_id").to_pylist(), batch.column("destination").to_pylist()
    left = 0
    for i, text in enumerate(headers):
        parsed = parse_headers(text) if text and KEY_HEADER in text else {}
        if KEY_HEADER not in parsed:
            continue
        try:
            body, opened = sealer.open_parts(ids[i], destinations[i] or "", bytes(bodies[i] or b""), parsed)
        except Unreadable:
            left += 1
            continue
        headers[i], bodies[i] = dump_headers(opened), body
    columns = {
        "headers": pa.array(headers, batch.schema.field("headers").type),
        "body": pa.array(bodies, batch.schema.field("body").type),
    }
    arrays = [columns.get(name, batch.column(name)) for name in batch.schema.names]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema), left
