"""Without OpenTelemetry (the `otel` extra not installed) tracing is a no-op that changes nothing."""

from __future__ import annotations

import pytest

from duetime import DelayedMessage, tracing


def test_without_the_package_messages_pass_through_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", None)
    messages = [
        DelayedMessage.create("orders", b"x", delay=1),
        DelayedMessage.create("orders", b"y", delay=1),
    ]
    assert not tracing.enabled()
    with tracing.storing(messages) as stamped:
        assert stamped == messages
    tracing.forwarded([("orders", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], 0.1)


def test_a_malformed_traceparent_is_no_link_and_no_error() -> None:
    assert tracing._link("not a traceparent") is None
    assert tracing._link(None) is None
