"""The SQLite store's bulk writes: whole batches of rows into one endpoint's table, inside the
caller's transaction (a bulk job's ledger row commits with them).

The only writer of a SQLite store table besides the store itself. A row here is the store's:
``(id, destination, due µs since 1970, headers JSON text, body, failure count, group)``.
:func:`source_rows` is the other side of a migration: taking rows out of the table it
reads (a store's, or another layout's) and putting them back if the job aborts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from duetime.backends.source_rows import SourceRows
from duetime.backends.sqlite.connection import QUERIES
from duetime.inputs.identifiers import quote_identifier

#: Ids a look-up: well under SQLite's 32,766 parameters.
IDS_A_LOOK = 500


class SqliteBulkRows:
    """One endpoint's table (``table``, unquoted) of a SQLite store, written a batch at a time.
    SQLite's dispatchers notice new rows themselves, and there is no COPY: rows go in by
    :meth:`insert_new`."""

    #: No COPY straight into the table.
    copies = False
    copy_types: tuple[str, ...] = ()

    def __init__(self, table: str) -> None:
        quoted = quote_identifier(table)
        self.existing = QUERIES["bulk_existing_ids"].format(table=quoted)
        self.insert = QUERIES["insert"].format(table=quoted)

    def insert_new(self, conn: Any, rows: Sequence[tuple[Any, ...]]) -> set[str]:
        """``rows`` whose ids the table does not hold (the first of an id given twice): the ids
        that went in. The caller's transaction holds the write lock, so nobody adds one between."""
        present: set[str] = set()
        ids = [r[0] for r in rows]
        for start in range(0, len(ids), IDS_A_LOOK):
            chunk = ids[start : start + IDS_A_LOOK]
            look = self.existing.replace("{marks}", ", ".join("?" * len(chunk)))
            present |= {r[0] for r in conn.execute(look, chunk).fetchall()}
        fresh = []
        for row in rows:
            if row[0] not in present:
                present.add(row[0])
                fresh.append(row)
        conn.executemany(self.insert, fresh)
        return {row[0] for row in fresh}

    def copy(self, conn: Any, rows: Iterable[tuple[Any, ...]]) -> int | None:
        """No COPY here: None, nothing written (the caller inserts instead)."""
        return None

    def copy_encoded(self, conn: Any, chunks: Iterable[bytes | memoryview]) -> int | None:
        return None

    def written(self, conn: Any, earliest_us: int | None, added: int) -> None:
        """Nothing to announce: SQLite's dispatchers watch the file."""


def source_rows(table: str) -> SourceRows:
    """A table (``table``: its quoted name) a migration takes rows out of and puts back, with this
    backend's statements."""
    return SourceRows(
        QUERIES["bulk_take_keys"].format(table=table), QUERIES["bulk_put_back"].format(table=table), "?"
    )
