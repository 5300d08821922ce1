"""Routing keys and delay rounding of the RabbitMQ native topology (no broker needed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.backends.rabbitmq.catchall import destination_of
from duetime.backends.rabbitmq.native import (
    MAX_DELAY,
    DelayTooLong,
    arrival_headers,
    delay_seconds,
    first_level,
    level_binding,
    routing_key,
)


@pytest.mark.parametrize(
    ("seconds", "bits"),
    [
        (0, "0" * 28),
        (1, "0" * 27 + "1"),
        (5, "0" * 25 + "101"),
        (2**27, "1" + "0" * 27),
        (MAX_DELAY, "1" * 28),
    ],
)
def test_routing_key_is_the_delay_in_binary_then_the_destination(seconds: int, bits: str) -> None:
    assert routing_key(seconds, "orders") == ".".join(bits) + ".orders"


def test_the_seeds_four_level_example() -> None:
    assert routing_key(5, "destination", levels=4) == "0.1.0.1.destination"
    assert first_level(5) == 2 and first_level(0) is None and first_level(MAX_DELAY) == 27
    # level 3 looks at the first word, level 0 at the fourth
    assert level_binding(3, "1", levels=4) == "1.#"
    assert level_binding(2, "0", levels=4) == "*.0.#"
    assert level_binding(0, "1", levels=4) == "*.*.*.1.#"


def test_delays_round_up_to_whole_seconds_and_the_maximum_is_refused() -> None:
    assert delay_seconds(0) == 0 and delay_seconds(-3) == 0
    assert delay_seconds(0.001) == 1 and delay_seconds(4.2) == 5 and delay_seconds(timedelta(seconds=5)) == 5
    assert delay_seconds(MAX_DELAY) == MAX_DELAY
    with pytest.raises(DelayTooLong, match="268,435,455 s"):
        delay_seconds(MAX_DELAY + 0.5)
    with pytest.raises(DelayTooLong):
        routing_key(MAX_DELAY + 1, "x")


def test_arrival_strips_dead_letter_bookkeeping_and_keeps_the_rest() -> None:
    headers = {"x-death": [{}], "x-first-death-queue": "q", "x-last-death-reason": "expired", "app": "1"}
    assert arrival_headers(headers) == {"app": "1"}
    assert destination_of(routing_key(7, "orders.eu")) == "orders.eu"
