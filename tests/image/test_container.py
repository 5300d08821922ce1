"""The container image, built from ``deploy/Dockerfile`` as it is and run as an operator runs it.

Podman (Debian's, with runc), host networking, the base image of ``scripts/image-base.sh``. The
image runs as its non-root user with a read-only root filesystem and the two writable folders
``deploy/kubernetes.yaml`` mounts (/tmp and the user's home), against this machine's PostgreSQL and
RabbitMQ. Slow (a build installs from PyPI): the second step of CI, ``scripts/test-image.sh``.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import duetime
from tests.conftest import run_cli
from tests.services import RABBITMQ, postgres_schema

#: The first test builds the image (a few minutes: pip installs from PyPI inside it).
pytestmark = [pytest.mark.image, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/duetime-test:latest"
#: runc: crun does not run on these machines' cgroups; the open-files limit: the machine's cap.
PODMAN = ["podman", "--runtime", "runc"]
LIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
CA = "/etc/ssl/certs/ca-certificates.crt"
#: What deploy/kubernetes.yaml mounts writable beside its read-only root filesystem.
WRITABLE = ["--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", "/var/lib/duetime:rw,mode=1777"]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    # the machine's CA bundle, so that pip inside trusts what the machine trusts
    trusted = ["-v", f"{CA}:{CA}:ro"]
    built = subprocess.run(
        [
            *PODMAN,
            "build",
            "--pull=never",
            "--network",
            "host",
            *LIMITS,
            *trusted,
            "-f",
            "deploy/Dockerfile",
            "-t",
            IMAGE,
            ".",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    yield IMAGE
    subprocess.run([*PODMAN, "rmi", "-f", IMAGE], capture_output=True, timeout=120)


def podman_run(
    *args: str, writable: bool = True, env: dict[str, str] | None = None, name: str | None = None
) -> list[str]:
    """``podman run`` of the image as the Kubernetes manifest runs it: read-only, not root."""
    command = [*PODMAN, "run", "--rm", "--network", "host", *LIMITS, "--read-only", "--read-only-tmpfs=false"]
    command += WRITABLE if writable else []
    command += ["--name", name] if name else []
    for key, value in (env or {}).items():
        command += ["-e", f"{key}={value}"]
    return [*command, IMAGE, *args]


def test_the_image_says_its_version_and_runs_as_its_own_user(image: str) -> None:
    version = subprocess.run(podman_run("--version"), capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and duetime.__version__ in version.stdout, version.stdout + version.stderr
    user = subprocess.run(
        [*PODMAN, "run", "--rm", *LIMITS, "--entrypoint", "id", image, "-un"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert user.stdout.strip() == "duetime", user.stdout + user.stderr


def test_the_demo_runs_on_a_read_only_root_with_the_manifests_folders(image: str) -> None:
    done = subprocess.run(
        podman_run("demo", "--messages", "300", "--spread", "2"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all delivered, none early, none doubled" in done.stdout, done.stdout
    # without a writable /tmp: one line saying what to mount, not a traceback
    bare = subprocess.run(podman_run("demo", writable=False), capture_output=True, text=True, timeout=300)
    assert bare.returncode == 1 and "mount a writable volume at /tmp" in bare.stderr, bare.stderr
    assert "Traceback" not in bare.stderr and "bug" not in bare.stderr


def test_run_delivers_from_postgresql_to_rabbitmq_and_stops_on_sigterm(image: str, tmp_path: Path) -> None:
    queue = f"image-{uuid.uuid4().hex[:8]}"
    with postgres_schema() as store:
        env = {"DUETIME_STORE": store, "DUETIME_TRANSPORT": RABBITMQ, "DUETIME_ENDPOINT": "shop"}
        setup = subprocess.run(
            podman_run("setup", "--queue", queue, env=env), capture_output=True, text=True, timeout=300
        )
        assert setup.returncode == 0, setup.stdout + setup.stderr
        name = f"duetime-test-{uuid.uuid4().hex[:8]}"
        with (tmp_path / "run.log").open("w") as log:
            service = subprocess.Popen(
                podman_run("run", env=env, name=name), stdout=log, stderr=subprocess.STDOUT
            )
        try:
            sent = run_cli("schedule", queue, "hello", "--in", "1s", "--endpoint", "shop", env=env)
            assert sent.returncode == 0, sent.stderr
            got = run_cli("queues", "receive", queue, "--count", "1", "--wait", "60", env=env, timeout=90)
            assert got.returncode == 0 and '"body": "hello"' in got.stdout, got.stdout + got.stderr
        finally:
            subprocess.run([*PODMAN, "stop", "-t", "30", name], capture_output=True, timeout=90)
            code = service.wait(timeout=60)
        said = (tmp_path / "run.log").read_text()
        assert code == 0, said
        assert "stopped: forwarded 1" in said and "Traceback" not in said, said
        asyncio.run(_delete(queue))


async def _delete(queue: str) -> None:
    from duetime.backends.rabbitmq.transport import RabbitMqTransport

    transport = RabbitMqTransport(RABBITMQ)
    await transport.start()
    try:
        await transport.delete(queue)
    finally:
        await transport.close()
