"""The error-queue commands on every queue transport, as an operator runs them: a real subprocess, a
SQLite store, and the real RabbitMQ, Redis (stream and list), NATS, and SQLite's own queue tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from duetime.registry import open_transport
from tests.services import NATS, RABBITMQ, REDIS, require

BROKERS = {
    "rabbitmq": lambda tag: RABBITMQ,
    "redis-stream": lambda tag: f"{REDIS}?mode=stream&prefix=duetime-test-{tag}:",
    "redis-list": lambda tag: f"{REDIS}?mode=list&prefix=duetime-test-{tag}:",
    "nats": lambda tag: f"{NATS}?subject_prefix=duetime-test-{tag}.",
    "sqlite": lambda tag: "sqlite:///duetime.db",  # the queue tables beside the store (the test's folder)
}


async def _remove(url: str, queues: list[str]) -> None:
    t: Any = open_transport(url)
    await t.start()
    try:
        if hasattr(t, "delete"):
            for queue in queues:
                with contextlib.suppress(Exception):  # a queue the test never made
                    await t.delete(queue)
        else:  # Redis: every key under the test's prefix
            keys = [k async for k in t.redis.scan_iter(match=f"{t.prefix}*")]
            if keys:
                await t.redis.delete(*keys)
    finally:
        await t.close()


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[str], str]]]:
    """The broker's URL, and a maker of queue names unique to this test (removed afterwards)."""
    tag = uuid.uuid4().hex[:8]
    url = BROKERS[request.param](tag)
    if not url.startswith("sqlite"):
        require(url)
    made: list[str] = []

    def name(base: str) -> str:
        made.append(f"{base}-{tag}")
        return made[-1]

    yield url, name
    if not url.startswith("sqlite"):
        asyncio.run(_remove(url, made))


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_error_queue_on_a_broker_lists_retries_and_discards(cli, broker) -> None:  # type: ignore[no-untyped-def]
    url, name = broker
    orders, gone, other, error = name("orders"), name("gone"), name("other"), name("error")
    on = ("--transport", url, "--error-queue", error)
    cli("setup")
    cli("queues", "declare", orders, error, "--transport", url)
    cli("schedule", gone, "first", "--in", "0s", "--id", "a")
    cli("schedule", gone, "second", "--in", "0s", "--id", "b")
    cli("schedule", other, "third", "--in", "0s", "--id", "c")
    cli("schedule", other, "fourth", "--in", "0s", "--id", "d")
    assert "to the error queue 4" in cli("run", "--burst", *on).stdout

    listed = _lines(cli("errors", "list", "--json", *on).stdout)
    assert [(m["id"], m["destination"]) for m in listed] == [
        ("a", gone),
        ("b", gone),
        ("c", other),
        ("d", other),
    ]
    assert "not declared" in listed[0]["error"] or "does not exist" in listed[0]["error"]
    assert [m["id"] for m in _lines(cli("errors", "list", "--json", "--destination", gone, *on).stdout)] == [
        "a",
        "b",
    ]
    table = cli("errors", "list", *on).stdout
    assert "4 shown of 4" in table
    neither = cli("errors", "retry", *on, ok=False)
    assert neither.returncode == 1 and "give the ids" in neither.stderr

    unasked = cli("errors", "retry", "--all", "--destination", gone, "--to", orders, *on, ok=False)
    assert unasked.returncode == 1 and "Add --yes" in unasked.stderr
    assert len(_lines(cli("errors", "list", "--json", *on).stdout)) == 4  # asked, so nothing moved

    # as if an earlier retry stored "a" and stopped before taking it off the error queue
    cli("schedule", orders, "first", "--in", "0s", "--id", "a", "--transport", url)
    sent = cli("errors", "retry", "--all", "--destination", gone, "--to", orders, "--yes", *on)
    assert "sent 2 back" in sent.stdout and "1 were stored already" in sent.stdout
    assert [m["id"] for m in _lines(cli("errors", "list", "--json", *on).stdout)] == ["c", "d"]
    assert "forwarded 2" in cli("run", "--burst", *on).stdout
    got = _lines(cli("queues", "receive", orders, "--wait", "1", "--transport", url).stdout)
    assert sorted((m["id"], m["body"]) for m in got) == [("a", "first"), ("b", "second")]
    assert not any(k.startswith("duetime-error-") for k in got[0]["headers"])

    assert "discarded 1" in cli("errors", "discard", "d", "--yes", *on).stdout
    # looked up before the question: nothing there is an answer, not a question
    nowhere = cli("errors", "discard", "d", "zz", *on, ok=False)
    assert nowhere.returncode == 1 and "not in error queue" in nowhere.stderr, nowhere.stderr
    assert "d, zz" in nowhere.stderr and "Add --yes" not in nowhere.stderr
    partly = cli("errors", "discard", "c", "zz", *on, ok=False)  # asked about what is there only
    assert partly.returncode == 1 and "Discard 1 message from error queue" in partly.stderr, partly.stderr
    unasked = cli("errors", "discard", "--all", "--destination", other, *on, ok=False)
    assert unasked.returncode == 1 and "Discard 1 message that were going to" in unasked.stderr
    assert "discarded 1" in cli("errors", "discard", "--all", "--destination", other, "--yes", *on).stdout
    assert cli("errors", "list", "--json", *on).stdout.strip() == ""
    none = cli("errors", "retry", "c", *on, ok=False)
    assert "not in error queue" in none.stderr
