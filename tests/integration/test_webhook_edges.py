"""Webhooks against the parts production puts around a receiver: nginx from Debian's packages
terminating TLS with a certificate of a CA the test makes (and another that nobody trusts), and
names that a resolver of the test's own (dnsmasq) answers with addresses nobody allowed: the
address connected to is what is checked, whatever the name said."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from duetime.settings import DEFAULT_ENDPOINT
from tests.conftest import duetime_cmd, spawn_run, wait_until_serving
from tests.dashboard_process import PASSWORD, basic, dashboard, request
from tests.dashboard_process import stop as stop_dashboard
from tests.integration.test_webhooks import ROUTE, add, errors, ok, schedule
from tests.services import free_port, store_url, until
from tests.topology.servers import stop
from tests.webhook_receiver import receiving

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NGINX_AT = "127.0.0.3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="nginx as its own user, and a mount namespace, need root"
)


def _certificate(folder: Path, name: str, address: str) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a server certificate it signed for ``address``: (CA, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def subject(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject(f"{name} test CA"))
        .issuer_name(subject(f"{name} test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject(address))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / f"{name}-ca.pem", folder / f"{name}.pem", folder / f"{name}.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def _answers(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@contextmanager
def nginx(folder: Path, upstream: int, servers: list[tuple[int, Path, Path]]) -> Iterator[None]:
    """nginx terminating TLS on :data:`NGINX_AT` at each ``(port, cert, key)``, passing every
    request on to ``upstream`` on 127.0.0.2 as it came (headers and body untouched)."""
    if shutil.which("nginx") is None:
        pytest.fail("nginx is not installed: scripts/services.py installs it (Debian's package nginx)")
    blocks = "".join(
        f"""
        server {{
            listen {NGINX_AT}:{port} ssl;
            ssl_certificate {cert};
            ssl_certificate_key {key};
            location / {{ proxy_pass http://127.0.0.2:{upstream}; proxy_set_header Host $host; }}
        }}"""
        for port, cert, key in servers
    )
    temp = "".join(
        f"{kind}_temp_path {folder / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = folder / "nginx.conf"
    conf.write_text(
        f"""daemon off;
worker_processes 1;
user root;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"};
events {{ worker_connections 64; }}
http {{
    access_log {folder / "access.log"};
    {temp}
    {blocks}
}}
"""
    )
    server = subprocess.Popen(
        ["nginx", "-c", str(conf), "-p", str(folder), "-e", str(folder / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until(lambda: all(_answers(NGINX_AT, port) for port, _, _ in servers), 20, "nginx listening")
        yield
    finally:
        stop(server, signal.SIGQUIT)  # a graceful stop: the master ends its workers


@contextmanager
def dnsmasq(folder: Path, answers: dict[str, str]) -> Iterator[Path]:
    """A resolver of the test's own answering each name with its address (nothing else: no
    upstream, no hosts file), on an address of its own; yields a ``resolv.conf`` naming it."""
    if shutil.which("dnsmasq") is None:
        pytest.fail("dnsmasq is not installed: scripts/services.py installs it (Debian's dnsmasq-base)")
    address = f"127.0.53.{random.randint(2, 250)}"
    server = subprocess.Popen(
        [
            "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--conf-file=/dev/null",
            f"--listen-address={address}", "--bind-interfaces", "--port=53", "--user=root",
            f"--pid-file={folder / 'dnsmasq.pid'}",
            *(f"--address=/{name}/{answer}" for name, answer in answers.items()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(0.3)
        if server.poll() is not None:
            pytest.fail(f"dnsmasq did not start: {server.stderr.read().decode() if server.stderr else ''}")
        resolv = folder / "resolv.conf"
        resolv.write_text(f"nameserver {address}\n")
        yield resolv
    finally:
        stop(server)


def with_resolver(resolv: Path, args: list[str]) -> list[str]:
    """``args`` run where ``/etc/resolv.conf`` is ``resolv`` (a mount namespace of its own: the
    machine's own file is untouched), so the system resolver asks the test's."""
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(resolv), *args]


@contextmanager
def overview_of(url: str) -> Iterator[Callable[[], dict[str, str]]]:
    """``duetime dashboard`` on the store; yields a look at its overview's webhook endpoints: each
    endpoint's row as text."""
    port = free_port()
    board = dashboard(url, port, endpoint=DEFAULT_ENDPOINT)

    def look() -> dict[str, str]:
        status, page = request(port, "/", auth=basic("duetime", PASSWORD))
        assert status == 200, page
        table = page.partition('id="webhooks"')[2].partition("</table>")[0]
        rows = re.findall(r'<td class="mono">([^<]+)</td>(.*?)</tr>', table, re.DOTALL)
        return {name: re.sub(r"<[^>]+>", " ", cells) for name, cells in rows}

    try:
        yield look
    finally:
        stop_dashboard(board)


def health(rows: dict[str, str]) -> dict[str, str]:
    """Each endpoint's health word, from its row's text."""
    return {name: text.split()[0] for name, text in rows.items() if text.split()}


@pytest.mark.slow
def test_webhooks_reach_a_receiver_behind_nginx_over_tls_with_the_ca_they_are_told_to_trust(
    tmp_path: Path,
) -> None:
    """The receiver behind nginx gets every message once, each signature verified (nginx passes
    the body and the webhook-* headers as they came); a certificate from a CA nobody trusts is
    never sent to, and its message ends in the error queue saying why."""
    ca, cert, key = _certificate(tmp_path, "trusted", NGINX_AT)
    _, other_cert, other_key = _certificate(tmp_path, "stranger", NGINX_AT)
    trusted, stranger = free_port(), free_port()
    with (
        store_url("sqlite", tmp_path) as url,
        receiving(SECRET, host="127.0.0.2") as receiver,
        nginx(tmp_path, receiver.port, [(trusted, cert, key), (stranger, other_cert, other_key)]),
    ):
        ok("setup", "--store", url)
        allowed = ("--allow", NGINX_AT)
        add(url, "hook.tls", f"https://{NGINX_AT}:{trusted}/ok", SECRET, *allowed)
        add(
            url,
            "hook.stranger",
            f"https://{NGINX_AT}:{stranger}/ok",
            SECRET,
            *allowed,
            "--retry-schedule",
            "1s,1s",
        )
        sent = {schedule(url, "hook.tls", f'{{"n": {i}}}', "--id", f"tls-{i}") for i in range(10)}
        untrusted = schedule(url, "hook.stranger", "x", "--id", "stranger")
        log = tmp_path / "run.log"
        run = spawn_run(
            duetime_cmd("run", "--store", url, "--route", ROUTE), log, env={"SSL_CERT_FILE": str(ca)}
        )
        try:
            wait_until_serving(log)
            until(lambda: set(receiver.delivered()) >= sent, 30, "the messages through nginx delivered")
            until(
                lambda: untrusted in errors(url), 30, "the untrusted certificate's message in the error queue"
            )
            with overview_of(url) as overview:
                until(
                    lambda: health(overview()) == {"hook.tls": "ok", "hook.stranger": "failing"},
                    30,
                    "health shown",
                )
                shown = overview()
        finally:
            run.send_signal(signal.SIGTERM)
            run.wait(30)
        assert shown["hook.tls"].split()[1] == "10" and "unreachable" in shown["hook.stranger"], shown
        assert all(r.verified for r in receiver.requests), "a signature the receiver could not verify"
        assert sorted(r.headers["webhook-id"] for r in receiver.requests) == sorted(sent)
        assert "certificate" in errors(url)[untrusted]["error"].lower()
        assert "stranger" not in {r.headers["webhook-id"] for r in receiver.requests}


@pytest.mark.slow
def test_a_name_a_resolver_answers_with_an_address_nobody_allowed_is_refused(tmp_path: Path) -> None:
    """DNS rebinding, with a real resolver: names answered with a private address (10.0.0.1) and
    with IPv6 loopback (::1) are refused with the address they came to, as a literal would be;
    a name answered with an address its endpoint allows is delivered (so it is the test's
    resolver that was asked)."""
    with (
        store_url("sqlite", tmp_path) as url,
        receiving(SECRET, host="127.0.0.2") as receiver,
        dnsmasq(tmp_path, {"rebind.test": "10.0.0.1", "six.test": "::1", "ok.test": "127.0.0.2"}) as resolv,
    ):
        ok("setup", "--store", url)
        add(url, "hook.rebind", f"http://rebind.test:{receiver.port}/ok", SECRET)
        add(url, "hook.six", f"http://six.test:{receiver.port}/ok", SECRET)
        add(url, "hook.named", f"http://ok.test:{receiver.port}/ok", SECRET, "--allow", "127.0.0.2")
        rebind = schedule(url, "hook.rebind", "r", "--id", "rebind")
        six = schedule(url, "hook.six", "s", "--id", "six")
        named = schedule(url, "hook.named", "n", "--id", "named")
        log = tmp_path / "run.log"
        run = spawn_run(with_resolver(resolv, duetime_cmd("run", "--store", url, "--route", ROUTE)), log)
        try:
            wait_until_serving(log)
            until(lambda: named in receiver.delivered(), 30, "the allowed name delivered")
            until(lambda: {rebind, six} <= set(errors(url)), 30, "the rebound names in the error queue")
        finally:
            run.send_signal(signal.SIGTERM)
            run.wait(30)
        dead = errors(url)
        assert "10.0.0.1" in dead[rebind]["error"] and "may not reach" in dead[rebind]["error"]
        assert "::1" in dead[six]["error"] and "may not reach" in dead[six]["error"]
        assert [r.headers["webhook-id"] for r in receiver.requests] == [named]
        ok("webhooks", "list", "--store", url)  # the endpoints stay as they were


@pytest.mark.slow
def test_a_url_destination_goes_where_an_endpoints_pattern_allows_and_nowhere_else(tmp_path: Path) -> None:
    """Messages whose destination is a URL: delivered to that very URL (its query too) by the
    endpoint whose pattern allows it, signed with its secret; the domain itself, another path, a
    URL no pattern allows and a pattern's name as a destination are refused; a pattern does not
    open an address its endpoint may not reach."""
    with (
        store_url("sqlite", tmp_path) as url,
        receiving(SECRET, host="127.0.0.2") as receiver,
        dnsmasq(tmp_path, {"hooks.test": "127.0.0.2", "evil.test": "10.0.0.1"}) as resolv,
    ):
        port = receiver.port
        ok("setup", "--store", url)
        add(url, "partners", f"http://*.hooks.test:{port}/ok*", SECRET, "--allow", "127.0.0.2")
        add(url, "others", f"http://*.evil.test:{port}/*", SECRET)
        given = {
            "sub": f"http://a.hooks.test:{port}/ok?order=1",
            "deeper": f"http://b.c.hooks.test:{port}/ok/x",
            "domain": f"http://hooks.test:{port}/ok",
            "path": f"http://a.hooks.test:{port}/missing",
            "nobody": f"http://a.hooks.test:{port + 1}/ok",
            "name": "partners",
            "rebound": f"http://a.evil.test:{port}/ok",
        }
        for message_id, destination in given.items():
            schedule(url, destination, message_id, "--id", message_id)
        routes = ("--route", ROUTE, "--route", "http://*=webhooks://", "--route", "partners=webhooks://")
        log = tmp_path / "run.log"
        run = spawn_run(with_resolver(resolv, duetime_cmd("run", "--store", url, *routes)), log)
        refused = set(given) - {"sub", "deeper"}
        try:
            wait_until_serving(log)
            until(lambda: {"sub", "deeper"} <= set(receiver.delivered()), 30, "the allowed URLs delivered")
            until(lambda: refused <= set(errors(url)), 30, "the others in the error queue")
        finally:
            run.send_signal(signal.SIGTERM)
            run.wait(30)
        assert all(r.verified for r in receiver.requests)
        assert sorted(r.headers["webhook-id"] for r in receiver.requests) == ["deeper", "sub"]
        paths = {r.headers["webhook-id"]: r.path for r in receiver.requests}
        assert paths["sub"].startswith("/ok") and paths["deeper"] == "/ok/x"
        dead = errors(url)
        for message_id in ("domain", "path", "nobody"):
            assert "no webhook endpoint allows the URL" in dead[message_id]["error"], message_id
        assert "give one of them as the destination" in dead["name"]["error"]
        assert "10.0.0.1" in dead["rebound"]["error"] and "may not reach" in dead["rebound"]["error"]
