#!/usr/bin/env python3
"""The servers and programs the test suite needs: find each, install what is missing, start what
does not answer. Run by ``scripts/test.sh`` (the README's test command) and so by CI; standard
library only, so any Python 3.11 runs it before anything else is installed.

For each server (PostgreSQL, MariaDB, Redis, RabbitMQ, NATS with JetStream):

1. If it answers at the address the tests use, as the tests use it (PostgreSQL as user
   ``postgres`` without a password, database ``test``; MariaDB as ``root`` without one; NATS with
   JetStream), it is used as it is.
2. If it is not installed, it is installed from Debian's packages when this runs as root with
   ``apt-get`` (a package the release lacks is said in one line and blocks none of the others);
   otherwise one line says what to run, and its tests are skipped.
3. If a server of duetime's own ran here before (its data folder under ``$DUETIME_SERVICES_DIR``
   and its port in the ``env`` file), that one is started again, on its port. Else, if it was
   installed before and its standard port is free, it is started as the system's own service
   would be (a machine whose server merely stopped).
4. Otherwise duetime's tests get a server of their own: its own data folder under
   ``$DUETIME_SERVICES_DIR`` (default ``/var/tmp/duetime-services``), on the standard port when
   that is free and on a free port when something else holds it. It keeps running after the
   tests (as the machine's own servers do) and is found again by the next run.

What the tests should use is written to ``$DUETIME_SERVICES_DIR/env`` (``export
DUETIME_TEST_POSTGRES=…`` lines) for ``scripts/test.sh`` to read. The programs the tests run
(Java 17 or newer for Spark, Chromium for the dashboard, Node and npm for a TypeScript client,
openssl, nginx, dnsmasq, faketime, chattr, promtool, systemd-analyze,
``ip``) are installed the same way.

    python3 scripts/services.py          # find, install, start; then say what is where
    python3 scripts/services.py --check  # only say what answers and what is missing
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT_USER = os.geteuid() == 0
HOME = Path(os.environ.get("DUETIME_SERVICES_DIR", "/var/tmp/duetime-services"))


def say(line: str) -> None:
    print(f"services: {line}", file=sys.stderr, flush=True)


def free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return not answers(port)


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(
    *command: str, user: str | None = None, env: dict[str, str] | None = None, timeout: float = 180
) -> str:
    """``command``'s output; as ``user`` when this runs as root (servers that refuse root)."""
    extra: dict[str, object] = {}
    if user and ROOT_USER:
        extra = {"user": user, "group": user, "extra_groups": []}
    done = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd="/",
        **extra,  # type: ignore[call-overload]
    )
    if done.returncode:
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}): {(done.stdout + done.stderr)[-600:]}"
        )
    return str(done.stdout)


def serve(*command: str, user: str | None = None, env: dict[str, str] | None = None, log: Path) -> None:
    """Start a server that stays in the foreground as a detached process of its own."""
    extra: dict[str, object] = {}
    if user and ROOT_USER:
        extra = {"user": user, "group": user, "extra_groups": []}
    with log.open("ab") as out:
        subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            cwd="/",
            start_new_session=True,
            **extra,  # type: ignore[call-overload]
        )


def folder(name: str, owner: str | None) -> Path:
    """``HOME/name``, owned by ``owner`` (the user a server that refuses root runs as)."""
    HOME.mkdir(parents=True, exist_ok=True)
    HOME.chmod(0o755)  # the servers' users pass through it to their own folders
    path = HOME / name
    path.mkdir(exist_ok=True)
    if owner and ROOT_USER:
        shutil.chown(path, owner, owner)
    path.chmod(0o700)
    return path


# --- how each server is asked whether it answers as the tests use it ---------------------------------


