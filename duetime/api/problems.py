"""Errors as ``application/problem+json`` (RFC 9457): one stable ``type`` per error class.

The ``detail`` is the one line the command line prints for the same error, so a script over HTTP
and a person at a terminal read the same words. A failure nobody foresaw answers 500 with a line
that says the server's log has it: never a traceback, never what the failure held.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.routing import Match

from duetime.errors import (
    ApiKeyExists,
    ConfigurationError,
    ConnectionFailed,
    DeadlineExceeded,
    DuetimeError,
    DuplicateMessageId,
    InvalidMessage,
    InvalidSchedule,
    MessageInFlight,
    MessageNotFound,
    MessageRefused,
    ScheduleExists,
    ScheduleNotFound,
    StorageFull,
    StoreNotReady,
    TransportUnavailable,
)

log = logging.getLogger("duetime.api")

MEDIA_TYPE = "application/problem+json"
#: Where every problem type's name starts: a URN, stable and resolving to nothing outside.
TYPE_PREFIX = "urn:duetime:problem:"


class Problem(BaseModel):
    """What went wrong, in RFC 9457's fields."""

    type: str = Field(description="Stable for each kind of error: urn:duetime:problem:<name>.")
    title: str = Field(description="The HTTP status's words.")
    status: int
    detail: str = Field(description="One line: what is wrong and what to do.")


class ApiProblem(Exception):
    """An answer other than success, raised anywhere a request is handled."""

    def __init__(self, status: int, name: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.name, self.detail, self.headers = status, name, detail, headers or {}


#: Each error class of the library, most particular first: its HTTP status. A class not here
#: that is a DuetimeError answers 400 (a ConfigurationError during a request is the request's).
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (MessageNotFound, 404),
    (ScheduleNotFound, 404),
    (ScheduleExists, 409),
    (ApiKeyExists, 409),
    (DuplicateMessageId, 409),
    (MessageInFlight, 409),
    (MessageRefused, 422),
    (InvalidMessage, 400),
    (InvalidSchedule, 400),
    (StorageFull, 507),
    (StoreNotReady, 503),
    (ConnectionFailed, 503),
    (DeadlineExceeded, 503),
    (TransportUnavailable, 503),
    (ConfigurationError, 400),
    (DuetimeError, 400),
)

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}


def type_name(error: type[BaseException]) -> str:
    """``MessageInFlight`` -> ``message-in-flight``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", error.__name__).lower()


def status_of(error: BaseException) -> int:
    return next(status for kind, status in STATUS_OF if isinstance(error, kind))


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "no detail"


def answer(status: int, name: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = Problem(
        type=TYPE_PREFIX + name, title=TITLES.get(status, "Error"), status=status, detail=first_line(detail)
    )
    return JSONResponse(body.model_dump(), status_code=status, media_type=MEDIA_TYPE, headers=headers)


async def on_problem(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiProblem)
    return answer(error.status, error.name, error.detail, error.headers)


async def on_duetime_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, DuetimeError)
    status = status_of(error)
    headers = {"Retry-After": "5"} if status == 503 else None
    return answer(status, type_name(type(error)), str(error), headers)


def _where(location: tuple[Any, ...]) -> str:
    parts = [str(p) for p in location if p not in ("body",)]
    return ".".join(parts) or "the request"


async def on_invalid_request(request: Request, error: Exception) -> JSONResponse:
    """The first thing wrong with the request, in one line: where, and what was expected."""
    assert isinstance(error, RequestValidationError)
    kind = request.headers.get("content-type", "")
    if request.method in ("POST", "PATCH") and "json" not in kind.lower():
        return answer(
            415,
            "unsupported-media-type",
            f"send the body as JSON, with Content-Type: application/json (it came as {kind[:60] or 'nothing'!r})",
        )
    found = list(error.errors())
    if not found:
        return answer(400, "invalid-request", "the request is not what this address takes")
    first = found[0]
    message = str(first.get("msg", "is not valid")).rstrip(".")
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    where = _where(tuple(first.get("loc", ())))
    return answer(400, "invalid-request", f"{where}: {message}{more}; see /openapi.json for what it takes.")


async def on_http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    status = error.status_code
    words = {
        404: "no such address in this API; see /openapi.json",
        405: "this address does not take that method",
    }
    detail = words.get(status, str(error.detail))
    headers = dict(error.headers or {})
    if status == 405:  # every method the address takes (Starlette names only the first route's)
        headers["Allow"] = ", ".join(allowed_methods(request))
    return answer(status, "not-found" if status == 404 else f"http-{status}", detail, headers)


def allowed_methods(request: Request) -> list[str]:
    """The methods some route takes at this address, asked of the routes themselves."""
    return [
        method
        for method in ("DELETE", "GET", "PATCH", "POST", "PUT")
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]


async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
    """What nobody foresaw: logged whole for the operator, one line for the caller."""
    log.error("%s %s failed unexpectedly", request.method, request.url.path, exc_info=error)
    return answer(500, "internal", "the server failed unexpectedly; its log has the details")


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The problems a route answers besides the common ones (404, 409, ...); :func:`as_problems`
    gives them their media type in the document."""
    return {s: {"model": Problem, "description": TITLES[s]} for s in statuses}


#: Added to every route's responses in the OpenAPI document: the problems any route may answer.
COMMON_PROBLEMS = problems(400, 401, 403, 413, 415, 429, 500, 503)


def as_problems(document: dict[str, Any]) -> dict[str, Any]:
    """The document FastAPI made, with every error answered as ``application/problem+json`` (as
    it is), and without FastAPI's own 422 for a request it could not read (answered 400 here)."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            answers = operation.get("responses", {})
            for status, response in list(answers.items()):
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref", "").endswith("/HTTPValidationError"):
                    del answers[status]
                elif status.isdigit() and int(status) >= 400:
                    response["content"] = {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    schemas = document.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return document
