"""Error-queue headers: why a message landed there, so an operator can fix and send it back."""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from datetime import datetime

from duetime.message import DISPATCHER_ONLY_PREFIX, DelayedMessage

PREFIX = DISPATCHER_ONLY_PREFIX
ERROR_TYPE = PREFIX + "type"
ERROR_MESSAGE = PREFIX + "message"
ERROR_STACKTRACE = PREFIX + "stacktrace"
ERROR_TIME = PREFIX + "time"
ERROR_ATTEMPTS = PREFIX + "attempts"
ORIGINAL_DESTINATION = PREFIX + "original-destination"
ORIGINAL_DUE_AT = PREFIX + "original-due-at"
#: On a notice of a message its transport could never carry, not even into the error queue: the
#: message itself stays in the store (retry reschedules it there; discard cancels it there).
KEPT_IN_STORE = PREFIX + "kept-in-store"
#: The endpoint whose dispatcher (or front door) the message failed in: its error-queue commands
#: and dashboard act on its own failures only.
ERROR_ENDPOINT = PREFIX + "endpoint"


def error_headers(
    message: DelayedMessage,
    error: BaseException | str,
    at: datetime,
    attempts: int,
    *,
    endpoint: str | None = None,
) -> dict[str, str]:
    """The message's headers plus the reason; a str error is a reason without an exception."""
    headers = dict(message.headers)
    if isinstance(error, BaseException):
        headers[ERROR_TYPE] = f"{type(error).__module__}.{type(error).__qualname__}"
        headers[ERROR_MESSAGE] = str(error) or type(error).__name__
        headers[ERROR_STACKTRACE] = "".join(traceback.format_exception(error))[-8000:]
    else:
        headers[ERROR_TYPE] = "duetime.errors.DestinationNotFound"
        headers[ERROR_MESSAGE] = error
        headers[ERROR_STACKTRACE] = ""
    headers[ERROR_TIME] = at.isoformat()
    headers[ERROR_ATTEMPTS] = str(attempts)
    headers[ORIGINAL_DESTINATION] = message.destination
    headers[ORIGINAL_DUE_AT] = message.due_at.isoformat()
    if endpoint is not None:
        headers[ERROR_ENDPOINT] = endpoint
    return headers


def failed_in(headers: Mapping[str, str], endpoint: str) -> bool:
    """Whether a failure is ``endpoint``'s: it says so, or it says no endpoint at all (a failure
    recorded before failures named their endpoint belongs to whoever looks)."""
    return headers.get(ERROR_ENDPOINT, endpoint) == endpoint


def without_error_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers as they were before the message failed (for sending it back)."""
    return {k: v for k, v in headers.items() if not k.startswith(PREFIX) and k != "duetime-due-at"}


def kept_in_store(headers: Mapping[str, str]) -> bool:
    """Whether an error-queue entry is a notice for a message kept in the store (see KEPT_IN_STORE)."""
    return headers.get(KEPT_IN_STORE) == "true"
