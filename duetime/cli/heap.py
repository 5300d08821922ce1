"""The garbage collector set for a long-running command that allocates much and keeps little.

CPython collects its youngest generation every 700 new container objects, and every tenth of those
collections looks at the middle one. A server answering a request makes hundreds of such objects
(FastAPI's dependencies, pydantic's models, asyncio's handles, the store's rows) and keeps almost
none, so it collected every few requests, and the older collections walked everything start-up
made (the modules, the routes, pydantic's schemas), which lives as long as the process anyway.
Measured on ``duetime serve`` (``bench/http_api_bench.py``): 16 clients' p99 fell from about 60 ms
to 14-19 ms, and the CPU a request by a fifth.

Only a command that owns its process calls this (``duetime serve``): a program embedding duetime
keeps its own collector settings. ``duetime run`` does not: its steady work allocates little, and
side by side (``bench/rate_cost_bench.py``, 250 a second) it made no difference beyond the noise.
"""

from __future__ import annotations

import gc

#: New container objects between two collections of the youngest generation (CPython: 700).
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once start-up is done: what is alive now moves to a generation that is never collected
    (``gc.freeze``), and the youngest generation is collected every :data:`YOUNG_THRESHOLD` new
    objects. Cycles made later are still collected; the soak benchmark keeps the memory flat."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
