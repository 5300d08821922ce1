"""Named SQL queries kept in ``.sql`` files beside each backend (``-- name: query_name``)."""

from __future__ import annotations

import sys
from functools import cache
from importlib import resources


@cache
def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: sql}``; a block runs until the next ``-- name:``.

    Called while one of ``package``'s modules is being imported: the package's module object
    is in ``sys.modules`` by then (maybe half done), and is given as it is. Given by name,
    ``resources`` would import it again, waiting for its lock, while another thread importing
    the package waits for the module this runs in: importlib's deadlock error (30 of 30 times
    when one thread opened a SQLite store and another its queue for the first time)."""
    anchor = sys.modules.get(package) or package
    text = resources.files(anchor).joinpath(filename).read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name, lines = line.removeprefix("-- name:").strip(), []
        elif name is not None and not line.startswith("--"):
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip()
    return queries
