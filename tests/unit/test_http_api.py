"""The HTTP API's rules on the memory store, called as an ASGI application (no socket): the cases
Schemathesis found, the problem answers, keys, scopes and rates."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from duetime.api import HttpApi
from duetime.api.access import Bucket
from duetime.api.problems import type_name
from duetime.api_keys import Scope, new_key, read_scopes
from duetime.backends.memory import MemoryStore
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, MessageInFlight
from duetime.operations.carry import CarryRule
from duetime.settings import TransactionMode


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.raw = status, headers, body

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


async def call(
    app: Any,
    method: str,
    path: str,
    body: Any = None,
    key: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> Answer:
    """One request straight into the ASGI application."""
    raw_path = path.split("?")[0]
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [
        *(headers or [(b"content-type", b"application/json")]),
        (b"content-length", str(len(data)).encode()),
    ]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    from urllib.parse import unquote

    scope = {
        "type": "http", "http_version": "1.1", "method": method, "scheme": "http",
        "path": unquote(raw_path), "raw_path": raw_path.encode(), "root_path": "",
        "query_string": path.partition("?")[2].encode(), "headers": headers,
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    got: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            got["headers"] = {k.decode(): v.decode("latin-1") for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            got["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return Answer(got["status"], got["headers"], got["body"])


@pytest.fixture
async def api() -> AsyncIterator[HttpApi]:
    store = MemoryStore()
    await store.setup_infrastructure("duetime")
    await store.initialize("duetime", TransactionMode.AT_LEAST_ONCE)
    served = HttpApi(store, "memory://", "duetime", CarryRule("error"), None, "error")
    yield served
    await served.close()


async def test_an_id_outside_latin_1_is_stored_and_its_location_percent_encoded(api: HttpApi) -> None:
    """Schemathesis: a Location header of the raw id failed to encode (a 500)."""
    app = api.app()
    made = await call(
        app, "POST", "/v1/messages", {"id": "ORF\U000cae4f\r\nX: y", "destination": "o", "delay": 60}
    )
    assert made.status == 201
    assert made.headers["location"] == "/v1/messages/ORF%F3%8A%B9%8F%0D%0AX%3A%20y"
    again = await call(app, "GET", made.headers["location"])
    assert again.status == 200 and again.json["id"] == "ORF\U000cae4f\r\nX: y"


async def test_ids_with_slashes_and_line_breaks_are_reached(api: HttpApi) -> None:
    app = api.app()
    for weird in ("a/b", "line\nbreak", "trailing/"):
        assert (
            await call(app, "POST", "/v1/messages", {"id": weird, "destination": "o", "delay": 60})
        ).status == 201
        path = "/v1/messages/" + weird.replace("\n", "%0A")
        assert (await call(app, "GET", path)).json["id"] == weird
        assert (await call(app, "DELETE", path)).status == 204


async def test_an_address_answers_405_naming_every_method_it_takes(api: HttpApi) -> None:
    """Schemathesis: Starlette named only the first route's method."""
    refused = await call(api.app(), "PUT", "/v1/schedules")
    assert refused.status == 405 and refused.headers["allow"] == "GET, POST"
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json["type"] == "urn:duetime:problem:http-405"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"destination": "o", "delay": False}, "delay"),  # a true/false is not a number
        ({"destination": "o", "delay": None}, "null"),  # left out, never null
        ({"destination": "o"}, "exactly one of due_at"),
        ({"destination": "o", "delay": 1, "due_at": "2030-01-01T00:00:00Z"}, "exactly one of due_at"),
        ({"destination": "o", "delay": "5.061066.1ms"}, "delay"),
        ({"destination": "o", "delay": 1, "body": "a", "body_base64": "YQ=="}, "not both"),
        ({"destination": "o", "delay": 1, "body_base64": "tglk3nFJ8B"}, "body_base64"),
        ({"destination": "o", "delay": 1, "dely": 1}, "dely"),
        ({"destination": " ", "delay": 1}, "destination"),
        ({"destination": "error", "delay": 1}, "error queue"),
        ({"destination": "sales.timeouts", "delay": 1}, "timeouts queue"),
        ({"destination": "o", "due_at": "2030-01-01T00:00:00"}, "due_at"),
        ({"destination": "o", "delay": 1, "headers": {"duetime-error-message": "x"}}, "dispatchers only"),
    ],
)
async def test_a_bad_message_is_one_problem_line_and_nothing_is_stored(
    api: HttpApi, body: dict[str, Any], words: str
) -> None:
    refused = await call(api.app(), "POST", "/v1/messages", body)
    assert refused.status in (400, 422), refused.json
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json
    assert set(problem) == {"type", "title", "status", "detail"} and "\n" not in problem["detail"]
    assert words in problem["detail"], problem
    assert (await api.store.counts(SYSTEM.now())).total == 0


