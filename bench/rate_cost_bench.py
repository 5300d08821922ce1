"""The CPU a delivered message costs, and how late it arrives, at steady rates: duetime's paths
beside Dramatiq's and Celery's own delayed messages, in one run.

    .venv/bin/python bench/rate_cost_bench.py                         # every path, every rate
    .venv/bin/python bench/rate_cost_bench.py --rates 250 --only sqlite,dramatiq
    .venv/bin/python bench/rate_cost_bench.py --plot docs/cost-per-rate.png
    .venv/bin/python bench/rate_cost_bench.py --rates 250 --only sqlite --profile /tmp/prof  # py-spy
    .venv/bin/python bench/rate_cost_bench.py --burst 20000           # all due at once instead
    .venv/bin/python bench/rate_cost_bench.py --rates 250 --budgets 1ms,5ms,20ms,50ms

Per rate (messages a second) and path, messages are due uniformly over a window (20 s; 10 s at
1,000/s and more, 5 s at 10,000/s), sent before the window opens:

- **duetime** (``sqlite``: SQLite exactly-once into its own queue; ``pg-queue``: PostgreSQL
  exactly-once into its queue tables; ``rabbitmq``: PostgreSQL at-least-once into RabbitMQ;
  ``redis``: Redis at-least-once into a Redis stream): the messages are stored, ``duetime run``
  delivers them and a consumer process receives them. **dispatcher CPU** is ``duetime run``'s;
  **with consumer** adds the consumer's (the process that stands where a peer's worker runs the
  task).
- **dramatiq** (RabbitMQ; ``send_with_options(delay=…)``) and **celery** (RabbitMQ; ``eta=…``,
  ``worker_prefetch_multiplier=0`` so that the worker can take every ETA task it must hold): their
  own workers hold the delayed messages and run a task that writes the time. Their CPU is the
  worker's whole process tree; it both delivers and consumes, so compare it with "with consumer".

CPU is read from /proc from the first send to the last arrival (what each process spent taking
the messages in, holding them and handing them on; the producer's own cost is left out for every
path). Lateness is the arrival (or the task's start) minus the due time. The baseline of the
ratio column is Dramatiq's CPU per message at the same rate.

``--burst N`` sends ``N`` messages due at one instant instead of the rates: the latest arrival
("max") is then the time the burst took to drain.

``--budgets 1ms,10ms,50ms`` runs each duetime path once for each lateness budget
(``DUETIME_LATENESS_BUDGET``: how late the dispatcher may wake so that one round takes every
message due by then), to show what a few milliseconds of punctuality buy in CPU.
``--windows 0,50ms`` runs each once for each claim window (``DUETIME_CLAIM_WINDOW``: how far ahead
an at-least-once dispatcher claims, to send each message from memory at its due time); with both,
each pair.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` (last: a
    # PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import duetime
from bench.lateness import CONSUMER, python
from duetime import DelayedMessage

POSTGRES = os.environ.get("DUETIME_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ = os.environ.get("DUETIME_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
REDIS = os.environ.get("DUETIME_TEST_REDIS", "redis://127.0.0.1:6379/0")
TICK = os.sysconf("SC_CLK_TCK")
#: py-spy samples only the thread holding the GIL: Python's own CPU, not its waits (a thread
#: blocked on a queue or in epoll reads as busy to py-spy on this kernel).
SPY_OPTIONS = ("--gil",)
DUETIME_PATHS = ("sqlite", "pg-queue", "rabbitmq", "redis")
PEERS = ("dramatiq", "celery")

DRAMATIQ_APP = """
import os, time
import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
dramatiq.set_broker(RabbitmqBroker(url=os.environ["B_BROKER"]))
log = open(os.environ["B_LOG"], "a", buffering=1)

@dramatiq.actor(queue_name=os.environ["B_QUEUE"], max_retries=0)
def late(due):
    log.write(f"{due} {time.time()}\\n")
"""

CELERY_APP = """
import os, time
from celery import Celery
app = Celery("ratebench", broker=os.environ["B_BROKER"])
app.conf.update(task_default_queue=os.environ["B_QUEUE"], task_ignore_result=True,
                worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                worker_prefetch_multiplier=0)
log = open(os.environ["B_LOG"], "a", buffering=1)

@app.task(name="late")
def late(due):
    log.write(f"{due} {time.time()}\\n")
"""


def window(rate: int) -> float:
    """Seconds over which the messages are due: long enough to be steady, short enough to run."""
    return 20.0 if rate < 1000 else 10.0 if rate < 10_000 else 5.0


def cpu_of_session(sid: int) -> float:
    """CPU seconds of every live process in session ``sid`` (a worker and its pool)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


