"""Production topologies started by a test on its own ports and directories, and removed after:
PgBouncer in transaction pooling mode, a PostgreSQL primary with a synchronous standby. The
servers the rest of the suite uses (scripts/services.py) are never stopped, restarted or reconfigured.

PostgreSQL's tools and PgBouncer refuse to run as root: they run as ``postgres``, in a directory
of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.services import POSTGRES, free_port, require

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def as_postgres(*command: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command run as the ``postgres`` user (root when the tests already run as someone else)."""
    if os.geteuid() == 0:
        command = ("runuser", "-u", "postgres", "--", *command)
    return subprocess.run(command, capture_output=True, text=True, check=check, timeout=timeout)


@contextmanager
def postgres_folder(prefix: str) -> Iterator[Path]:
    """A directory the ``postgres`` user owns, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        folder.chmod(0o700)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def answers(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for_port(port: int, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not answers(port):
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not answer on port {port} within {seconds} s")
        time.sleep(0.1)


@dataclass
class Bouncer:
    """A PgBouncer in transaction pooling mode in front of a PostgreSQL server."""

    port: int
    folder: Path
    process: subprocess.Popen[bytes]

    def url(self, database_url: str) -> str:
        """``database_url`` (host, port, database, options) pointed at the pooler instead."""
        parts = urlsplit(database_url)
        user = parts.username or "postgres"
        return parts._replace(netloc=f"{user}@127.0.0.1:{self.port}").geturl()

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def pgbouncer(
    server: str = POSTGRES, *, pool_size: int = 10, ignore: str = "", mode: str = "transaction"
) -> Iterator[Bouncer]:
    """Debian's PgBouncer, ``pool_mode = mode``, for every database of ``server``; start-up
    parameters it refuses unless ``ignore`` names them (``ignore_startup_parameters``)."""
    if shutil.which("pgbouncer") is None:
        pytest.fail("pgbouncer is not installed: apt-get install pgbouncer (scripts/test-topologies.sh does)")
    require(server)
    target = urlsplit(server)
    port = free_port()
    with postgres_folder("duetime-pgbouncer-") as folder:
        (folder / "users.txt").write_text('"postgres" ""\n')
        (folder / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={target.hostname} port={target.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 500
ignore_startup_parameters = {ignore}
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
        )
        for name in ("users.txt", "pgbouncer.ini"):
            if os.geteuid() == 0:
                shutil.chown(folder / name, "postgres", "postgres")
        command = ["pgbouncer", str(folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, 15, "pgbouncer")
            yield Bouncer(port, folder, process)
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """End a server this test started (runuser passes the signal on), and wait for it."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class ReplicatedPostgres:
    """A PostgreSQL primary and a synchronous streaming standby of its own (PostgreSQL 15)."""

    folder: Path
    primary_port: int
    standby_port: int

    @property
    def primary(self) -> Path:
        return self.folder / "primary"

    @property
    def standby(self) -> Path:
        return self.folder / "standby"

    def url(self, database: str = "postgres") -> str:
        """Both servers, the writable one chosen by libpq (``target_session_attrs=read-write``)."""
        hosts = f"127.0.0.1:{self.primary_port},127.0.0.1:{self.standby_port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def kill_primary(self) -> None:
        """``kill -9`` of the primary's postmaster: a crash, not a shutdown."""
        pid = int((self.primary / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.standby), "promote", "-w", "-t", "60")

    def stop(self) -> None:
        for data in (self.primary, self.standby):
            if (data / "postmaster.pid").exists():
                as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate", check=False)


def _configure(data: Path, port: int, *lines: str) -> None:
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            "\n".join(
                [
                    f"port = {port}",
                    "listen_addresses = '127.0.0.1'",
                    f"unix_socket_directories = '{data}'",
                    *lines,
                ]
            )
            + "\n"
        )


def _start(data: Path) -> None:
    as_postgres(
        str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "-t", "60", "start"
    )