async def test_a_batch_is_all_or_none_and_a_retried_one_creates_nothing_twice(api: HttpApi) -> None:
    app = api.app()
    batch = {"messages": [{"id": f"b{i}", "destination": "o", "delay": 60} for i in range(3)]}
    first = await call(app, "POST", "/v1/batches", batch)
    assert first.status == 200 and first.json["created"] == 3
    again = await call(app, "POST", "/v1/batches", {"messages": [*batch["messages"], batch["messages"][0]]})
    assert again.json["existing"] == 3 and again.json["created"] == 0
    other = {
        "messages": [
            {"id": "b9", "destination": "o", "delay": 1},
            {"id": "b0", "destination": "p", "delay": 1},
        ]
    }
    conflict = await call(app, "POST", "/v1/batches", other)
    assert conflict.status == 409 and await api.store.get("b9") is None  # nothing of it stored
    twice = {
        "messages": [{"id": "c", "destination": "o", "delay": 1}, {"id": "c", "destination": "p", "delay": 1}]
    }
    assert (await call(app, "POST", "/v1/batches", twice)).status == 409


async def test_pages_follow_an_opaque_cursor_and_any_text_after_it(api: HttpApi) -> None:
    app = api.app()
    batch = {
        "messages": [
            {"id": f"m{i}", "destination": "o", "due_at": f"2030-01-01T00:00:0{i}Z"} for i in range(5)
        ]
    }
    await call(app, "POST", "/v1/batches", batch)
    seen, after = [], ""
    while True:
        page = (await call(app, "GET", f"/v1/messages?limit=2{after}")).json
        seen += [m["id"] for m in page["messages"]]
        if page["next_cursor"] is None:
            break
        after = f"&after={page['next_cursor']}"
    assert seen == [f"m{i}" for i in range(5)]
    long = await call(app, "GET", "/v1/messages?after=0~" + "0" * 297)  # Schemathesis: past any id
    assert long.status == 200 and [m["id"] for m in long.json["messages"]] == seen


async def test_keys_scopes_and_rates(api: HttpApi) -> None:
    app = api.app()
    assert (await call(app, "GET", "/v1/stats")).status == 200  # no key yet: open (to loopback)
    reader, secret = new_key("reader", {Scope.READ}, SYSTEM.now(), rate=2)
    await api.store.add_api_key(reader)  # type: ignore[attr-defined]
    api.access._read_at = float("-inf")  # as if the keys' two seconds had passed
    assert (await call(app, "GET", "/v1/stats")).status == 401
    assert (await call(app, "GET", "/v1/stats", key="dtk_" + "x" * 43)).status == 401
    assert (await call(app, "GET", "/v1/stats", key=secret)).status == 200
    forbidden = await call(app, "POST", "/v1/messages", {"destination": "o", "delay": 1}, key=secret)
    assert forbidden.status == 403 and "schedule scope" in forbidden.json["detail"]
    answers = [await call(app, "GET", "/v1/stats", key=secret) for _ in range(2)]  # a rate of 2
    assert [a.status for a in answers] == [200, 429]
    assert int(answers[1].headers["retry-after"]) >= 1


