"""Who kept the cores busy during a measured step: the database servers, or everything else.

The bulk jobs should scale until the database is the bottleneck, and say which. On a
machine where the servers run beside the job, a ratio alone cannot say that; the CPU each used can.
From /proc (Linux): the machine's busy and disk-wait time, and the CPU of the PostgreSQL and MariaDB
processes, counting backends that ended during the step (their time goes to the postmaster's
children's time when it reaps them, so before/after differences stay right).

    with CpuWatch() as cpu:
        run_the_step()
    print(cpu.usage.line())
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

SERVERS = {"postgres": "PostgreSQL", "mariadbd": "MariaDB", "mysqld": "MariaDB"}
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine() -> tuple[float, float]:
    """Seconds of CPU busy (all cores) and waiting on the disk, since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / TICK, iowait / TICK


def _servers() -> dict[str, float]:
    """Seconds of CPU per database server: its live processes, and their reaped children."""
    used: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        server = SERVERS.get(name)
        if server is None:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        utime, stime, cutime, cstime = (int(v) for v in rest[11:15])
        used[server] = used.get(server, 0.0) + (utime + stime + cutime + cstime) / TICK
    return used


@dataclass
class Usage:
    wall: float
    busy: float
    iowait: float
    servers: dict[str, float]

    def line(self) -> str:
        """E.g. "cores busy 1.86 of 2 (PostgreSQL 1.21, the rest 0.65); waiting on disk 0.10"."""
        wall = max(self.wall, 1e-9)
        parts = [
            f"{name} {seconds / wall:.2f}" for name, seconds in sorted(self.servers.items()) if seconds > 0
        ]
        rest = self.busy - sum(self.servers.values())
        parts.append(f"the rest {max(rest, 0.0) / wall:.2f}")
        return (
            f"cores busy {self.busy / wall:.2f} of {os.cpu_count()} ({', '.join(parts)}); "
            f"waiting on disk {self.iowait / wall:.2f}"
        )


class CpuWatch:
    """A context manager: ``usage`` holds what the step used once it ends."""

    usage: Usage

    def __enter__(self) -> CpuWatch:
        self._start = time.perf_counter()
        self._machine = _machine()
        self._servers = _servers()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        wall = time.perf_counter() - self._start
        busy, iowait = _machine()
        servers = _servers()
        self.usage = Usage(
            wall,
            busy - self._machine[0],
            iowait - self._machine[1],
            {name: seconds - self._servers.get(name, 0.0) for name, seconds in servers.items()},
        )