@contextmanager
def replicated_postgres() -> Iterator[ReplicatedPostgres]:
    """A primary (``initdb``) and a synchronous standby (``pg_basebackup``) on ports of their own:
    every commit the primary acknowledges is on the standby too. The standby's copy of the
    configuration names no standby of its own, or once promoted every commit would wait for ever."""
    with postgres_folder("duetime-pg-pair-") as folder:
        pair = ReplicatedPostgres(folder, free_port(), free_port())
        try:
            as_postgres(
                str(PG_BIN / "initdb"), "-D", str(pair.primary), "-U", "postgres", "--auth=trust", "-N"
            )
            _configure(
                pair.primary,
                pair.primary_port,
                "wal_level = replica",
                "max_wal_senders = 5",
                "synchronous_standby_names = '*'",
                "synchronous_commit = on",
                "shared_buffers = 32MB",
            )
            _start(pair.primary)
            as_postgres(
                str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(pair.primary_port), "-U", "postgres",
                "-D", str(pair.standby), "-R", "-X", "stream",
            )  # fmt: skip
            _configure(pair.standby, pair.standby_port, "synchronous_standby_names = ''")
            _start(pair.standby)
            _until_synchronous(pair)
            yield pair
        finally:
            pair.stop()


def _until_synchronous(pair: ReplicatedPostgres) -> None:
    """Until the primary counts the standby as synchronous (it streams first as "async")."""
    import psycopg

    end = time.monotonic() + 30
    with psycopg.connect(pair.url(), autocommit=True) as conn:
        while conn.execute("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone() is None:
            assert time.monotonic() < end, "the standby never became synchronous"
            time.sleep(0.1)


@dataclass
class RabbitNode:
    name: str  # t1-XXXX@localhost
    port: int
    dist_port: int
    folder: Path

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def pid(self) -> int:
        return int((self.folder / "pid").read_text().strip())

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_SERVER_START_ARGS": (
                f"-kernel inet_dist_listen_min {self.dist_port} -kernel inet_dist_listen_max {self.dist_port}"
            ),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_PID_FILE": str(self.folder / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
            "HOME": "/var/lib/rabbitmq",
        }


@dataclass
class RabbitCluster:
    nodes: list[RabbitNode]

    @property
    def url(self) -> str:
        """Every node in one URL, as duetime takes it."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"amqp://guest:guest@{hosts}/"

    def ctl(self, node: RabbitNode, *args: str, check: bool = True) -> str:
        done = _as_rabbitmq(node, "rabbitmqctl", "-n", node.name, *args)
        if check and done.returncode:
            raise AssertionError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def kill(self, node: RabbitNode) -> None:
        """``kill -9`` of a node's Erlang VM: a crash, not a shutdown."""
        os.kill(node.pid(), signal.SIGKILL)

    def start(self, node: RabbitNode) -> None:
        """Start a killed node again (it rejoins the cluster with its data)."""
        _as_rabbitmq(node, "rabbitmq-server", "-detached")
        self.await_startup(node)

    def await_startup(self, node: RabbitNode) -> None:
        # await_startup fails at once until the node has registered with epmd
        end = time.monotonic() + 90
        while _as_rabbitmq(node, "rabbitmqctl", "-n", node.name, "await_startup").returncode:
            assert time.monotonic() < end, f"RabbitMQ node {node.name} did not start"
            time.sleep(0.5)

    def held(self, node: RabbitNode, prefix: str = "duetime.delay-level-") -> dict[str, tuple[int, str]]:
        """Quorum queues (named ``prefix…``) holding messages that were dead-lettered and not yet
        forwarded (a queue's messages beyond those ready and unacknowledged), with their leader."""
        return {
            name: (total - ready - unacked, leader)
            for name, (total, ready, unacked, leader) in self.queues(node).items()
            if name.startswith(prefix) and total > ready + unacked
        }

    def drain_and_revive(self, node: RabbitNode) -> None:
        """``rabbitmq-upgrade drain`` then ``revive``: the node hands the leadership of its quorum
        queues to others (and closes its clients' connections), then serves again."""
        for step in ("drain", "revive"):
            done = _as_rabbitmq(node, "rabbitmq-upgrade", "-n", node.name, step)
            assert done.returncode == 0, f"rabbitmq-upgrade {step}: {done.stdout}{done.stderr}"

    def queues(self, node: RabbitNode) -> dict[str, tuple[int, int, int, str]]:
        """Each queue's messages, of them ready, of them unacknowledged, and its leader, as a live
        node sees them (a quorum queue's messages also count those dead-lettered but not yet
        forwarded)."""
        out = self.ctl(node, "list_queues", "name", "messages", "messages_ready",
                       "messages_unacknowledged", "leader", "--quiet", "--no-table-headers")  # fmt: skip
        rows = {}
        for line in out.splitlines():
            name, total, ready, unacked, leader = line.split("\t")
            rows[name] = (int(total), int(ready), int(unacked), leader)
        return rows

    def leader_of(self, queue: str) -> RabbitNode:
        for node in self.nodes:
            with contextlib.suppress(AssertionError):
                for line in self.ctl(
                    node, "list_queues", "name", "leader", "--quiet", "--no-table-headers"
                ).splitlines():
                    name, _, leader = line.partition("\t")
                    if name == queue:
                        return next(n for n in self.nodes if n.name == leader.strip())
        raise AssertionError(f"no leader found for {queue}")


