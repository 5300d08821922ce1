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
import itertools
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

    __slots__ = ("abandoned", "done", "leads", "message", "next", "outcome", "wake")

    def __init__(self, message: DelayedMessage) -> None:
        self.message = message
        self.wake = threading.Lock()
        self.wake.acquire()
        self.done = False
        #: Set when the caller before it hands over the committing (its own round is done).
        self.leads = False
        self.outcome: Outcome = None
        #: Set when its round is stored: the round's caller it wakes once it is woken itself.
        self.next: _Waiting | None = None
        #: Its caller stopped waiting (interrupted): nobody is there to wake or to commit.
        self.abandoned = False


class SharedCommits:
    """For blocking callers on many threads: one caller at a time commits, for itself and every
    caller waiting; when its own message is stored it hands the committing to the next waiting
    caller, then wakes those of its round.

    The round's callers are woken one after another, each waking the next as it runs (a chain),
    not all at once: all at once, a dozen threads queue for Python's interpreter lock, and the
    thread committing the next round waits behind all of them each time its flush returns (a
    round's insert took twice as long as alone). The chain keeps one or two in the queue: 16
    threads store 4-20 % more a second on SQLite (bench/RESULTS.md, shared commits)."""

    def __init__(self, store_many: StoreMany) -> None:
        self.store_many = store_many
        self._pending: list[_Waiting] = []
        self._committing = False
        self._lock = threading.Lock()

    def store(self, message: DelayedMessage) -> None:
        me = _Waiting(message)
        try:
            with self._lock:
                self._pending.append(me)
                me.leads = not self._committing
                self._committing = True
            if not me.leads:
                me.wake.acquire()
        except BaseException:  # interrupted (Ctrl-C): what was coming to this caller goes on
            self._abandon(me)
            raise
        if not me.leads:
            self._pass_on(me)
        if not me.done:
            self._commit_until(me)
        if me.outcome is not None:
            raise me.outcome

    def _pass_on(self, me: _Waiting) -> None:
        """Woken with its round stored: wake the next caller of the round."""
        with self._lock:
            after, me.next = me.next, None
        if after is not None:
            after.wake.release()

    def _abandon(self, me: _Waiting) -> None:
        """Its caller stopped waiting: the round's next caller, or the committing handed to it,
        goes to someone else, so no caller waits forever for a wake-up that has nowhere to go."""
        with self._lock:
            me.abandoned = True
            after, me.next = me.next, None
            leader = self._next_leader() if me.leads else None
        for waiting in (after, leader):
            if waiting is not None:
                waiting.wake.release()

    def _next_leader(self) -> _Waiting | None:
        """The first waiting caller still there, now committing; None (and nobody committing)
        if there is none. Under ``_lock``."""
        leader = next((w for w in self._pending if not w.abandoned), None)
        if leader is None:
            self._committing = False
        else:
            leader.leads = True
        return leader

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
                woken = [w for w in batch if w is not me and not w.abandoned]
                for waiting, after in itertools.pairwise(woken):
                    waiting.next = after
                successor = self._next_leader() if me.done else me
            if successor is not None and successor is not me:
                successor.wake.release()
            if woken:
                woken[0].wake.release()
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