def ask_postgres(port: int) -> str | None:
    """None if user postgres may open database test without a password; else what went wrong.

    The server says "authenticated" before it looks for the database, so the answer is read up to
    "ready for a query" (Z) or an error (E)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            body = b"user\0postgres\0database\0test\0\0"
            s.sendall(struct.pack("!ii", len(body) + 8, 196608) + body)
            stream = s.makefile("rb")
            while True:
                head = stream.read(5)
                if len(head) < 5:
                    return "it does not answer as PostgreSQL does"
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                payload = stream.read(length - 4)
                if kind == b"R" and struct.unpack("!i", payload[:4])[0] != 0:
                    return "it asks user postgres for a password"
                if kind == b"E":
                    found = re.search(rb"M([^\0]*)", payload)
                    return found.group(1).decode(errors="replace") if found else "it refused the connection"
                if kind == b"Z":
                    s.sendall(b"X\0\0\0\4")  # Terminate
                    return None
                if kind not in (b"R", b"S", b"K", b"N"):
                    return "it does not answer as PostgreSQL does"
    except OSError as error:
        return str(error)


def ask_mariadb(port: int) -> str | None:
    client = shutil.which("mariadb") or shutil.which("mysql")
    if client is None:
        return "no mariadb client to ask it with"
    done = subprocess.run(
        [client, "--protocol=TCP", "-h", "127.0.0.1", "-P", str(port), "-u", "root", "--connect-timeout=3",
         "-e", "SELECT 1", "test"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    return None if done.returncode == 0 else (done.stderr.strip() or "it refused root")


def ask_redis(port: int) -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"PING\r\n")
            return None if s.recv(64).startswith(b"+PONG") else "it does not answer as Redis does"
    except OSError as error:
        return str(error)


def ask_rabbitmq(port: int) -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            return None if s.recv(7)[:1] == b"\x01" else "it does not answer as RabbitMQ does"
    except OSError as error:
        return str(error)


def ask_nats(port: int) -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            info = s.recv(4096)
    except OSError as error:
        return str(error)
    if not info.startswith(b"INFO "):
        return "it does not answer as NATS does"
    return None if b'"jetstream":true' in info else "it is a NATS server without JetStream (-js)"


def ask_mosquitto(port: int) -> str | None:
    """An MQTT 5 CONNECT (clean start, a client id of its own): a CONNACK is an MQTT broker."""
    client = b"duetime-services-probe"
    variable = b"\x00\x04MQTT\x05\x02\x00\x0a\x00" + len(client).to_bytes(2, "big") + client
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(b"\x10" + bytes([len(variable)]) + variable)
            answer = s.recv(4)
            s.sendall(b"\xe0\x00")  # DISCONNECT
    except OSError as error:
        return str(error)
    return None if answer[:1] == b"\x20" else "it does not answer as an MQTT broker does"


# --- how a server of the tests' own is started -----------------------------------------------------


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def own_postgres(port: int) -> None:
    bin_dir = postgres_bin()
    assert bin_dir is not None
    data = folder("postgres", "postgres")
    if not (data / "PG_VERSION").exists():
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N", user="postgres")
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {data} -c max_connections=300"
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "server.log"), "-w", "-t", "60",
        "start", user="postgres")  # fmt: skip
    if ask_postgres(port):  # as the machines the suite was written on: users postgres and root, database test
        for sql in (
            "CREATE DATABASE test",
            "CREATE ROLE root SUPERUSER LOGIN",
            "CREATE DATABASE root OWNER root",
        ):
            run(str(bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres",
                "-c", sql, user="postgres")  # fmt: skip


def own_mariadb(port: int) -> None:
    data = folder("mariadb", "mysql")
    user = ["--user=mysql"] if ROOT_USER else []
    if not (data / "mysql").exists():
        run("mariadb-install-db", f"--datadir={data}", "--auth-root-authentication-method=normal",
            "--skip-test-db", *user)  # fmt: skip
    sock = data / "mariadb.sock"
    serve("mariadbd", "--no-defaults", f"--datadir={data}", f"--port={port}", "--bind-address=127.0.0.1",
          f"--socket={sock}", f"--pid-file={data / 'mariadb.pid'}", *user, log=HOME / "mariadb.log")  # fmt: skip
    until(lambda: sock.exists() and answers(port), 60, "MariaDB")
    client = shutil.which("mariadb") or "mysql"
    run(client, f"--socket={sock}", "-u", "root", "-e",
        "CREATE DATABASE IF NOT EXISTS test; CREATE USER IF NOT EXISTS root@'127.0.0.1';"
        " GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;")  # fmt: skip


def own_redis(port: int) -> None:
    data = folder("redis", None)
    run("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--daemonize", "yes", "--dir", str(data), "--logfile", str(data / "redis.log"))  # fmt: skip


def own_rabbitmq(port: int) -> None:
    data = folder("rabbitmq", "rabbitmq")
    (data / "enabled_plugins").write_text("[].\n")
    (data / "rabbitmq.conf").write_text("")
    dist = any_free_port()
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": "duetime-tests@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "RABBITMQ_SERVER_START_ARGS": f"-kernel inet_dist_listen_min {dist} -kernel inet_dist_listen_max {dist}",
        "RABBITMQ_MNESIA_BASE": str(data / "mnesia"),
        "RABBITMQ_LOG_BASE": str(data / "log"),
        "RABBITMQ_PID_FILE": str(data / "pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(data / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(data / "rabbitmq"),
    }
    if ROOT_USER:
        env["HOME"] = str(Path("~rabbitmq").expanduser())
        for path in (data, *data.iterdir()):
            shutil.chown(path, "rabbitmq", "rabbitmq")
    # not `-detached`: the node then outlives only as long as the session that started it
    serve("rabbitmq-server", user="rabbitmq", env=env, log=HOME / "rabbitmq.log")


def own_nats(port: int) -> None:
    data = folder("nats", None)
    serve("nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data), log=HOME / "nats.log")


def own_mosquitto(port: int) -> None:
    folder("mosquitto", None)
    config = HOME / "mosquitto" / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    serve("mosquitto", "-c", str(config), log=HOME / "mosquitto.log")


def until(check: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {seconds:.0f} s (its log: {HOME})")
        time.sleep(0.5)


# --- the table ---------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    variable: str  # the environment variable tests/services.py reads
    port: int
    packages: list[str]
    program: str
    ask: Callable[[int], str | None]
    own: Callable[[int], None]
    #: how the machine's own service starts again (a machine of ours, where it merely stopped)
    system_start: list[str]
    url: Callable[[int], str]
    #: the folder under HOME of a server of duetime's own (made by ``own``)
    own_folder: str
    installed_before: bool = field(default=False)
    #: the port a server of duetime's own had the last time (``HOME/env``), if one ran here
    own_port_before: int | None = field(default=None)


SERVERS = [
    Server("PostgreSQL", "DUETIME_TEST_POSTGRES", 5432, ["postgresql"], "initdb", ask_postgres, own_postgres,
           ["bash", "-c", "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | tail -1) main start"],
           lambda p: f"postgresql://postgres@127.0.0.1:{p}/test", "postgres"),
    Server("MariaDB", "DUETIME_TEST_MARIADB", 3306, ["mariadb-server", "mariadb-client"], "mariadbd", ask_mariadb,
           own_mariadb, ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"],
           lambda p: f"mysql://root@127.0.0.1:{p}/test", "mariadb"),
    Server("Redis", "DUETIME_TEST_REDIS", 6379, ["redis-server"], "redis-server", ask_redis, own_redis,
           ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
            "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"],
           lambda p: f"redis://127.0.0.1:{p}/0", "redis"),
    Server("RabbitMQ", "DUETIME_TEST_RABBITMQ", 5672, ["rabbitmq-server"], "rabbitmq-server", ask_rabbitmq,
           own_rabbitmq, ["rabbitmq-server", "-detached"], lambda p: f"amqp://guest:guest@127.0.0.1:{p}/", "rabbitmq"),
    Server("NATS", "DUETIME_TEST_NATS", 4222, ["nats-server"], "nats-server", ask_nats, own_nats,
           ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/nats-server", "--",
            "-a", "127.0.0.1", "-p", "4222", "-js", "-sd", "/var/lib/nats-server", "-l",
            "/var/log/nats-server.log"],
           lambda p: f"nats://127.0.0.1:{p}", "nats"),
    Server("Mosquitto", "DUETIME_TEST_MQTT", 1883, ["mosquitto"], "mosquitto", ask_mosquitto, own_mosquitto,
           ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mosquitto", "--",
            "-c", "/etc/mosquitto/mosquitto.conf"],
           lambda p: f"mqtt://127.0.0.1:{p}", "mosquitto"),
]  # fmt: skip


def java_17_or_newer() -> bool:
    if shutil.which("java") is None:
        return False
    said = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    found = re.search(r'version "(\d+)', said)
    return bool(found) and int(found.group(1)) >= 17  # type: ignore[union-attr]


#: programs the tests run: (present?, Debian package, what needs it)
PROGRAMS: list[tuple[Callable[[], bool], str, str]] = [
    # the release's own Java (17 on Debian 12, 21 on Debian 13): Spark runs on 17 or newer
    (java_17_or_newer, "default-jre-headless", "Java 17 or newer (the Spark jobs)"),
    (lambda: bool(shutil.which("chromium")), "chromium", "Chromium (the dashboard's browser tests)"),
    (lambda: bool(shutil.which("faketime")), "faketime", "faketime (the tests of a wrong host clock)"),
    (lambda: bool(shutil.which("chattr")), "e2fsprogs", "chattr (the read-only file tests)"),
    (lambda: bool(shutil.which("promtool")), "prometheus", "promtool (the alert rules' tests)"),
    (lambda: bool(shutil.which("systemd-analyze")), "systemd", "systemd-analyze (the service unit's test)"),
    (lambda: bool(shutil.which("ip")), "iproute2", "ip (the tests of separate hosts)"),
    (lambda: bool(shutil.which("ps")), "procps", "ps (the tests of processes)"),
    (lambda: bool(shutil.which("curl")), "curl", "curl (the how-to guides' commands)"),
    (lambda: bool(shutil.which("mosquitto_pub")), "mosquitto-clients", "mosquitto_pub (the MQTT how-to's publisher)"),
    (lambda: bool(shutil.which("openssl")), "openssl", "openssl (the HTTP API's TLS test)"),
    (lambda: bool(shutil.which("nginx")), "nginx", "nginx (the webhooks' TLS test: a receiver behind it)"),
    (lambda: bool(shutil.which("dnsmasq")), "dnsmasq-base", "dnsmasq (the webhooks' test of names a resolver answers)"),
    (lambda: bool(shutil.which("npm")), "npm", "npm and Node (the HTTP API's TypeScript client)"),
]


def can_install() -> bool:
    return ROOT_USER and shutil.which("apt-get") is not None


def apt_install(packages: list[str]) -> None:
    """Install ``packages`` from Debian's packages. A name this release does not have (or a
    package that fails) blocks none of the others: after a refused batch, each is tried alone,
    and each that fails is said in one line."""
    if not packages:
        return
    say(f"installing {' '.join(packages)} (Debian's packages; a few minutes the first time)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Servers installed in a container must not be started by their packages (there is no init
    # to start them, and the tests start their own): policy-rc.d says so while apt runs.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists() and not Path("/run/systemd/system").exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True)

    try:
        updated = apt("update", "-qq")
        if updated.returncode != 0:
            say(
                f"apt-get update failed ({last_line(updated.stderr)}); installing from the package lists there are"
            )
        if apt("install", "-y", "-qq", "--no-install-recommends", *packages).returncode == 0:
            return
        for package in packages:
            alone = apt("install", "-y", "-qq", "--no-install-recommends", package)
            if alone.returncode != 0:
                say(f"could not install {package}: {last_line(alone.stderr)}")
    finally:
        if made_policy:
            policy.unlink()


def last_line(text: str) -> str:
    """The last line apt wrote that says something (its error), for one line of ours."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no reason given"