async def test_each_request_is_one_log_line_whose_json_carries_its_parts(
    api: HttpApi, caplog: pytest.LogCaptureFixture
) -> None:
    """The request's line names the key (never its secret); in JSON each part is a field."""
    from duetime.observability.logs import JsonFormatter, TextFormatter

    writer, secret = new_key("writer", {Scope.SCHEDULE}, SYSTEM.now())
    await api.store.add_api_key(writer)  # type: ignore[attr-defined]
    api.access._read_at = float("-inf")
    with caplog.at_level("INFO", logger="duetime.api"):
        made = await call(
            api.app(), "POST", "/v1/messages?x=customer-9", {"destination": "o", "delay": 60}, key=secret
        )
    assert made.status == 201
    record = next(r for r in caplog.records if r.name == "duetime.api" and "/v1/messages" in r.getMessage())
    text = TextFormatter().format(record)
    assert " POST /v1/messages 201 " in text and text.endswith("key=writer") and secret not in text
    entry = json.loads(JsonFormatter().format(record))
    assert {k: entry[k] for k in ("method", "path", "status", "key")} == {
        "method": "POST",
        "path": "/v1/messages",
        "status": 201,
        "key": "writer",
    }
    assert isinstance(entry["ms"], float) and "customer-9" not in json.dumps(entry)


async def test_the_group_and_destination_cancels_leave_what_is_being_delivered(api: HttpApi) -> None:
    app = api.app()
    batch = {
        "messages": [{"id": f"g{i}", "destination": "o", "delay": 0, "group": "order-7"} for i in range(3)]
    }
    await call(app, "POST", "/v1/batches", batch)
    await api.store.fetch_due(SYSTEM.now(), 1)  # one is being delivered
    cancelled = await call(app, "DELETE", "/v1/groups/order-7/messages")
    assert cancelled.json == {"cancelled": 2, "in_flight": 1, "more": False}
    with pytest.raises(MessageInFlight):
        await api.store.cancel("g0")
    assert (await call(app, "DELETE", "/v1/destinations/o/messages")).json == {
        "cancelled": 0,
        "in_flight": 1,
        "more": False,
    }


async def test_if_exists_keeps_replaces_or_debounces_and_never_a_message_being_delivered(
    api: HttpApi,
) -> None:
    app = api.app()
    first = {"id": "cart-7", "destination": "o", "delay": 600, "body": "one item"}
    made = await call(app, "POST", "/v1/messages", first)
    assert (made.status, made.headers["duetime-outcome"]) == (201, "stored")
    kept = await call(app, "POST", "/v1/messages", {**first, "body": "two", "if_exists": "keep"})
    assert (kept.status, kept.headers["duetime-outcome"]) == (200, "kept")
    assert base64.b64decode(kept.json["body_base64"]) == b"one item"
    replaced = await call(app, "POST", "/v1/messages", {**first, "body": "two items", "if_exists": "replace"})
    assert (replaced.status, replaced.headers["duetime-outcome"]) == (200, "replaced")
    assert (
        base64.b64decode((await call(app, "GET", "/v1/messages/cart-7")).json["body_base64"]) == b"two items"
    )
    debounced = {**first, "body": "three items", "delay": 0, "if_exists": "debounce"}
    assert (await call(app, "POST", "/v1/messages", debounced)).headers["duetime-outcome"] == "replaced"
    await api.store.fetch_due(SYSTEM.now(), 10)  # being delivered now
    refused = await call(app, "POST", "/v1/messages", {**debounced, "body": "four"})
    assert refused.status == 409 and refused.json["type"] == "urn:duetime:problem:message-in-flight"
    assert "not replaced" in refused.json["detail"]
    at_a_time = await call(
        app,
        "POST",
        "/v1/messages",
        {"id": "cart-7", "destination": "o", "due_at": "2030-01-01T00:00:00Z", "if_exists": "debounce"},
    )
    assert at_a_time.status == 400 and "takes a delay" in at_a_time.json["detail"]
    no_id = await call(app, "POST", "/v1/messages", {"destination": "o", "delay": 1, "if_exists": "replace"})
    assert no_id.status == 400 and "needs the message's id" in no_id.json["detail"]
    batch = await call(app, "POST", "/v1/batches", {"messages": [{**first, "if_exists": "replace"}]})
    assert (
        batch.status == 400 and "messages.0.if_exists: Extra inputs are not permitted" in batch.json["detail"]
    )


