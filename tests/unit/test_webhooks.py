"""The webhook rules without a network: addresses, signatures, answers, and retries put off by
the dispatcher."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from duetime import DelayedMessage
from duetime.backends.webhooks.transport import GuardedResolver, WebhookTransport, check_literal, outcome
from duetime.errors import (
    ConfigurationError,
    DestinationNotFound,
    MessageRefused,
    RetryLater,
    TransportUnavailable,
)
from duetime.webhooks import (
    STANDARD_SCHEDULE,
    WebhookEndpoint,
    check_url,
    new_secret,
    read_schedule,
    signature_header,
)
from tests.unit.helpers import Rig

T = datetime(2030, 1, 1, tzinfo=UTC)


def endpoint(**changes: object) -> WebhookEndpoint:
    fields: dict[str, object] = {"secrets": (new_secret(),), **changes}
    return WebhookEndpoint("hook", "https://hooks.example/in", created_at=T, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "169.254.1.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::",
        "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        "64:ff9b::a00:1", "2002:7f00:1::1", "::127.0.0.1", "fe80::1%eth0", "not an address",
    ],
)  # fmt: skip
def test_internal_addresses_in_every_spelling_are_refused(address: str) -> None:
    assert not endpoint().reaches(address)


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_reached(address: str) -> None:
    assert endpoint().reaches(address)


def test_an_allow_list_opens_an_internal_target_on_purpose_and_no_more() -> None:
    hook = endpoint(allow=("10.1.0.0/16", "::1"))
    assert hook.reaches("10.1.2.3") and hook.reaches("::1") and hook.reaches("::ffff:10.1.2.3")
    assert not hook.reaches("10.2.0.1") and not hook.reaches("127.0.0.1")
    # a network holding the metadata address does not open it; its own address does
    assert not endpoint(allow=("169.254.0.0/16",)).reaches("169.254.169.254")
    assert endpoint(allow=("169.254.169.254",)).reaches("169.254.169.254")


def test_the_signature_verifies_with_the_standard_webhooks_library_during_a_rotation() -> None:
    old, new = new_secret(), new_secret()
    now = int(datetime.now(UTC).timestamp())
    body = '{"order": 7, "note": "žluťoučký"}'.encode()
    header = signature_header((new, old), "msg-1", now, body)
    assert len(header.split()) == 2  # both sign: a receiver with either accepts it
    headers = {"webhook-id": "msg-1", "webhook-timestamp": str(now), "webhook-signature": header}
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == {"order": 7, "note": "žluťoučký"}


def test_the_library_refuses_a_changed_body_or_another_secret() -> None:
    from standardwebhooks.webhooks import WebhookVerificationError

    secret = new_secret()
    now = int(datetime.now(UTC).timestamp())
    body = b'{"a": 1}'
    headers = {
        "webhook-id": "m",
        "webhook-timestamp": str(now),
        "webhook-signature": signature_header((secret,), "m", now, body),
    }
    assert Webhook(secret).verify(body, headers) == {"a": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(b'{"a": 2}', headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://x/",
        "https://",
        "https://user:pw@x/",
        "http://x/\r\nHost: y",
        "javascript:alert(1)",
        "https://x:99999/",
    ],
)
def test_urls_that_are_not_plain_http_are_refused_in_one_line(url: str) -> None:
    with pytest.raises(ConfigurationError, match="a webhook URL is http"):
        check_url(url)


def test_schedules_and_secrets_are_checked() -> None:
    assert read_schedule("5s,5m,2h") == (5.0, 300.0, 7200.0) and read_schedule("none") == ()
    with pytest.raises(ConfigurationError, match="--retry-schedule"):
        read_schedule("soon")
    with pytest.raises(ConfigurationError, match="whsec_"):
        endpoint(secrets=("hunter2",))
    with pytest.raises(ConfigurationError, match="--header"):
        endpoint(headers=("Authorization",))
    assert base64.b64decode(new_secret().removeprefix("whsec_")).__len__() == 24


def message(failures: int = 0) -> DelayedMessage:
    return DelayedMessage("m1", "hook", T, b"{}", {}, failure_count=failures)


def test_each_answer_means_what_the_issue_of_it_says() -> None:
    hook = endpoint(retry_schedule=(1.0, 2.0))
    assert outcome(hook, message(), 204, [], b"") is None
    for status in (408, 425, 429, 500, 502, 503, 504, 599):
        assert isinstance(outcome(hook, message(), status, [], b""), RetryLater), status
    for status in (301, 400, 401, 403, 404, 410, 422):
        refused = outcome(hook, message(), status, [], b"why " * 500)
        assert isinstance(refused, MessageRefused) and str(status) in str(refused), status
        assert len(str(refused)) < 1200 and "\n" not in str(refused)
    busy = outcome(hook, message(), 429, [(b"Retry-After", b"3")], b"")
    assert isinstance(busy, RetryLater) and busy.after == 3.0
    assert isinstance(outcome(hook, message(), 503, [], b""), RetryLater)
    assert outcome(hook, message(0), 503, [], b"").after == 1.0  # type: ignore[union-attr]
    assert outcome(hook, message(1), 503, [], b"").after == 2.0  # type: ignore[union-attr]
    gave_up = outcome(hook, message(2), 503, [], b"")
    assert isinstance(gave_up, MessageRefused) and "gave up after 3 attempts" in str(gave_up)
    assert endpoint().retry_schedule == STANDARD_SCHEDULE


async def test_a_name_resolving_to_an_internal_address_is_refused_at_connect() -> None:
    """DNS rebinding: what is checked is what the connector connects to, the resolver's answer
    at that moment (a resolver of the test's own here): only the addresses the endpoint may reach,
    and none is an error."""
    from duetime.backends.webhooks.transport import AddressNotAllowed

    answers = iter([["10.0.0.1", "93.184.215.14"], ["10.0.0.1"], ["::1"], ["::ffff:127.0.0.1"], []])

    async def resolve(host: str, port: int) -> list[str]:
        return next(answers)

    guard = GuardedResolver(endpoint(), resolve)
    [only] = await guard.resolve("rebind.example", 443)
    assert only["host"] == "93.184.215.14" and only["hostname"] == "rebind.example"
    for _ in range(4):
        with pytest.raises(AddressNotAllowed, match="may not reach"):
            await guard.resolve("rebind.example", 443)


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0x7f.1", "017700000001", "::ffff:127.0.0.1", "10.0.0.1"]
)
def test_a_host_written_as_an_address_is_checked_in_every_spelling(host: str) -> None:
    """The connector connects to an address literal without its resolver: checked before."""
    from duetime.backends.webhooks.transport import AddressNotAllowed

    with pytest.raises(AddressNotAllowed):
        check_literal(endpoint(), host)
    check_literal(endpoint(), "hooks.example")  # a name: its resolver checks it
    check_literal(endpoint(), "93.184.215.14")


async def test_ids_and_headers_http_cannot_carry_unchanged_are_refused_alone() -> None:
    t = WebhookTransport([endpoint(headers=("note",))])
    await t.start()
    results = await t.send_batch(
        [
            DelayedMessage("bad\nid", "hook", T, b""),
            DelayedMessage("é-id", "hook", T, b""),
            DelayedMessage("m", "hook", T, b"", {"note": "line\r\nbreak"}),
            DelayedMessage("n", "nobody", T, b""),
        ]
    )
    await t.close()
    assert [type(r) for r in results] == [MessageRefused, MessageRefused, MessageRefused, DestinationNotFound]
    with pytest.raises(TransportUnavailable):
        await t.send_batch([message()])


class NotNow:
    """A destination that says 'not now, in 30 s' to every message (no memory transport: the
    memory store would move into that in its own transaction)."""

    async def start(self) -> None:
        pass

    async def declare(self, queue: str) -> None:
        pass

    async def close(self) -> None:
        pass

    async def send_batch(self, messages: Sequence[DelayedMessage]) -> list[Exception | None]:
        return [RetryLater("busy", after=30.0) for _ in messages]


async def test_the_dispatcher_puts_a_retry_off_as_the_destination_asks_and_no_breaker_counts_it() -> None:
    rig = await Rig().setup("orders")
    rig.build(rig.store, NotNow())
    await rig.store.store(rig.message(1, -1))
    stats = await rig.dispatcher.run_burst()
    assert stats.forwarded == 0 and stats.dead_lettered == 0
    kept = await rig.store.get("m1")
    assert kept is not None and kept.failure_count == 1
    assert kept.due_at == rig.clock.now() + timedelta(seconds=30)
    assert rig.dispatcher.calls.breakers.dispatch.failures == 0
    assert rig.criticals == []


def test_an_endpoints_health_is_what_its_latest_attempt_came_to_across_every_log() -> None:
    """Several dispatchers (or routes) each count their own attempts: the counts add up, and the
    health is the latest attempt's, whichever log holds it."""
    from duetime.webhooks import AttemptLog, endpoint_health

    first, second = AttemptLog(), AttemptLog()
    first.record("billing", "2xx", 0.01, at=100)
    first.record("billing", "5xx", 0.02, at=105)
    second.record("billing", "2xx", 0.01, at=110)
    second.record("ledger", "timeout", None, at=50)
    first.record("crm", "4xx", 0.01, at=60)
    found = endpoint_health([first, second])
    assert found["billing"] == {"2xx": 2, "5xx": 1, "last": "2xx", "last_at": 110, "health": "ok"}
    assert found["ledger"]["health"] == "failing"
    assert found["crm"]["health"] == "refusing"


PATTERN = "https://*.partner.example/hooks/*"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://a.partner.example/hooks/x", True),
        ("https://a.b.partner.example/hooks/x/y?q=1", True),
        ("https://A.Partner.Example/hooks/x", True),
        ("https://partner.example/hooks/x", False),  # the domain itself: '*.' is a subdomain
        ("https://apartner.example/hooks/x", False),
        ("https://a.partner.example.evil.com/hooks/x", False),
        ("https://evil.com#@a.partner.example/hooks/x", False),
        ("https://evil.com\\@a.partner.example/hooks/x", False),
        ("https://u:p@a.partner.example/hooks/x", False),
        ("https://a.partner.example:8443/hooks/x", False),
        ("http://a.partner.example/hooks/x", False),
        ("https://a.partner.example/other", False),
        ("https://a.partner.example/hooks/../admin", False),
        ("https://a.partner.example/hooks/%2e%2e/admin", False),
        ("https://a.partner.example/hooks/x%2F..%2Fadmin", False),
        ("https://a.partner.example/hooks/x#frag", False),
        ("https://a.partner.example/hooks/x\n", False),
        ("https://ä.partner.example/hooks/x", False),
        ("https://[::1/hooks/x", False),
        ("https://evil.com%2f.partner.example/hooks/x", False),
        ("https://a_b.partner.example/hooks/x", False),
    ],
)
def test_a_url_is_allowed_by_a_pattern_part_by_part_never_as_text(url: str, allowed: bool) -> None:
    from duetime.webhooks import url_matches

    assert url_matches(PATTERN, url) is allowed


@pytest.mark.parametrize(
    "pattern",
    [
        "https://*/x",
        "https://a.*.com/x",
        "https://x.com/a?b=*",
        "https://u@x.com/*",
        "ftp://*.x.com/*",
        "https://*.x.com/*#f",
    ],
)
def test_a_url_pattern_wildcards_only_a_leading_host_label_and_the_path(pattern: str) -> None:
    from duetime.webhooks import check_url_pattern

    with pytest.raises(ConfigurationError) as caught:
        check_url_pattern(pattern)
    assert "\n" not in str(caught.value)


def test_of_several_patterns_the_most_specific_delivers_a_url() -> None:
    from dataclasses import replace

    from duetime.webhooks import endpoint_for_url

    broad = replace(endpoint(), name="broad", url="https://*.example.com/*")
    narrow = replace(endpoint(), name="narrow", url="https://*.example.com/billing/*")
    plain = replace(endpoint(), name="plain", url="https://api.example.com/billing/x")
    assert endpoint_for_url([broad, narrow, plain], "https://api.example.com/billing/x") is narrow
    assert endpoint_for_url([broad, narrow, plain], "https://api.example.com/crm") is broad
    assert endpoint_for_url([narrow], "https://api.example.com/crm") is None
