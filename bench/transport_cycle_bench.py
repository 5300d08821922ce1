"""The CPU a transport's send and receive of one message cost this process, one message at a
time as at a moderate rate (a dispatcher's batch of one, a consumer's receive of one with the last
acknowledged in it), on any transport URL. Run it with an earlier revision's ``PYTHONPATH`` for
the before of a change, alternately, in the same hour:

    .venv/bin/python bench/transport_cycle_bench.py redis://127.0.0.1:6379/0
    PYTHONPATH=/tmp/before .venv/bin/python bench/transport_cycle_bench.py redis://127.0.0.1:6379/0
    .venv/bin/python bench/transport_cycle_bench.py amqp://guest:guest@127.0.0.1:5672/ --cycles 5000

CPU is this process's (``time.process_time``: the client's work and its kernel calls, not the
server's), the median of ``--rounds`` rounds of ``--cycles`` cycles, in microseconds a message.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import duetime
from duetime import DelayedMessage, open_transport


async def one_round(url: str, cycles: int) -> tuple[float, float]:
    transport: Any = open_transport(url)
    await transport.start()
    queue = f"cycle_{uuid.uuid4().hex[:8]}"
    await transport.declare(queue)
    messages = [DelayedMessage.create(queue, b"x" * 100, delay=0, message_id=f"m{i}") for i in range(cycles)]
    done: list[Any] = []
    sending = receiving = 0.0
    try:
        for message in messages:
            started = time.process_time()
            await transport.send_batch([message])
            sent = time.process_time()
            done = await transport.receive(queue, 500, 0.5, done=done)
            receiving += time.process_time() - sent
            sending += sent - started
        await transport.acknowledge(done)
    finally:
        if hasattr(transport, "delete"):
            await transport.delete(queue)
        elif hasattr(transport, "redis"):  # the Redis transport has no delete: its keys by hand
            await transport.redis.delete(transport.key(queue))
            await transport.redis.srem(f"{transport.prefix}queues", queue)
        await transport.close()
    return sending / cycles * 1e6, receiving / cycles * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="a transport URL, as duetime run --transport takes it")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = [asyncio.run(one_round(args.url, args.cycles)) for _ in range(args.rounds)]
    send = statistics.median(r[0] for r in rounds)
    receive = statistics.median(r[1] for r in rounds)
    print(f"duetime {duetime.__version__} from {duetime.__file__}")
    print(
        f"send of one message: {send:.0f} us; receive of one (the last acknowledged in it): {receive:.0f} us"
    )


if __name__ == "__main__":
    main()
