"""Shared commits: concurrent single stores go in few transactions, each caller hears its own
answer, an outage reaches everyone of its round, and a caller that gives up does not stop one."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from duetime import DelayedMessage, DuplicateMessageId
from duetime.backends._shared_commit import AsyncSharedCommits, Outcome, SharedCommits, _Waiting, store_round

DUE = datetime(2030, 1, 1, tzinfo=UTC)


class Recorder:
    """A store_many that records its rounds, refuses known ids, and can be slow or down."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.rounds: list[list[str]] = []
        self.stored: set[str] = set()
        self.seconds = seconds
        self.down = False
        self.lock = threading.Lock()

    def store_many(self, messages: Sequence[DelayedMessage]) -> int:
        time.sleep(self.seconds)
        with self.lock:
            self.rounds.append([m.message_id for m in messages])
            if self.down:
                raise ConnectionError("the database went away")
            taken = [m.message_id for m in messages if m.message_id in self.stored]
            if taken:
                raise DuplicateMessageId(f"{taken[0]} is stored")
            self.stored.update(m.message_id for m in messages)
            return len(messages)


def message(i: int) -> DelayedMessage:
    return DelayedMessage(f"m{i}", "orders", DUE)


def shared(recorder: Recorder) -> AsyncSharedCommits:
    async def run(messages: list[DelayedMessage]) -> list[Outcome]:
        await asyncio.sleep(0.001)  # a commit takes time: the next callers gather meanwhile
        return store_round(messages, recorder.store_many)

    return AsyncSharedCommits(run)


async def test_callers_at_once_share_a_round_and_each_returns_when_stored() -> None:
    recorder = Recorder()
    commits = shared(recorder)
    await asyncio.gather(*(commits.store(message(i)) for i in range(16)))
    assert recorder.stored == {f"m{i}" for i in range(16)}
    assert len(recorder.rounds) == 1


async def test_a_duplicate_fails_only_its_caller() -> None:
    recorder = Recorder()
    recorder.stored.add("m3")
    commits = shared(recorder)
    outcomes = await asyncio.gather(*(commits.store(message(i)) for i in range(6)), return_exceptions=True)
    assert [type(o).__name__ if o else None for o in outcomes] == [
        None,
        None,
        None,
        "DuplicateMessageId",
        None,
        None,
    ]
    assert recorder.stored == {f"m{i}" for i in range(6)}
    assert recorder.rounds[0] == [f"m{i}" for i in range(6)]  # tried together, then each alone


async def test_an_outage_reaches_every_caller_of_its_round() -> None:
    recorder = Recorder()
    recorder.down = True
    commits = shared(recorder)
    outcomes = await asyncio.gather(*(commits.store(message(i)) for i in range(4)), return_exceptions=True)
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    assert len(recorder.rounds) == 1  # not retried one by one against a store that is down


async def test_a_caller_that_gives_up_does_not_stop_the_round() -> None:
    recorder = Recorder()
    commits = shared(recorder)
    impatient = asyncio.ensure_future(commits.store(message(1)))
    patient = asyncio.ensure_future(commits.store(message(2)))
    await asyncio.sleep(0)
    impatient.cancel()
    await patient
    assert recorder.stored == {"m1", "m2"}  # the cancelled caller's message was on its way


async def test_later_callers_go_in_the_next_round() -> None:
    recorder = Recorder()
    commits = shared(recorder)
    first = asyncio.ensure_future(commits.store(message(0)))
    await asyncio.sleep(0)  # the first round is under way
    await asyncio.gather(first, *(commits.store(message(i)) for i in range(1, 9)))
    assert recorder.rounds == [["m0"], [f"m{i}" for i in range(1, 9)]]


