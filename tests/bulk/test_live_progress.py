"""A bulk job's rows are counted while its tasks run, not only as each ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from duetime.bulk.progress import RowCounter, watched


def test_rows_are_counted_while_a_long_task_runs(spark: Any) -> None:
    """A job of a few large tasks sat at "0 of 200,000" most of its time: Spark brings an
    accumulator back only when a task ends. One task of ten slow rows is seen part way."""
    counter = RowCounter(spark)
    counter.total = 10

    def slow(rows: Iterator[int]) -> Iterator[int]:
        for row in range(10):
            counter.add(1)
            time.sleep(0.3)
            yield row

    seen: list[int] = []
    counted = watched(
        lambda: spark.sparkContext.parallelize([0], 1).mapPartitions(slow).count(),
        lambda: seen.append(counter.done),
    )
    assert counted == 10 and counter.done == 10
    assert any(0 < done < 10 for done in seen), seen
    assert seen == sorted(seen), "the figure never goes back"