def previous_env() -> dict[str, str]:
    """What the last run wrote: the tests' own servers keep running between runs."""
    found: dict[str, str] = {}
    env_file = HOME / "env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = value.strip("'")
    return found


def ran_before(server: Server, earlier: dict[str, str]) -> int | None:
    """The port a server of duetime's own had the last time, if one ran here: its data folder is
    there and ``HOME/env`` has its URL."""
    url = earlier.get(server.variable)
    return port_of(url) if url and (HOME / server.own_folder).is_dir() else None


def port_of(url: str) -> int:
    return int(re.search(r":(\d+)(/|$)", url.split("@")[-1]).group(1))  # type: ignore[union-attr]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say what answers and what is missing")
    check = parser.parse_args().check
    earlier = previous_env()
    urls: dict[str, str] = {}
    waiting: list[Server] = []
    for server in SERVERS:
        # where the tests were told to look, where a server of ours ran last, the standard place
        tried = [os.environ.get(server.variable), earlier.get(server.variable), server.url(server.port)]
        found = next((url for url in tried if url and server.ask(port_of(url)) is None), None)
        if found:
            urls[server.variable] = found
            say(f"{server.name} answers at {found}")
        else:
            waiting.append(server)
            server.own_port_before = ran_before(server, earlier)
    missing_programs = [(package, why) for present, package, why in PROGRAMS if not present()]
    for server in waiting:
        server.installed_before = shutil.which(server.program) is not None or bool(
            server.name == "PostgreSQL" and postgres_bin()
        )
    to_install = [p for s in waiting if not s.installed_before for p in s.packages] + [
        package for package, _ in missing_programs
    ]
    if to_install and not check and can_install():
        apt_install(to_install)  # each server or program still missing is said below
        missing_programs = [(package, why) for present, package, why in PROGRAMS if not present()]
    failed = 0
    for server in waiting:
        if check:
            say(f"{server.name} does not answer at {server.url(server.port)}")
            failed += 1
            continue
        present = server.installed_before or shutil.which(server.program) or postgres_bin()
        if not present or (server.name == "PostgreSQL" and not postgres_bin()):
            say(f"{server.name} is not installed, so its tests are skipped: sudo apt-get install "
                f"{' '.join(server.packages)}")  # fmt: skip
            failed += 1
            continue
        try:
            urls[server.variable] = start(server)
            say(f"{server.name} answers at {urls[server.variable]}")
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            say(f"{server.name} could not be started, so its tests are skipped: {error}")
            failed += 1
    for package, why in missing_programs:
        say(f"{why} is not installed: sudo apt-get install {package}")
    if not check:
        HOME.mkdir(parents=True, exist_ok=True)
        (HOME / "env").write_text("".join(f"export {k}='{v}'\n" for k, v in urls.items()))
    return 1 if check and (failed or missing_programs) else 0


