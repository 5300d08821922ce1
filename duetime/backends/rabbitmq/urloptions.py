"""The options an ``amqp://`` URL may carry, checked before connecting.

aio-pika and aiormq read their options from the URL's query and drop any name they do not know
without a word; a value they cannot read becomes 0 just as quietly. ``?heartbeat=1O`` (a letter
O) therefore switched heartbeats off, and with them the only way a waiting consumer notices a
partitioned connection. Here a misspelt name or an unreadable value is a one-line error naming
what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping

from duetime.errors import ConfigurationError
from duetime.inputs.urls import redact, refuse_unknown

#: duetime's own options (read by RabbitMqTransport.from_url and taken off the URL).
OWN = ("queue_type", "prefetch", "connect_timeout", "publish_timeout", "topology", "max_message_size")

#: Options the client libraries read, with what each value must be.
_WHOLE = {
    "heartbeat": (0, 65_534),
    "timeout": (1, 86_400),
    "interleave": (0, 1_000),
    "max_message_size": (1, 536_870_912),  # RabbitMQ's own ceiling is 512 MiB
}
_SECONDS = ("happy_eyeballs_delay",)
_CHOICES = {"auth": ("plain", "external"), "no_verify_ssl": ("0", "1")}
_TEXT = ("name", "cafile", "capath", "cadata", "keyfile", "certfile")
KNOWN = (*OWN, *_WHOLE, *_SECONDS, *_CHOICES, *_TEXT)


def check_broker_options(options: Mapping[str, str], url: str) -> None:
    """ConfigurationError for an option no part of the client reads, or a value it cannot use."""
    refuse_unknown(options, KNOWN, "RabbitMQ", url)
    for name, (low, high) in _WHOLE.items():
        raw = options.get(name)
        if raw is not None and not (raw.isdigit() and low <= int(raw) <= high):
            raise ConfigurationError(
                f"URL option {name}={raw!r} must be a whole number from {low} to {high} in {redact(url)}."
            )
    for name in _SECONDS:
        raw = options.get(name)
        if raw is not None and not _seconds(raw):
            raise ConfigurationError(
                f"URL option {name}={raw!r} must be seconds (e.g. 0.25) in {redact(url)}."
            )
    for name, choices in _CHOICES.items():
        raw = options.get(name)
        if raw is not None and raw.lower() not in choices:
            raise ConfigurationError(
                f"URL option {name}={raw!r} must be one of {', '.join(choices)} in {redact(url)}."
            )


def _seconds(raw: str) -> bool:
    try:
        return 0 <= float(raw) <= 60
    except ValueError:
        return False
