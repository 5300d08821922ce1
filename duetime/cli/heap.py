"""The garbage collector set for a long-running command that allocates much and keeps little.

CPython collects its youngest generation every 700 new container objects, and every tenth of those
collections looks at the middle one. A server answering a request makes hundreds of such objects
(FastAPI's dependencies, pydantic's models, asyncio's handles, the store's rows) and keeps almost
none, so it collected every few requests, and the older collections walked everything start-up
made (the modules, the routes, pydantic's schemas), which lives as long as the process anyway.
Measured on ``duetime serve`` (``bench/http_api_bench.py``): 16 clients' p99 fell from about 60 ms
to 14-19 ms, and the CPU a request by a fifth; on ``duetime run`` draining a burst of 20,000 to a
webhook (``bench/webhooks_bench.py``): 3,047 and 2,638 a second before, 3,562 and 3,031 after, in
alternate runs (at a steady 250 a second it made no difference beyond the noise).

Only a command that owns its process calls this (``duetime serve``, ``duetime run``): a program
embedding duetime keeps its own collector settings.
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