def test_threads_share_commits_too() -> None:
    recorder = Recorder(seconds=0.01)  # a disk flush
    commits = SharedCommits(recorder.store_many)
    with ThreadPoolExecutor(16) as pool:
        assert [f.exception() for f in [pool.submit(commits.store, message(i)) for i in range(32)]] == [
            None
        ] * 32
    assert recorder.stored == {f"m{i}" for i in range(32)}
    assert len(recorder.rounds) < 16  # one commit per waiting crowd, not per caller

    recorder.stored.add("m107")
    with ThreadPoolExecutor(16) as pool:
        outcomes = [f.exception() for f in [pool.submit(commits.store, message(i)) for i in range(100, 132)]]
    assert [i for i, o in enumerate(outcomes) if o is not None] == [7]
    assert isinstance(outcomes[7], DuplicateMessageId)
    assert recorder.stored >= {f"m{i}" for i in range(100, 132)}


def test_a_failing_round_on_threads_fails_each_of_its_callers() -> None:
    recorder = Recorder(seconds=0.005)
    recorder.down = True
    commits = SharedCommits(recorder.store_many)
    with ThreadPoolExecutor(8) as pool:
        outcomes = [f.exception() for f in [pool.submit(commits.store, message(i)) for i in range(8)]]
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    with pytest.raises(ConnectionError):
        commits.store(message(99))


def test_many_threads_calling_again_and_again_all_return_each_stored_once() -> None:
    """The committing is handed on before a round's callers are woken: a thousand calls from 16
    threads that call again at once all return (none left waiting for a hand-off), each message
    stored once, in rounds that gather the waiting crowd."""
    recorder = Recorder(seconds=0.0005)
    commits = SharedCommits(recorder.store_many)

    def producer(first: int) -> None:
        for i in range(first, first + 64):
            commits.store(message(i))

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(producer, p * 1000) for p in range(16)]
        assert [f.result(timeout=60) for f in futures] == [None] * 16
    stored = [i for r in recorder.rounds for i in r]
    assert sorted(stored) == sorted(f"m{p * 1000 + i}" for p in range(16) for i in range(64))
    assert len(recorder.rounds) < len(stored) / 4


def test_a_caller_interrupted_while_waiting_strands_nobody() -> None:
    """Ctrl-C reaches the main thread while it waits for the round under way: the committing that
    would have been handed to it, and its round's wake-ups, go on to the callers still there (it
    was once handed the committing, and the callers after it waited forever)."""
    gate, inside = threading.Event(), threading.Event()
    recorder = Recorder()

    def store_many(messages: Sequence[DelayedMessage]) -> int:
        inside.set()
        gate.wait(10)
        return recorder.store_many(messages)

    commits = SharedCommits(store_many)
    leader = threading.Thread(target=commits.store, args=(message(0),), daemon=True)
    leader.start()
    assert inside.wait(10)

    def interrupt_once_waiting() -> None:
        while len(commits._pending) < 1:
            time.sleep(0.001)
        time.sleep(0.2)  # asleep on its wake-up by now
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    # Python's own Ctrl-C handler, whatever the process had (a test runner's worker may not)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_waiting, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            commits.store(message(1))
    finally:
        signal.signal(signal.SIGINT, previous)
    later = [threading.Thread(target=commits.store, args=(message(i),), daemon=True) for i in range(2, 6)]
    for thread in later:
        thread.start()
    while len(commits._pending) < 5:
        time.sleep(0.001)
    gate.set()
    for thread in [leader, *later]:
        thread.join(10)
        assert not thread.is_alive(), "a caller still waits"
    assert recorder.stored == {f"m{i}" for i in range(6)}  # the interrupted call's message too
    commits.store(message(6))  # and the next caller commits at once
    assert "m6" in recorder.stored


def test_a_chained_caller_interrupted_before_it_woke_the_next_passes_the_wake_up_on() -> None:
    """A round's callers wake one another in turn; one interrupted before it woke the next (its
    own wake-up may come later or never) still wakes it, so the rest of the chain returns."""
    commits = SharedCommits(Recorder().store_many)
    interrupted, after = _Waiting(message(1)), _Waiting(message(2))
    interrupted.next = after
    commits._abandon(interrupted)
    assert after.wake.acquire(blocking=False), "the next caller of the round was never woken"
    assert interrupted.abandoned and interrupted.next is None
