"""An SFTP server for the tests: a networked Hadoop filesystem (``sftp://``, whose client ships
in pyspark's Hadoop jars) with nothing to install on the machine.

``python -m tests.bulk.sftp_server ROOT`` serves the folder ROOT to the user ``duetime`` (password
:data:`PASSWORD`) on a free loopback port, which it prints as ``port N`` once it listens. The
Hadoop client is an old JSch, which speaks only SHA-1 key exchange and RSA host keys: the server
offers those beside the current ones. Paths in URLs are relative to ROOT (the server is chrooted),
so a file reaches ROOT only through the protocol, never through a local path that happens to match.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings
from pathlib import Path

import asyncssh

USER = "duetime"
PASSWORD = "sftp-test-password"
#: The one setting a Spark session needs besides the password (Hadoop does not register sftp: itself).
IMPL = "org.apache.hadoop.fs.sftp.SFTPFileSystem"


def spark_conf(host: str = "127.0.0.1") -> dict[str, str]:
    """What a Spark session needs to reach this server: the filesystem class and the password
    (Hadoop reads it from ``fs.sftp.password.<host>.<user>``, keeping it out of the URL)."""
    return {"spark.hadoop.fs.sftp.impl": IMPL, f"spark.hadoop.fs.sftp.password.{host}.{USER}": PASSWORD}


class Sftp:
    """This server, started as a process of its own serving ``root``, torn down by :meth:`stop`
    (and by the kernel if the test process dies first)."""

    def __init__(self, root: Path, work: Path) -> None:
        from tests.bulk.standalone import die_with_parent

        self.root = root
        self.log = work / "sftp.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.bulk.sftp_server", str(root)],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=Path(__file__).parents[2],
                preexec_fn=die_with_parent,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()  # "port N", or nothing if it died
        assert line.startswith("port "), self.log.read_text()
        self.url = f"sftp://{USER}@127.0.0.1:{int(line.split()[1])}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True  # every user must authenticate

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return (username, password) == (USER, PASSWORD)


async def serve(root: str) -> None:
    key = asyncssh.generate_private_key("ssh-rsa", key_size=2048)
    server = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_host_keys=[key],
        server_factory=_Server,
        sftp_factory=lambda channel: asyncssh.SFTPServer(channel, chroot=root.encode()),
        kex_algs=["curve25519-sha256", "diffie-hellman-group14-sha256", "diffie-hellman-group14-sha1"],
    )
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Future()  # until killed


if __name__ == "__main__":
    # JSch's SHA-1 key exchange is what the Hadoop client speaks: no warning on every connection
    warnings.filterwarnings("ignore", message="Diffie-Hellman over finite fields")
    asyncio.run(serve(sys.argv[1]))
