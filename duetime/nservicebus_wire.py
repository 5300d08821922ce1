"""What NServiceBus puts on the wire, in one place: header names, its date format, and what a
timeout carries when the timeout manager dispatches it.

duetime speaks NServiceBus so that an endpoint can use duetime unchanged: it sends deferred
messages to duetime's front door, and receives what duetime dispatches as if its own timeout
manager had sent it. The facts (and where Particular's code states them) are listed in the
documentation's NServiceBus pages (docs/explanation/nservicebus.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

#: The timeout manager's headers (NServiceBus 7: TimeoutManagerHeaders).
EXPIRE = "NServiceBus.Timeout.Expire"
ROUTE_TO = "NServiceBus.Timeout.RouteExpiredTimeoutTo"
CLEAR_TIMEOUTS = "NServiceBus.ClearTimeouts"
SAGA_ID = "NServiceBus.SagaId"
#: Headers every NServiceBus sender sets.
MESSAGE_ID = "NServiceBus.MessageId"
REPLY_TO = "NServiceBus.ReplyToAddress"
CORRELATION_ID = "NServiceBus.CorrelationId"
ENCLOSED_TYPES = "NServiceBus.EnclosedMessageTypes"
CONTENT_TYPE = "NServiceBus.ContentType"
#: Set by the timeout manager when it dispatches a stored timeout.
TIME_SENT = "NServiceBus.TimeSent"
RELATED_TO_TIMEOUT = "NServiceBus.RelatedToTimeoutId"
#: NServiceBus.RabbitMQ's native delay header: the delay in whole seconds, an AMQP Int32.
DELAY_IN_SECONDS = "NServiceBus.Transport.RabbitMQ.DelayInSeconds"
#: The saga id of a timeout that belongs to no saga.
EMPTY_GUID = "00000000-0000-0000-0000-000000000000"
#: The header prefix of the MSMQ transport's timeout properties, which a store does not keep.
MSMQ_PROPERTIES = "NServiceBus.Timeouts.Properties."

_WIRE = re.compile(r"^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2}):(\d{1,6}) Z$")


def to_wire(moment: datetime) -> str:
    """NServiceBus's date format, ``yyyy-MM-dd HH:mm:ss:ffffff Z`` in UTC (28 characters)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S:%f Z")


def from_wire(value: str) -> datetime | None:
    """The moment a wire-format date names, or None if ``value`` is not in that format."""
    match = _WIRE.match(value.strip())
    if not match:
        return None
    day, clock, fraction = match.groups()
    return datetime.fromisoformat(f"{day}T{clock}.{fraction.ljust(6, '0')}+00:00")


#: Marks a timeout that was already due when it reached the front door. NServiceBus's timeout
#: manager forwards such a message at once with its id and headers as they came
#: (``StoreTimeoutBehavior``: ``Time - 1 s <= UtcNow``): no TimeSent of its own, no
#: RelatedToTimeoutId, since no timeout was stored. duetime stores it (nothing is lost if the
#: forward fails) and delivers it at once the same way; the mark itself is never sent.
DUE_ON_ARRIVAL = "duetime-nsb-due-on-arrival"
#: How close to its due time an arriving timeout counts as due (NServiceBus's one second).
DUE_ON_ARRIVAL_WITHIN = timedelta(seconds=1)


def is_timeout(headers: Mapping[str, str]) -> bool:
    """Whether a stored message came in as an NServiceBus timeout (front door or TimeoutData):
    the timeout manager stores every incoming header, so its ``Expire`` header is there."""
    return EXPIRE in headers


def saga_group(headers: Mapping[str, str]) -> str | None:
    """The group a timeout belongs to: its saga's id (none for the empty GUID, as NServiceBus
    stores Guid.Empty for timeouts outside a saga)."""
    saga = (headers.get(SAGA_ID) or "").strip()
    return saga if saga and saga != EMPTY_GUID else None


def dispatch_headers(headers: Mapping[str, str], timeout_id: str, now: datetime) -> dict[str, str]:
    """What the timeout manager adds when it dispatches a timeout: the time of dispatch and the
    id of the stored timeout."""
    return {**headers, TIME_SENT: to_wire(now), RELATED_TO_TIMEOUT: timeout_id}


def amqp_properties(headers: Mapping[str, str], message_id: str) -> dict[str, str | None]:
    """The AMQP properties an NServiceBus.RabbitMQ sender fills from the headers; its receivers
    require the message-id. A message without NServiceBus headers keeps duetime's own."""
    if MESSAGE_ID not in headers and EXPIRE not in headers:
        return {"message_id": message_id, "content_type": headers.get("content-type")}
    enclosed = headers.get(ENCLOSED_TYPES)
    return {
        "message_id": headers.get(MESSAGE_ID) or message_id,
        "correlation_id": headers.get(CORRELATION_ID),
        "type": enclosed.split(",", 1)[0] if enclosed else None,
        "content_type": headers.get(CONTENT_TYPE) or "application/octet-stream",
        "reply_to": headers.get(REPLY_TO),
    }
