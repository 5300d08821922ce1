"""OpenTelemetry spans for storing and forwarding, linked to the messages' own traces.

With the ``otel`` extra (``opentelemetry-api``) installed, and a tracer provider configured by the
application (or by ``opentelemetry-instrument duetime run``):

- **storing** (``schedule``, ``schedule_many``, the bridges, the front door) makes a
  ``duetime schedule`` span, a child of whatever span is current, linked to each message's
  ``traceparent``; a message that carries none, stored while a trace is under way (a web request,
  say), is given this span's, so its delivery can be found from the request that scheduled it.
- **forwarding** makes one ``duetime forward`` span per delivered batch that holds traced messages,
  from claim to delivery, linked to each of them (a delay of hours is a link, not a parent: the
  trace that scheduled it ended long ago).

The ``traceparent`` header itself is never changed once set: it reaches the destination as the
producer wrote it. Without the package, or before a tracer provider is set, every function here costs one check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from duetime.message import DelayedMessage
from duetime.version import __version__

TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
#: OpenTelemetry's default cap on links per span; further messages are counted, not linked.
MAX_LINKS = 128

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer: Any = trace.get_tracer("duetime", __version__)
    _w3c: Any = TraceContextTextMapPropagator()
except ImportError:  # the extra is not installed: no spans
    _tracer = None


#: Once an application has set its tracer provider, OpenTelemetry keeps it for good: asked once.
_PROVIDER_SET: list[bool] = []


def enabled() -> bool:
    """Whether spans are recorded: the package is installed and the application has set a tracer
    provider (until then OpenTelemetry's default records nothing, and duetime skips the work).
    Asked every round: once the answer is yes it is kept (looking costs an environment lookup)."""
    if _tracer is None:
        return False
    if _PROVIDER_SET:
        return True
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return False
    _PROVIDER_SET.append(True)
    return True


def _link(traceparent: str | None, tracestate: str | None = None) -> Any:
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent} | ({TRACESTATE: tracestate} if tracestate else {})
    context = trace.get_current_span(_w3c.extract(carrier)).get_span_context()
    return Link(context) if context.is_valid else None


def _links(traces: Sequence[tuple[str | None, str | None]]) -> list[Any]:
    links = []
    for parent, state in traces:
        link = _link(parent, state)
        if link is not None:
            links.append(link)
            if len(links) == MAX_LINKS:
                break
    return links


def _attributes(destinations: Sequence[str], count: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": "duetime", "messaging.batch.message_count": count}
    if len(set(destinations)) == 1:
        attributes["messaging.destination.name"] = destinations[0]
    return attributes


@contextlib.contextmanager
def storing(messages: Sequence[DelayedMessage]) -> Iterator[list[DelayedMessage]]:
    """Around storing ``messages``: yields them, those without a ``traceparent`` given the span's."""
    if not enabled():
        yield list(messages)
        return
    links = _links([(m.headers.get(TRACEPARENT), m.headers.get(TRACESTATE)) for m in messages])
    attributes = _attributes([m.destination for m in messages], len(messages))
    if len(messages) == 1:
        attributes["messaging.message.id"] = messages[0].message_id
    in_a_trace = trace.get_current_span().get_span_context().is_valid
    with _tracer.start_as_current_span(
        "duetime schedule", kind=SpanKind.PRODUCER, links=links, attributes=attributes
    ) as span:
        if not (in_a_trace and span.is_recording()):
            yield list(messages)
            return
        carrier: dict[str, str] = {}
        _w3c.inject(carrier)
        yield [
            m if TRACEPARENT in m.headers else dataclasses.replace(m, headers={**m.headers, **carrier})
            for m in messages
        ]


def traced(headers: Mapping[str, str]) -> str | None:
    """The message's ``traceparent``, if it has one (what :func:`forwarded` links to)."""
    return headers.get(TRACEPARENT)


def forwarded(items: Sequence[tuple[str, str | None]], seconds: float) -> None:
    """A batch was delivered, ``seconds`` after it was claimed: (destination, traceparent) each.
    A batch with no traced message makes no span."""
    if not enabled():
        return
    links = _links([(parent, None) for _, parent in items if parent])
    if not links:
        return
    end = time.time_ns()
    span = _tracer.start_span(
        "duetime forward",
        kind=SpanKind.PRODUCER,
        links=links,
        attributes=_attributes([d for d, _ in items], len(items)),
        start_time=end - int(seconds * 1e9),
    )
    span.end(end_time=end)
