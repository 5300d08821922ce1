"""MariaDB at-least-once claims: does a second and a fourth claimer add to the drain?

    .venv/bin/python -m bench.mariadb_claims_bench                 # 20,000 due messages, 2 rounds
    .venv/bin/python -m bench.mariadb_claims_bench --messages 50000 --batch 200

Each round fills a fresh store table with ``--messages`` messages, all due (a backlog: the case
where MariaDB's optimizer would rather scan the table than read the due-time index), then drains
it with 1, 2 and 4 claimers, each a thread with its own connection doing what a dispatcher does
with the store: claim a batch (``fetch_due``), then delete it (``remove_many``). No transport: the
figure is the store's share. Prints messages/s and each count's ratio to one claimer in the same
round, and how many claims came back empty while messages were left (a claimer locked out).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository's root, for `bench` and `tests` (last:
    # a PYTHONPATH given, as before_after.py gives an earlier revision's, picks the duetime measured)
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from duetime import DelayedMessage, TransactionMode
from duetime.backends.mysql import SyncMysqlStore
from tests.services import mariadb_database


def fill(url: str, endpoint: str, count: int) -> None:
    store = SyncMysqlStore.from_url(url)
    store.setup_infrastructure(endpoint)
    store.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)
    due = datetime.now(UTC) - timedelta(seconds=1)
    for start in range(0, count, 5000):
        store.store_many(
            [
                DelayedMessage(f"m{i:07d}", "orders", due, b"x" * 200)
                for i in range(start, min(count, start + 5000))
            ]
        )
    store.close()


def drain(url: str, endpoint: str, claimers: int, batch: int) -> tuple[float, int, int]:
    """Seconds to drain the table with ``claimers`` threads; messages taken; empty claims."""
    taken, empty = [0] * claimers, [0] * claimers
    stores = [SyncMysqlStore.from_url(url) for _ in range(claimers)]
    for s in stores:
        s.initialize(endpoint, TransactionMode.AT_LEAST_ONCE)

    def work(slot: int) -> None:
        s = stores[slot]
        while True:
            got = s.fetch_due(datetime.now(UTC), batch)
            if not got:
                if not s._fetch(s.q["next_unclaimed"]):
                    return  # every message is taken (the others delete what they hold)
                empty[slot] += 1  # unclaimed messages are there, but this claim found none
                continue
            s.remove_many([m.message_id for m in got])
            taken[slot] += len(got)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(claimers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    for s in stores:
        s.close()
    return took, sum(taken), sum(empty)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with mariadb_database() as url:  # a database of its own, dropped afterwards
        for r in range(args.rounds):
            rates: dict[int, float] = {}
            for claimers in (1, 2, 4):
                endpoint = f"bench{r}c{claimers}"
                fill(url, endpoint, args.messages)
                took, taken, empty = drain(url, endpoint, claimers, args.batch)
                assert taken == args.messages, (taken, args.messages)
                rates[claimers] = taken / took
                print(
                    f"round {r + 1}: {claimers} claimer(s): {rates[claimers]:8,.0f} msg/s "
                    f"({rates[claimers] / rates[1]:.2f}x one claimer), {empty} empty claims",
                    flush=True,
                )


if __name__ == "__main__":
    main()
