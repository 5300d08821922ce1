"""One redaction rule for every form a secret takes in a URL (``duetime.inputs.urls.redact``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from duetime.inputs.urls import redact

SECRETS = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789!$%*+-._~", min_size=6, max_size=40).map(
    lambda s: "Zq" + s  # never a piece of the rest of a URL
)
SCHEMES = st.sampled_from(["postgresql", "mysql", "redis", "amqp", "nats", "celery+redis", "tls"])
HOSTS = st.sampled_from(["db", "127.0.0.1", "[::1]", "h1:5432,h2:5433", "rabbit.example.com:5672"])
OPTIONS = st.sampled_from(
    ["password", "sslpassword", "token", "auth_token", "client_secret", "apiKey", "api_key", "passwd"]
)
FORMS = [
    "{scheme}://user:{secret}@{host}/db",
    "{scheme}://:{secret}@{host}/0",
    "{scheme}://us%40er:{secret}@{host}/vhost?heartbeat=10",
    "{scheme}://{host}/db?sslmode=require&{option}={secret}",
    "{scheme}://user@{host}/db?{option}={secret}&x=1",
    "{scheme}:/user:{secret}@{host}/db",  # a slash short
    "{scheme}:user:{secret}@{host}",
    "{scheme}://user:{secret}@{host}:99999999/db",  # a port that cannot be read
    "{scheme}://user:{secret}@[::1/db",  # an IPv6 address that is not closed
]


@given(SCHEMES, HOSTS, OPTIONS, SECRETS, st.sampled_from(FORMS))
def test_no_form_of_a_secret_survives(scheme: str, host: str, option: str, secret: str, form: str) -> None:
    url = form.format(scheme=scheme, host=host, option=option, secret=secret)
    shown = redact(url)
    assert secret not in shown, (url, shown)
    assert "***" in shown


@given(HOSTS, SECRETS)
def test_a_nats_token_is_a_secret_and_a_database_user_is_not(host: str, token: str) -> None:
    assert token not in redact(f"nats://{token}@{host}")
    assert redact(f"postgresql://app@{host}/app") == f"postgresql://app@{host}/app"


def test_what_holds_no_secret_is_left_exactly_as_written() -> None:
    for url in (
        "sqlite:///tmp/x.db",
        "sqlite:///var/lib/duetime/a:b@c.db",
        "redis://h:6379/0?prefix=a:b@c&mode=stream",
        "amqp://rabbit:5672/%2F?heartbeat=10",
        "postgresql://postgres@127.0.0.1:5432/test?schema=t1&target_session_attrs=read-write",
    ):
        assert redact(url) == url