def _as_rabbitmq(node: RabbitNode, *command: str) -> subprocess.CompletedProcess[str]:
    """A command as the ``rabbitmq`` user (it owns the Erlang cookie every node shares), with the
    node's environment; not through runuser, whose session end kills a detached node."""
    user = {"user": "rabbitmq", "group": "rabbitmq"} if os.geteuid() == 0 else {}
    return subprocess.run(
        list(command), env=node.env(), cwd=node.folder, capture_output=True, text=True, timeout=120, **user
    )  # type: ignore[call-overload]


@contextmanager
def rabbitmq_cluster(size: int = 3, advanced: str = "[].") -> Iterator[RabbitCluster]:
    """``size`` RabbitMQ nodes of their own (names, ports, data), joined in one cluster; the shared
    broker (``rabbit@…``, port 5672) shares only the Erlang cookie and is never touched."""
    tag = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="duetime-rabbit-"))
    if os.geteuid() == 0:
        shutil.chown(root, "rabbitmq", "rabbitmq")
    nodes = [
        RabbitNode(f"t{i}-{tag}@localhost", free_port(), free_port(), root / f"t{i}") for i in range(size)
    ]
    cluster = RabbitCluster(nodes)
    try:
        for node in nodes:
            node.folder.mkdir()
            (node.folder / "enabled_plugins").write_text("[].\n")
            (node.folder / "rabbitmq.conf").write_text("loopback_users = none\n")
            (node.folder / "advanced.config").write_text(advanced + "\n")
            for path in (node.folder, *node.folder.iterdir()):
                if os.geteuid() == 0:
                    shutil.chown(path, "rabbitmq", "rabbitmq")
            _as_rabbitmq(node, "rabbitmq-server", "-detached")
        for node in nodes:
            cluster.await_startup(node)
        for node in nodes[1:]:
            cluster.ctl(node, "stop_app")
            cluster.ctl(node, "join_cluster", nodes[0].name)
            cluster.ctl(node, "start_app")
        yield cluster
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                os.kill(node.pid(), signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class NatsCluster:
    """NATS servers of their own joined in one JetStream cluster."""

    ports: list[int]
    processes: list[subprocess.Popen[bytes]]

    def url(self, **options: str) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"nats://{hosts}" + (f"?{query}" if query else "")

    def kill(self, name: str) -> None:
        """``kill -9`` of the server named ``name`` (n0, n1, …)."""
        process = self.processes[int(name[1:])]
        process.kill()
        process.wait(10)


@contextmanager
def nats_cluster(size: int = 3) -> Iterator[NatsCluster]:
    """``size`` nats-servers with JetStream (servers n0, n1, …), routed to each other, on ports
    and in folders of their own; ready once the cluster takes a stream with ``size`` replicas."""
    ports, routes = [free_port() for _ in range(size)], [free_port() for _ in range(size)]
    folder = Path(tempfile.mkdtemp(prefix="duetime-nats-"))
    cluster = NatsCluster(ports, [])
    tag = uuid.uuid4().hex[:6]
    try:
        for i in range(size):
            others = ",".join(f"nats://127.0.0.1:{routes[j]}" for j in range(size) if j != i)
            log = (folder / f"n{i}.log").open("wb")
            cluster.processes.append(
                subprocess.Popen(
                    [
                        "nats-server",
                        "-a",
                        "127.0.0.1",
                        "-p",
                        str(ports[i]),
                        "-js",
                        "-sd",
                        str(folder / f"n{i}"),
                        "--server_name",
                        f"n{i}",
                        "--cluster_name",
                        f"duetime-{tag}",
                        "--cluster",
                        f"nats://127.0.0.1:{routes[i]}",
                        "--routes",
                        others,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        for port in ports:
            wait_for_port(port, 20, "nats-server")
        _until_jetstream_cluster(cluster, size)
        yield cluster
    finally:
        for process in cluster.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _until_jetstream_cluster(cluster: NatsCluster, size: int) -> None:
    """Until the servers have elected JetStream's meta leader and take a replicated stream."""
    import asyncio

    import nats

    async def ready() -> bool:
        servers = [f"nats://127.0.0.1:{port}" for port in cluster.ports]
        nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            await js.add_stream(name="DUETIME_READY", subjects=["duetime.ready"], num_replicas=size)
            await js.delete_stream("DUETIME_READY")
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    end = time.monotonic() + 60
    while not asyncio.run(ready()):
        assert time.monotonic() < end, "the NATS cluster never took a replicated stream"
        time.sleep(0.5)


@dataclass
class SentinelRedis:
    """A Redis master with two replicas and three sentinels watching it as ``mymaster``: after a
    failover the new master still has a replica."""

    master_port: int
    replica_ports: list[int]
    sentinel_ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]]

    def url(self, **options: str) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"redis+sentinel://{hosts}/mymaster/0" + (f"?{query}" if query else "")

    def master(self) -> int:
        """The port of the server the sentinels take for the master now."""
        import redis

        for port in self.sentinel_ports:
            with contextlib.suppress(Exception), redis.Redis(port=port, socket_timeout=2) as client:
                return int(client.sentinel_get_master_addr_by_name("mymaster")[1])
        raise AssertionError("no sentinel answered")

    def kill(self, port: int) -> None:
        process = self.processes[port]
        process.kill()
        process.wait(10)


@contextmanager
def sentinel_redis() -> Iterator[SentinelRedis]:
    """Redis servers and sentinels of their own (never the shared Redis), ready once the replica
    has synchronised and every sentinel knows the master and the other two sentinels."""

    master, replicas = free_port(), [free_port(), free_port()]
    sentinels = [free_port() for _ in range(3)]
    folder = Path(tempfile.mkdtemp(prefix="duetime-sentinel-"))
    topology = SentinelRedis(master, replicas, sentinels, {})
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]

    def start(port: int, *command: str) -> None:
        log = (folder / f"{port}.log").open("wb")
        topology.processes[port] = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
        log.close()

    try:
        start(master, "redis-server", "--port", str(master), *common, "--dir", str(folder))
        for replica in replicas:
            (folder / str(replica)).mkdir()
            start(replica, "redis-server", "--port", str(replica), *common, "--dir", str(folder / str(replica)),
                  "--replicaof", "127.0.0.1", str(master))  # fmt: skip
        for port in sentinels:
            conf = folder / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {folder}\n"
                f"sentinel monitor mymaster 127.0.0.1 {master} 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 5000\nsentinel parallel-syncs mymaster 1\n"
            )
            start(port, "redis-sentinel", str(conf))
        for port in [master, *replicas, *sentinels]:
            wait_for_port(port, 15, "redis")
        end = time.monotonic() + 60
        while True:
            try:
                up = all(
                    _answer(p, "info", "replication").get("master_link_status") == "up" for p in replicas
                )
                known = all(
                    int(_answer(p, "sentinel_master", "mymaster").get("num-other-sentinels", 0)) == 2
                    and int(_answer(p, "sentinel_master", "mymaster").get("num-slaves", 0)) == 2
                    for p in sentinels
                )
            except Exception:
                up = known = False
            if up and known:
                break
            assert time.monotonic() < end, "the sentinels never came to know each other and the replica"
            time.sleep(0.2)
        yield topology
    finally:
        for process in topology.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _answer(port: int, command: str, *args: str) -> dict[str, Any]:
    """One command to the Redis or sentinel on ``port``, on a connection closed after it."""
    import redis

    with redis.Redis(port=port, socket_timeout=2) as client:
        answer: dict[str, Any] = getattr(client, command)(*args)
        return answer


