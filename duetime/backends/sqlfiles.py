"""Named SQL queries kept in ``.sql`` files beside each backend (``-- name: query_name``)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """Split a ``.sql`` file into ``{name: sql}``; a block runs until the next ``-- name:``."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
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