def start(server: Server) -> str:
    """Start ``server``; its URL once it answers as the tests use it."""
    standard = server.url(server.port)
    if server.ask(server.port) is None:  # it answers now (asked before its client was installed)
        return standard
    before = server.own_port_before
    if before is not None and free(before):
        # a server of duetime's own ran here: the same again, on its port, with its data (the
        # machine's own would be a second server, on the standard port, that the tests cannot use)
        say(f"starting the {server.name} of duetime's own that ran here before, on port {before}")
        server.own(before)
        until(lambda: server.ask(before) is None, 120, server.name)
        return server.url(before)
    if server.installed_before and free(server.port):
        say(f"{server.name} does not answer on {server.port}; starting the machine's own")
        try:
            run(*server.system_start, timeout=120)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if server.ask(server.port) is None:
                    return standard
                time.sleep(0.5)
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            say(
                f"the machine's own {server.name} did not start ({str(error)[:200]}); starting one of duetime's"
            )
    port = server.port if free(server.port) else any_free_port()
    if port != server.port:
        reason = server.ask(server.port)
        say(f"port {server.port} is held by something the tests cannot use ({reason}); "
            f"a {server.name} of duetime's own on port {port}")  # fmt: skip
    else:
        say(f"starting a {server.name} of duetime's own on port {port} (data in {HOME})")
    server.own(port)
    until(lambda: server.ask(port) is None, 120, server.name)
    return server.url(port)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:  # one line, never a traceback, for a set-up step that failed
        say(f"setting up the servers failed ({type(error).__name__}: {str(error)[:500]}); see {HOME}")
        sys.exit(1)
