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
    "sealed:{scheme}://user:{secret}@{host}/db",  # a URL wrapped in another (a sealed route)
    "sealed:{scheme}://{host}/db?{option}={secret}",
]


@given(SCHEMES, HOSTS, OPTIONS, SECRETS, st.sampled_from(FORMS))
def test_no_form_of_a_secret_survives(scheme: str, host: str, option: str, secret: str, form: str) -> None:
    url = form.format(scheme=scheme, host=host, option=option, secret=secret)
    shown = redact(url)
    assert secret not in shown, (url, shown)
    assert "***" in shown or shown.startswith("<unparsable URL: "), (url, shown)


#: Generated passwords hold what a URL uses as separators: drivers disagree on where they end.
RAW_SECRETS = st.text(
    alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789#/?@:=!$*+-._~", min_size=6, max_size=40
).map(lambda s: "Zq" + s)
RAW_FORMS = [
    "{scheme}://user:{secret}@{host}/db",
    "{scheme}://user:{secret}@{host}/db?sslmode=require",
    "{scheme}://:{secret}@{host}/0",
    "{scheme}://user:{secret}@{host}/db?{option}={secret}",
]
#: Option names as a user may write them: any case, percent-encoded, MariaDB's and libpq's.
SPELLED_OPTIONS = st.sampled_from(
    ["password", "PASSWORD", "%70assword", "Pass%77ord", "pwd", "sslkey", "sslpassword", "Api-Key", "token"]
)
VALUES = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789#/?@:=!$*+-._~%", min_size=6, max_size=40).map(
    lambda s: "Zq" + s
)


@given(SCHEMES, HOSTS, OPTIONS, RAW_SECRETS, st.sampled_from(RAW_FORMS))
def test_a_password_with_separators_in_it_stays_hidden(
    scheme: str, host: str, option: str, secret: str, form: str
) -> None:
    url = form.format(scheme=scheme, host=host, option=option, secret=secret)
    shown = redact(url)
    for piece in secret.replace("#", "/").replace("?", "/").replace("@", "/").replace(":", "/").split("/"):
        assert len(piece) < 4 or piece not in shown, (url, shown)


@given(SCHEMES, HOSTS, SPELLED_OPTIONS, VALUES.filter(lambda v: "&" not in v))
def test_an_option_named_like_a_secret_in_any_spelling_is_hidden(
    scheme: str, host: str, option: str, value: str
) -> None:
    url = f"{scheme}://{host}/db?sslmode=require&{option}={value}&application_name=x"
    shown = redact(url)
    assert value.split("#")[0] not in shown, (url, shown)


@given(
    VALUES.filter(lambda v: "'" not in v and "\\" not in v),
    st.sampled_from(["password", "sslpassword", "PASSWORD"]),
)
def test_a_keyword_connection_string_hides_its_secrets(value: str, key: str) -> None:
    for dsn in (
        f"host=db port=5432 {key}={value} dbname=app",
        f"host=db {key} = '{value} with spaces' dbname=app",
        f"{key}={value}",
    ):
        shown = redact(dsn)
        assert value not in shown and f"{key}" in shown, (dsn, shown)
        assert ("host=db" in shown) == ("host=db" in dsn), (dsn, shown)


def test_what_cannot_be_read_as_a_url_says_so_without_the_secret() -> None:
    for url, why in (
        ("postgresql//user:Zqsecret@db/app", "it has no scheme"),
        ("postgresql:/user:Zqsecret@db/app", "two slashes"),
        ("postgresql://user:Zqsecret@[::1/app", "Invalid IPv6 URL"),
        ("postgresql://user:Zqsecret@db:99999/app", "Port out of range"),
    ):
        shown = redact(url)
        assert shown.startswith("<unparsable URL: ") and why in shown and "Zqsecret" not in shown, shown


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


def test_scrub_replaces_every_remembered_secret_and_its_pieces_longest_first() -> None:
    """What a driver says of a URL in its own words: libpq quoted the part of a password after
    its `?` as an "invalid URI query parameter"."""
    from duetime.inputs.urls import remember, remember_secret, scrub

    remember("postgresql://app:Zqfirst?Zqsecondpart@db/app")
    remember_secret("Zq-dashboard-pw")
    said = (
        'invalid URI query parameter: "Zqsecondpart@db/app"; password Zqfirst?Zqsecondpart; Zq-dashboard-pw'
    )
    assert scrub(said) == 'invalid URI query parameter: "***@db/app"; password ***; ***'
    assert scrub("nothing secret here") == "nothing secret here"


def test_long_words_are_read_in_one_pass() -> None:
    """Every argument is read for secrets before a command runs. A key was tried at every letter
    of a long word, costing the square of its length (a 32 KB body took 27 s, a 2 MB one would
    outlast this test's time limit by hours); it now starts only where a word does."""
    from duetime.inputs.urls import secrets_in

    word = "a" * 2_000_000
    assert secrets_in(word) == set() and redact(word) == word
    cron = ",".join(str(i % 60) for i in range(8000)) + " * * * *"
    assert secrets_in(cron) == set()
    assert secrets_in(f"{word} password=longsecret {word}") == {"longsecret"}
