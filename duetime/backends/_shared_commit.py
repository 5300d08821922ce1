"""Concurrent single stores share one commit (group commit).

A web application schedules one message per request, from many requests at once. Each ``store``
used to be its own transaction, so the rate was one disk flush (fsync) per message whatever the
concurrency. Here the calls that arrive while a commit is under way wait for it and then go
together in the next one: one transaction for many callers, each of whom still returns only once
*its* message is durable, and still gets *its own* answer: if the shared transaction is refused
because of one message (an id already stored, content the store will not take), each message is
stored alone so only that caller sees the error. An outage fails every caller of that round.

One producer at a time sees no change: its round holds just its own message.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence

from duetime.errors import DuplicateMessageId, InvalidMessage
from duetime.message import DelayedMessage

#: Messages one shared commit takes at most (the rest go in the next).
ROUND_LIMIT = 1_000

StoreMany = Callable[[Sequence[DelayedMessage]], int]
Outcome = BaseException | None


def store_round(messages: Sequence[DelayedMessage], store_many: StoreMany) -> list[Outcome]:
    """Store ``messages`` in one transaction; each one's outcome (None: stored)."""
    try:
        store_many(messages)
        return [None] * len(messages)
    except (DuplicateMessageId, InvalidMessage) as error:
        if len(messages) == 1:
            return [error]
    except Exception as error:  # the store failed as a whole: every caller of the round hears it
        return [error] * len(messages)
    outcomes: list[Outcome] = []
    for message in messages:  # one message spoiled the round: each alone, each its own answer
        try:
            store_many([message])
            outcomes.append(None)
        except Exception as error:
            outcomes.append(error)
    return outcomes


class _Waiting:
    """One blocked caller. Its wake-up is a lock taken at birth and released by whoever stores its
    message or hands it the committing: the cheapest wake-up a thread has (an Event is a condition,
    a lock and a list of waiters: a third of a round's hand-off cost with 16 threads)."""

    __slots__ = ("done", "leads", "message", "outcome", "wake")

    def __init__(self, message: DelayedMessage) -> None:
        self.message = message
        self.wake = threading.Lock()
        self.wake.acquire()
        self.done = False
        #: Set when the caller before it hands over the committing (its own round is done).
        self.leads = False
        self.outcome: Outcome = None


class SharedCommits:
    """For blocking callers on many threads: one caller at a time commits, for itself and every
    caller waiting; when its own message is stored it hands the committing to the next waiting
    caller, then wakes those of its round (each thread is woken once, not once per round; the next
    round's flush starts before the woken callers compete for the interpreter)."""

    def __init__(self, store_many: StoreMany) -> None:
        self.store_many = store_many
        self._pending: list[_Waiting] = []
        self._committing = False
        self._lock = threading.Lock()

    def store(self, message: DelayedMessage) -> None:
        me = _Waiting(message)
        with self._lock:
            self._pending.append(me)
            me.leads = not self._committing
            self._committing = True
        if not me.leads:
            me.wake.acquire()
        if not me.done:
            self._commit_until(me)
        if me.outcome is not None:
            raise me.outcome

    def _commit_until(self, me: _Waiting) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending[:ROUND_LIMIT], self._pending[ROUND_LIMIT:]
            try:
                outcomes = store_round([w.message for w in batch], self.store_many)
            except BaseException as error:  # interrupted: nobody of this round may wait forever
                outcomes = [error] * len(batch)
            for waiting, outcome in zip(batch, outcomes, strict=True):
                waiting.done, waiting.outcome = True, outcome
            with self._lock:
                successor: _Waiting | None = None
                if not self._pending:
                    self._committing = False
                elif me.done:
                    successor = self._pending[0]
                    successor.leads = True
                else:
                    successor = me  # its message is still waiting: another round, by itself
            if successor is not None and successor is not me:
                successor.wake.release()
            for waiting in batch:
                if waiting is not me:
                    waiting.wake.release()
            if successor is not me:
                return


class AsyncSharedCommits:
    """For coroutines on one event loop: calls that arrive while a round is being stored wait and
    go in the next round. ``run_round`` stores a round and answers each message's outcome."""

    def __init__(self, run_round: Callable[[list[DelayedMessage]], Awaitable[list[Outcome]]]) -> None:
        self._run_round = run_round
        self._pending: list[tuple[DelayedMessage, asyncio.Future[Outcome]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def store(self, message: DelayedMessage) -> None:
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append((message, answer))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        outcome = await answer  # a cancelled caller cancels only its wait: the round goes on
        if outcome is not None:
            raise outcome

    async def _work(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:ROUND_LIMIT], self._pending[ROUND_LIMIT:]
            try:
                outcomes = await self._run_round([m for m, _ in batch])
            except BaseException as error:
                outcomes = [error] * len(batch)
            for (_, answer), outcome in zip(batch, outcomes, strict=True):
                if not answer.done():
                    answer.set_result(outcome)