@dataclass
class Result:
    path: str
    rate: int
    count: int
    cpu: float  # the delivering process(es)
    consumer_cpu: float | None  # duetime's consumer; None for a peer (its worker is both)
    late_ms: list[float]
    budget: str | None = None  # the settings the dispatcher was given ("budget 1ms"); None: defaults

    @property
    def label(self) -> str:
        return f"{self.path} ({self.budget})" if self.budget else self.path

    def p(self, q: float) -> float:
        ordered = sorted(self.late_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def per_message_ms(self) -> float:
        return (self.cpu + (self.consumer_cpu or 0.0)) * 1000 / self.count


def due_times(rate: int, burst: int) -> list[float]:
    """Epoch seconds, ``rate`` a second over the window, or ``burst`` of them at one instant (when
    ``burst`` is not 0); the first far enough ahead that every message is sent before it."""
    count = burst or int(rate * window(rate))
    first = time.time() + lead_for(count)
    return [first] * burst if burst else [first + i / rate for i in range(count)]


def lead_for(count: int) -> float:
    """Seconds for sending ``count`` messages before the first is due (Celery's and Dramatiq's
    publishes with confirms: ~1,500 a second at worst here)."""
    return 3.0 + count / 1500


def wait_lines(path: Path, count: int, seconds: float) -> list[tuple[float, float]]:
    """(due, arrived) pairs once ``count`` lines are there (whole lines only)."""
    deadline = time.time() + seconds
    pairs: list[tuple[float, float]] = []
    while time.time() < deadline:
        text = path.read_text()
        lines = text[: text.rfind("\n") + 1].splitlines()
        if len(lines) >= count:
            pairs = [(float(a), float(b)) for a, b in (line.split()[-2:] for line in lines)]
            return pairs
        time.sleep(0.1)
    raise SystemExit(f"{path.name}: only {len(path.read_text().splitlines())} of {count} arrived in time")


def spawn(command: list[str], folder: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = open(folder / "processes.log", "ab")  # noqa: SIM115  # closed with the process
    return subprocess.Popen(
        command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def duetime_path(name: str, folder: Path) -> Iterator[tuple[str, str | None, str]]:
    """(store URL, transport URL or None, queue) for a path; removed after."""
    tag = uuid.uuid4().hex[:8]
    schema, queue = f"bench_{tag}", f"bench_rate_{tag}"
    try:
        if name == "sqlite":
            yield f"sqlite:///{folder / f'{tag}.db'}", None, "orders"
        elif name == "pg-queue":
            yield f"{POSTGRES}?schema={schema}", None, "orders"
        elif name == "rabbitmq":
            yield f"{POSTGRES}?schema={schema}", RABBITMQ, queue
        else:
            yield f"{REDIS}?prefix={schema}:", REDIS, queue
    finally:
        if name in ("pg-queue", "rabbitmq"):
            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        if name == "rabbitmq":
            delete_rabbitmq_queue(queue)
        if name == "redis":
            import redis

            client = redis.Redis.from_url(REDIS)
            for key in client.scan_iter(f"{schema}*"):
                client.delete(key)
            for key in client.scan_iter(f"*{queue}*"):
                client.delete(key)


def run_duetime(
    name: str,
    rate: int,
    folder: Path,
    profile: Path | None = None,
    burst: int = 0,
    budget: str | None = None,
    claim_window: str | None = None,
) -> Result:
    out = folder / f"{name}-{rate}-{budget}-{claim_window}.arrivals"
    out.write_text("")
    with duetime_path(name, folder) as (store, transport, queue):
        args = ["--store", store, "--endpoint", "ratebench"] + (
            ["--transport", transport] if transport else []
        )
        subprocess.run(
            [sys.executable, "-P", "-m", "duetime", "setup", *args], check=True, capture_output=True
        )
        consumer = python(
            CONSUMER, transport or store, queue, str(out), stderr=subprocess.PIPE, start_new_session=True
        )
        assert consumer.stderr is not None
        consumer.stderr.readline()  # ready
        given = {"DUETIME_LATENESS_BUDGET": budget, "DUETIME_CLAIM_WINDOW": claim_window}
        env = {**os.environ, **{k: v for k, v in given.items() if v}} if budget or claim_window else None
        dispatcher = spawn([sys.executable, "-P", "-m", "duetime", "run", *args], folder, env)
        try:
            time.sleep(3.0)  # started and idle
            dues = due_times(rate, burst)
            before = cpu_of_session(dispatcher.pid), cpu_of_session(consumer.pid)
            spies = []
            if profile is not None:  # py-spy's samples of the dispatcher and the consumer
                profile.mkdir(parents=True, exist_ok=True)
                for role, pid in (("dispatcher", dispatcher.pid), ("consumer", consumer.pid)):
                    spies.append(subprocess.Popen(
                        ["py-spy", "record", "--format", "raw", "-o", str(profile / f"{name}-{rate}-{role}.txt"),
                         "-p", str(pid), "-d", str(int(lead_for(len(dues)) + window(rate) + 2)), "-r", "250",
                         *SPY_OPTIONS],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    ))  # fmt: skip
            messages = [
                DelayedMessage(f"m{i}", queue, datetime.fromtimestamp(due, UTC), body=b"x" * 100)
                for i, due in enumerate(dues)
            ]
            with duetime.connect_sync(store, endpoint="ratebench") as client:
                client.schedule_many(messages)
            if time.time() > dues[0]:
                raise SystemExit(f"{name} at {rate}/s: storing outlasted the lead; raise lead_for")
            pairs = wait_lines(out, len(dues), window(rate) + 60)
            after = cpu_of_session(dispatcher.pid), cpu_of_session(consumer.pid)
            for spy in spies:
                spy.wait()
        finally:
            end(dispatcher)
            end(consumer)
    return Result(
        name,
        rate,
        len(dues),
        after[0] - before[0],
        after[1] - before[1],
        [(b - a) * 1000 for a, b in pairs],
        budget,
    )


def run_peer(name: str, rate: int, folder: Path, burst: int = 0) -> Result:
    queue = f"bench_rate_{uuid.uuid4().hex[:8]}"
    module = f"rateapp_{queue}"
    (folder / f"{module}.py").write_text(DRAMATIQ_APP if name == "dramatiq" else CELERY_APP)
    log = folder / f"{queue}.log"
    log.write_text("")
    broker = RABBITMQ if name == "dramatiq" else RABBITMQ.rstrip("/") + "//"
    env = {**os.environ, "PYTHONPATH": str(folder), "B_BROKER": broker, "B_QUEUE": queue, "B_LOG": str(log)}
    command = (
        [sys.executable, "-m", "dramatiq", module, "-Q", queue]
        if name == "dramatiq"
        else [sys.executable, "-m", "celery", "-A", module, "worker", "-Q", queue, "-l", "WARNING",
              "--without-heartbeat", "--without-mingle", "--without-gossip"]
    )  # fmt: skip
    os.environ.update({k: v for k, v in env.items() if k.startswith("B_")})
    sys.path.insert(0, str(folder))
    app = __import__(module)
    worker = spawn(command, folder, env)
    try:
        time.sleep(5.0)  # started and idle
        dues = due_times(rate, burst)
        before = cpu_of_session(worker.pid)
        send: Callable[[float], object]
        if name == "dramatiq":
            send = lambda due: app.late.send_with_options(args=(due,), delay=int((due - time.time()) * 1000))  # noqa: E731
        else:
            send = lambda due: app.late.apply_async((due,), eta=datetime.fromtimestamp(due, UTC))  # noqa: E731
        for due in dues:
            send(due)
        if time.time() > dues[0]:
            raise SystemExit(f"{name} at {rate}/s: sending outlasted the lead; raise lead_for")
        pairs = wait_lines(log, len(dues), window(rate) + 120)
        after = cpu_of_session(worker.pid)
    finally:
        end(worker)
        sys.path.remove(str(folder))
        delete_rabbitmq_queue(queue, f"{queue}.DQ", f"{queue}.XQ")
    return Result(name, rate, len(dues), after - before, None, [(b - a) * 1000 for a, b in pairs])


def delete_rabbitmq_queue(*queues: str) -> None:
    from kombu import Connection

    with Connection(RABBITMQ.rstrip("/") + "//") as conn:
        channel = conn.channel()
        for queue in queues:
            channel.queue_delete(queue)


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost, late) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r.path for r in results):
        rows = sorted((r for r in results if r.path == name), key=lambda r: r.rate)
        rates = [r.rate for r in rows]
        cost.plot(rates, [r.per_message_ms for r in rows], marker="o", label=name)
        late.plot(rates, [r.p(0.99) for r in rows], marker="o", label=name)
    cost.set_ylabel("CPU per message, ms (with the consumer)")
    late.set_ylabel("lateness p99, ms")
    for axis in (cost, late):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("messages due a second")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=8)
    fig.suptitle("The cost of a delivered message against the rate (2 cores, one machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_budgets(results: list[Result], path: Path) -> None:
    """CPU a message against lateness p99, a point per budget, a line per path: what each
    millisecond of punctuality costs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4.8))
    for peer in (r for r in results if r.path in PEERS):  # a point each, and its CPU as a line
        axis.axhline(peer.per_message_ms, linestyle="--", color="grey", linewidth=1)
        axis.plot([peer.p(0.99)], [peer.per_message_ms], marker="s", color="black", linestyle="none")
        axis.annotate(peer.path, (peer.p(0.99), peer.per_message_ms), textcoords="offset points",
                      xytext=(5, -10), fontsize=8, color="black")  # fmt: skip
    paths = [name for name in dict.fromkeys(r.path for r in results) if name not in PEERS]
    for name in paths:
        rows = [r for r in results if r.path == name]
        line = axis.plot([r.p(0.99) for r in rows], [r.per_message_ms for r in rows], marker="o", label=name)
        for r in rows if name == paths[0] else ():  # the budgets once: every line's points go in turn
            if r.budget:
                axis.annotate(r.budget, (r.p(0.99), r.per_message_ms), textcoords="offset points",
                              xytext=(4, 4), fontsize=7, color=line[0].get_color())  # fmt: skip
    axis.set_xscale("log")
    axis.set_xlabel("lateness p99, ms (the points of each line, left to right: its lateness budgets)")
    axis.set_ylabel("CPU per message, ms (with the consumer)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    rate = results[0].rate
    fig.suptitle(f"Punctuality against CPU at {rate:,} messages a second (2 cores, one machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,100,250,1000,10000", help="messages a second, comma-separated")
    parser.add_argument("--only", default=",".join(PEERS + DUETIME_PATHS), help="paths, comma-separated")
    parser.add_argument(
        "--plot", type=Path, help="draw the curves into this PNG (with --budgets: CPU against lateness)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample each duetime dispatcher and its consumer with py-spy into this folder (collapsed stacks; pip install py-spy)",
    )
    parser.add_argument(
        "--burst", type=int, default=0, help="send this many due at one instant instead of the rates"
    )
    parser.add_argument(
        "--budgets",
        default="",
        help="run each duetime path once per lateness budget, comma-separated (1ms,10ms); "
        "empty: the dispatcher's default",
    )
    parser.add_argument(
        "--windows",
        default="",
        help="run each duetime path once per claim window, comma-separated (0,50ms); empty: the default",
    )
    args = parser.parse_args()
    budgets: list[str | None] = [b.strip() for b in args.budgets.split(",") if b.strip()] or [None]
    windows: list[str | None] = [w.strip() for w in args.windows.split(",") if w.strip()] or [None]
    rates = [0] if args.burst else [int(r) for r in args.rates.split(",")]
    only = args.only.split(",")
    if unknown := set(only) - set(PEERS + DUETIME_PATHS):
        parser.error(f"--only takes {', '.join(PEERS + DUETIME_PATHS)}, not {', '.join(sorted(unknown))}")
    print(
        "| rate/s | path | messages | CPU per message, ms (delivering) | with consumer | x Dramatiq | lateness p50 | p99 | max |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as folder:
        for rate in rates:
            baseline: float | None = None
            runs = list(
                dict.fromkeys(
                    (name, None, None) if name in PEERS else (name, b, w)
                    for name in only
                    for b in budgets
                    for w in windows
                )
            )
            for name, budget, window in runs:
                result = (
                    run_peer(name, rate, Path(folder), args.burst)
                    if name in PEERS
                    else run_duetime(name, rate, Path(folder), args.profile, args.burst, budget, window)
                )
                given = [f"budget {budget}" if budget else "", f"window {window}" if window else ""]
                result.budget = ", ".join(g for g in given if g) or None
                results.append(result)
                if name == "dramatiq":
                    baseline = result.per_message_ms
                ratio = f"{result.per_message_ms / baseline:.2f}x" if baseline else ""
                alone = result.cpu * 1000 / result.count
                label = f"burst of {args.burst:,}" if args.burst else f"{rate:,}"
                print(
                    f"| {label} | {result.label} | {result.count:,} | {alone:.3f} | {result.per_message_ms:.3f} | {ratio} "
                    f"| {statistics.median(result.late_ms):.1f} | {result.p(0.99):.1f} | {max(result.late_ms):.1f} |",
                    flush=True,
                )
    if args.plot and not args.burst:
        (plot_budgets if budgets != [None] or windows != [None] else plot)(results, args.plot)
        print(f"curves drawn in {args.plot}")


if __name__ == "__main__":
    main()