@dataclass
class Host:
    """A network namespace standing for a machine of its own: its address, and the address this
    machine has on the link between them (where servers started here can listen for it)."""

    namespace: str
    address: str
    gateway: str
    device: str  # its end of the link, inside the namespace

    def command(self, *args: str) -> list[str]:
        """``args`` run on this host (inside its namespace)."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def cut_off(self) -> None:
        """The host loses the network (its link goes down); the server side sees nothing at all."""
        subprocess.run(self.command("ip", "link", "set", self.device, "down"), check=True, timeout=10)


@contextmanager
def separate_hosts(count: int) -> Iterator[list[Host]]:
    """``count`` hosts, each a network namespace joined to this machine by a link of its own
    (iproute2); removed afterwards."""
    if shutil.which("ip") is None:
        pytest.fail("iproute2 is not installed: apt-get install iproute2")
    tag = uuid.uuid4().hex[:5]
    net = 100 + int(tag, 16) % 150  # 10.<net>.<host>.0/24: another test's links do not collide
    hosts: list[Host] = []
    try:
        for i in range(1, count + 1):
            namespace, outer, inner = f"duetime-{tag}-{i}", f"dth{tag}{i}", f"dtn{tag}{i}"
            host = Host(namespace, f"10.{net}.{i}.2", f"10.{net}.{i}.1", inner)
            hosts.append(host)
            for step in (
                ["ip", "netns", "add", namespace],
                ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
                ["ip", "link", "set", inner, "netns", namespace],
                ["ip", "addr", "add", f"{host.gateway}/24", "dev", outer],
                ["ip", "link", "set", outer, "up"],
                host.command("ip", "addr", "add", f"{host.address}/24", "dev", inner),
                host.command("ip", "link", "set", inner, "up"),
                host.command("ip", "link", "set", "lo", "up"),
            ):
                subprocess.run(step, check=True, capture_output=True, timeout=10)
        yield hosts
    finally:
        for i, host in enumerate(hosts, 1):
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "del", f"dth{tag}{i}"], capture_output=True, timeout=10)


@contextmanager
def postgres_server(*addresses: str) -> Iterator[int]:
    """A PostgreSQL server of its own (``initdb``) listening on ``addresses`` too, trusting every
    client; its port."""
    with postgres_folder("duetime-pg-") as folder:
        data, port = folder / "data", free_port()
        as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N")
        listen = ",".join(["127.0.0.1", *addresses])
        _configure(data, port, "shared_buffers = 32MB")
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '{listen}'\n")
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")
        _start(data)
        try:
            yield port
        finally:
            as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate", check=False)
