"""The Redis store's bulk writes: a bulk job's rows into one endpoint's keys, each chunk once.

A SQL store takes a whole batch in one transaction with its ledger row; Redis has no such
transaction that would not stop every other client while it runs, so a batch goes in chunks of
:data:`ROWS_A_SCRIPT` rows, each one script (atomic: all of its rows or none) that also keeps
the chunk's answer in the run's ledger hash. A batch interrupted half way has its first chunks
stored; written again, those answer from the ledger and the rest are stored: every row once, and
the batch's answer the same as if it had gone in whole. The same scripts, with a job's set of
ids instead of a ledger, store each id of a ``bulk schedule`` job once, ever.

The only writer of a Redis store's keys besides the store itself. A row here is
``(id, destination, due µs since 1970, headers JSON text, body, failure count, group)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from duetime.backends.redis.store import SyncRedisStore, load_script, payload_of
from duetime.bulk_interfaces import KeyedBulkRows
from duetime.errors import NotReplicated
from duetime.inputs.urls import redact

#: Rows a script: Redis runs one script at a time, so this bounds how long a bulk job keeps the
#: store's dispatchers waiting (10-20 ms here).
ROWS_A_SCRIPT = 1_000


class RedisBulkRows:
    """One Redis store (``store``, opened on any endpoint) written by a bulk job."""

    def __init__(self, store: SyncRedisStore) -> None:
        self.store = store
        self._script = store.client.register_script(load_script("bulk_write.lua"))

    @classmethod
    def from_url(cls, url: str) -> RedisBulkRows:
        """The store at ``url`` (checked now; it connects when first used)."""
        return cls(SyncRedisStore.from_url(url))

    def prepare(self, endpoint: str) -> None:
        """The endpoint's keys and the store's schema record, before rows go in."""
        self.store.setup_infrastructure(endpoint)

    def reach(self) -> None:
        """Ask the server now: one line if it does not answer, or may evict what the store keeps."""
        self.store.check_eviction_policy()

    def ledger_key(self, run_id: str) -> str:
        return f"{self.store.prefix}bulk:ledger:{run_id}"

    def job_key(self, job: str) -> str:
        return f"{self.store.prefix}bulk:scheduled:{job}"

    def answer(self, run_id: str, field: str) -> tuple[int, list[str]] | None:
        """What the ledger kept for ``field`` of the run, if it was written."""
        found = self.store.client.hget(self.ledger_key(run_id), field)
        return None if found is None else _answer(found)

    def keep(self, run_id: str, field: str, stored: int, held: Sequence[str]) -> None:
        """Keep a whole batch's answer (its chunks kept theirs as they went in)."""
        self.store.client.hset(self.ledger_key(run_id), field, json.dumps([stored, list(held)]))

    def settled(self, job: str, ids: Sequence[str]) -> None:
        """``ids`` are the job's: a re-run skips them."""
        if ids:
            self.store.client.sadd(self.job_key(job), *ids)

    def forget(self, run_id: str) -> None:
        self.store.client.delete(self.ledger_key(run_id))

    def write(
        self,
        endpoint: str,
        rows: Sequence[tuple[Any, ...]],
        *,
        run_id: str = "",
        field: str = "",
        job: str = "",
        keep_held: bool = True,
    ) -> tuple[int, list[str]]:
        """``rows`` of ``endpoint`` in chunks, each once: under ``field`` of the run's ledger
        (``field.N`` for its Nth chunk), or, for a ``job``, skipping the ids it stored before
        (an id the store held is the job's too, unless not ``keep_held``: the caller replaces
        it, then :meth:`settled`). How many were stored, and the ids the store held already."""
        store = self.store
        store.check_eviction_policy()
        keys = store.keys_for(endpoint)
        names = [keys[n] for n in ("ready", "payload", "bydue", "due", "groups", "failures")]
        names += [self.ledger_key(run_id), self.job_key(job)]
        stored, held = 0, []
        for n, start in enumerate(range(0, len(rows), ROWS_A_SCRIPT)):
            chunk = rows[start : start + ROWS_A_SCRIPT]
            args: list[Any] = [f"{field}.{n}" if field else "", ("1" if keep_held else "2") if job else "0"]
            for message_id, destination, due_us, headers, body, failures, group in chunk:
                args += [message_id, payload_of(destination, json.loads(headers), group, body)]
                args += [due_us, group or "", failures]
            got, there = _answer(self._run(names, args))
            stored += got
            held += there
            if got:
                store.client.publish(keys["channel"], str(min(row[2] for row in chunk)))
        return stored, held

    def _run(self, keys: list[str], args: list[Any]) -> Any:
        import redis

        wait = self.store.replication
        try:
            if not wait.replicas:
                return self._script(keys=keys, args=args)
            with self.store.client.pipeline(transaction=False) as pipe:  # WAIT counts its connection's writes
                self._script(keys=keys, args=args, client=pipe)
                pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
                answer, confirmed = pipe.execute()
        except redis.exceptions.OutOfMemoryError:
            raise self.store.full() from None
        if (short := wait.short(confirmed)) is not None:
            raise NotReplicated(f"bulk rows stored at {redact(self.store.url)}, but {short}")
        return answer


def _answer(text: Any) -> tuple[int, list[str]]:
    stored, held = json.loads(text)
    return int(stored), [str(i) for i in held]


def _answers_for_bulk(rows: RedisBulkRows) -> KeyedBulkRows:
    """Never called: mypy holds here that this is what the bulk jobs ask of it (the registry
    hands it out cast, so nothing else would)."""
    return rows
