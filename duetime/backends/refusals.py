"""Whose fault a failed send is: the message's, or the broker's. One reading for every transport.

A broker that cannot take one message says so in different ways: it closes the channel (RabbitMQ:
a queue name it reserves, a queue that exists with other arguments), it closes the whole
connection (an exchange type it lacks: ``503 COMMAND_INVALID``), or it answers an error for that
publish. Taken for an outage, any of these sends the batch again and again: the good messages
before the bad one go many times, those after it never go, the dispatch breaker trips and the
process exits, on every start. A real outage (the broker went away, or is shutting down) must
stay an outage: the messages wait for it instead of going to the error queue.

So a failure is sorted here, by what the broker said: an AMQP reply code a broker closes a
channel or connection with because of what one command carried refuses the message
(:class:`MessageRefused`: to the error queue, with the broker's words); a connection that broke
without such a code is an outage for this message and every one after it in the batch, while
those before it, already confirmed, stay sent. :func:`send_each` is that loop for the transports
that publish one message at a time (Celery's and Dramatiq's clients). The RabbitMQ transport,
which writes a whole batch before its confirms come back, reads the broker's answer to each
publish in its own ``send_batch``. Either way, a connection lost without a code is then traced
to the message that loses it by :mod:`duetime.engine.pinpoint`, and
``duetime.testing.transport_contract.ContainmentContract`` holds every transport to the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from duetime.errors import InvalidMessage, MessageRefused, TransportError, TransportUnavailable, server_reason
from duetime.message import DelayedMessage

#: AMQP 0-9-1's reply codes a broker closes a channel or a connection with because of what one
#: command carried (the specification's constants, section 1.5): sent again, the same message
#: gets the same answer. Left out, as outages: 320 CONNECTION_FORCED (the broker is shutting
#: down or an operator closed the connection), 506 RESOURCE_ERROR (the broker is short of
#: memory or disk) and 541 INTERNAL_ERROR.
REFUSING_CODES = {
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
}


def reply_code(error: BaseException) -> int | None:
    """The AMQP reply code behind ``error``, wherever its client keeps it: a ``reply_code``
    attribute (pika, py-amqp), or the error it wraps (Dramatiq wraps pika's as its first
    argument; others chain it as the cause)."""
    seen: set[int] = set()
    todo: list[object] = [error]
    while todo:
        item = todo.pop(0)
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        code = getattr(item, "reply_code", None)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        todo += [*item.args, item.__cause__, item.__context__]
    return None


def refusal(error: BaseException, message_id: str, broker: str) -> MessageRefused | None:
    """``error`` as the broker's refusal of message ``message_id``, or None when it is not one
    (an outage, or a failure the broker did not explain)."""
    code = reply_code(error)
    if code not in REFUSING_CODES:
        return None
    return MessageRefused(f"{broker} refused message {message_id}: {server_reason(error)}")


def send_each(
    messages: Sequence[DelayedMessage],
    send: Callable[[DelayedMessage], None],
    *,
    outages: tuple[type[BaseException], ...],
    reset: Callable[[], None],
    broker: str,
) -> list[Exception | None]:
    """Send ``messages`` one at a time with ``send`` (which connects when it must); one result
    each, never a raise part way: the messages sent before a failure stay sent.

    A failure the broker gives as a refusal of this message fails it alone (``reset`` drops the
    channel or connection it may have closed; the next send opens a new one). One of ``outages``
    without such a reason, or a connection that cannot be opened again (``send`` raising
    :class:`TransportUnavailable`), is an outage: this message and those after it come back
    unavailable.
    Anything else fails this message alone, to be tried again (:class:`TransportError`)."""
    results: list[Exception | None] = []
    for index, message in enumerate(messages):
        try:
            send(message)
        except InvalidMessage as error:  # found before anything was sent
            results.append(error)
            continue
        except Exception as error:
            reset()
            refused = refusal(error, message.message_id, broker)
            if refused is not None:
                results.append(refused)
            elif isinstance(error, TransportUnavailable):  # connecting again failed: said already
                return results + [error] * (len(messages) - index)
            elif isinstance(error, outages):
                gone = TransportUnavailable(f"{broker} went away: {server_reason(error)}")
                return results + [gone] * (len(messages) - index)
            else:
                results.append(
                    TransportError(f"sending message {message.message_id} to {broker} failed: {error!r}")
                )
            continue
        results.append(None)
    return results
