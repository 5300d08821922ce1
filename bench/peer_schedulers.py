"""The peers' schedulers as bench/recurring_peers_bench.py runs them, one process each.

    python -m bench.peer_schedulers apscheduler    # an APScheduler 3 BlockingScheduler
    celery -A bench.peer_schedulers beat -s FILE   # Celery beat

Both are configured as their documentation shows, with their defaults: APScheduler keeps its jobs
in a ``SQLAlchemyJobStore`` on PostgreSQL (the table ``PEER_TABLE``); Celery beat keeps its last
run times in its own shelve file and publishes to RabbitMQ (``PEER_QUEUE``). Each tick of
APScheduler's appends ``<schedule> <unix time>`` to the file ``PEER_TICKS``; beat's ticks are the
task messages the bench consumes.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from celery import Celery

COUNT = int(os.environ.get("PEER_SCHEDULES", "1000"))
EVERY = float(os.environ.get("PEER_EVERY", "5"))
SQLALCHEMY_URL = os.environ.get("PEER_SQLALCHEMY", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TABLE = os.environ.get("PEER_TABLE", "duetime_bench_apscheduler_jobs")

app = Celery("peers", broker=os.environ.get("PEER_AMQP", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.task_default_queue = os.environ.get("PEER_QUEUE", "duetime-bench-beat")
app.conf.beat_schedule = {
    f"s{i}": {"task": "bench.tick", "schedule": timedelta(seconds=EVERY), "args": (i,)} for i in range(COUNT)
}


def tick(schedule: int) -> None:
    """An APScheduler job: one line per run (O_APPEND keeps lines whole across threads)."""
    with open(os.environ["PEER_TICKS"], "a") as out:
        out.write(f"s{schedule} {time.time():.6f}\n")


def job_store() -> object:
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    return SQLAlchemyJobStore(url=SQLALCHEMY_URL, tablename=TABLE)


def add_jobs() -> None:
    """The jobs, written to the store once (a scheduler started paused, as the docs suggest)."""
    from apscheduler.schedulers.background import BackgroundScheduler

    scheduler = BackgroundScheduler(jobstores={"default": job_store()})
    scheduler.start(paused=True)
    scheduler.remove_all_jobs()
    for i in range(COUNT):
        scheduler.add_job(
            "bench.peer_schedulers:tick",
            "interval",
            seconds=EVERY,
            args=(i,),
            id=f"s{i}",
            replace_existing=True,
        )
    scheduler.shutdown()


def run_apscheduler() -> None:
    from apscheduler.schedulers.blocking import BlockingScheduler

    BlockingScheduler(jobstores={"default": job_store()}).start()


if __name__ == "__main__":
    {"apscheduler": run_apscheduler, "add-jobs": add_jobs}[sys.argv[1]]()