async def test_a_body_that_is_not_said_to_be_json_is_answered_415(api: HttpApi) -> None:
    """curl -d sends a form's content type: say what to send, not that a field is missing."""
    app = api.app()
    scope_headers = [(b"content-type", b"application/x-www-form-urlencoded")]
    refused = await call(app, "POST", "/v1/messages", {"destination": "o", "delay": 1}, headers=scope_headers)
    assert refused.status == 415 and "Content-Type: application/json" in refused.json["detail"]


def test_a_bucket_lets_a_seconds_burst_then_the_rate() -> None:
    bucket = Bucket(rate=10, tokens=10, at=0.0)
    assert [bucket.take(0.0) for _ in range(10)] == [0.0] * 10
    assert bucket.take(0.0) == pytest.approx(0.1)
    assert bucket.take(0.1) == 0.0


def test_scopes_are_read_from_words_and_a_wrong_one_is_one_line() -> None:
    assert read_scopes("schedule, read") == {Scope.SCHEDULE, Scope.READ}
    with pytest.raises(ConfigurationError, match="schedule, read, manage"):
        read_scopes("schedule,admin")


def test_problem_types_are_named_from_the_error_classes() -> None:
    assert type_name(MessageInFlight) == "message-in-flight"


async def test_every_time_answered_is_one_form_utc_with_z(api: HttpApi) -> None:
    """A message's due time was pydantic's ``...Z`` while a schedule's next tick, a limit's and a
    pause's time were ``+00:00`` strings: now every time field is an RFC 3339 instant in UTC
    ending in Z, and the document says ``format: date-time``."""
    instant = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")
    app = api.app()
    made = await call(
        app, "POST", "/v1/messages", {"destination": "o", "due_at": "2030-01-02T03:04:05+01:00"}
    )
    assert made.json["due_at"] == "2030-01-02T02:04:05Z"
    schedule = {"id": "paris", "destination": "o", "cron": "0 9 * * *", "zone": "Europe/Paris"}
    assert (await call(app, "POST", "/v1/schedules", schedule)).status == 201
    shown = (await call(app, "GET", "/v1/schedules/paris")).json
    assert instant.match(shown["next"]) and shown["next"].endswith(("T08:00:00Z", "T07:00:00Z")), shown
    assert (await call(app, "PUT", "/v1/limits/o", {"rate": "5/s"})).status == 200
    assert (await call(app, "POST", "/v1/destinations/o/pause", {"reason": "x"})).status == 204
    (limit,) = (await call(app, "GET", "/v1/limits")).json
    (destination,) = (await call(app, "GET", "/v1/destinations")).json
    ticks = (await call(app, "GET", "/v1/schedules/paris/next")).json["ticks"]
    stats = (await call(app, "GET", "/v1/stats")).json
    for said in (limit["set_at"], destination["paused_at"], stats["next_due"], *ticks):
        assert instant.match(said), said
    document = app.openapi()["components"]["schemas"]
    for model, field in (("ScheduleView", "next"), ("LimitOut", "set_at"), ("DestinationOut", "paused_at")):
        assert {"type": "string", "format": "date-time"} in document[model]["properties"][field]["anyOf"]


@pytest.mark.parametrize(
    ("header", "answered"),
    [
        ("2030-01-02T03:04:05+01:00", "2030-01-02T02:04:05Z"),
        ("2030-01-02T03:04:05.250000+00:00", "2030-01-02T03:04:05.250000Z"),
        ("yesterday", None),  # another system wrote the header: no time, and no 500
        ("2030-01-02T03:04:05", None),  # no zone: no instant
        ("0001-01-01T00:00:00+01:00", None),  # before year 1 in UTC
        ("9999-12-31T23:59:59-05:00", None),  # after year 9999 in UTC
    ],
)
def test_an_error_queue_time_is_the_instant_its_header_names_or_null(
    header: str, answered: str | None
) -> None:
    from duetime.api.models import FailedMessage

    failed = FailedMessage(
        id="m", destination=None, error=None, attempts=None, failed_at=header,
        headers={"duetime-error-time": header}, size=0, kept_in_store=False,
    )  # fmt: skip
    said = json.loads(failed.model_dump_json())
    assert said["failed_at"] == answered and said["headers"]["duetime-error-time"] == header
