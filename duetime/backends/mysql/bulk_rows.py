"""The MariaDB store's bulk writes: whole batches of rows into one endpoint's table, inside the
caller's transaction (a bulk job's ledger row commits with them), 500 rows a statement.

The only writer of a MariaDB store table besides the store itself. A row here is the store's:
``(id, destination, due µs since 1970, headers JSON text, body, failure count, group)``.
:func:`source_rows` is the other side of a migration: taking rows out of the table it
reads (a store's, or another layout's) and putting them back if the job aborts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from duetime.backends.mysql.store import QUERIES, table_identifier
from duetime.backends.source_rows import SourceRows

#: Rows a statement: 7 parameters each, well under the server's 65,535 placeholders.
ROWS_A_STATEMENT = 500


class MariaDbBulkRows:
    """One endpoint's table (``table``, unquoted) of a MariaDB store, written a batch at a time.
    MariaDB's dispatchers notice new rows themselves, and there is no COPY: rows go in by
    :meth:`insert_new`."""

    #: No COPY straight into the table.
    copies = False
    copy_types: tuple[str, ...] = ()

    def __init__(self, table: str) -> None:
        self.insert = QUERIES["bulk_insert_ignoring"].format(table=table_identifier(table))

    def insert_new(self, conn: Any, rows: Sequence[tuple[Any, ...]]) -> set[str]:
        """``rows`` whose ids the table does not hold (``INSERT IGNORE``: the first of an id
        given twice): the ids that went in."""
        cursor = conn.cursor()
        new: set[str] = set()
        for start in range(0, len(rows), ROWS_A_STATEMENT):
            chunk = rows[start : start + ROWS_A_STATEMENT]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(self.insert.replace("{values}", values), [v for row in chunk for v in row])
            new |= {r[0] for r in cursor.fetchall()}
        return new

    def copy(self, conn: Any, rows: Iterable[tuple[Any, ...]]) -> int | None:
        """No COPY here: None, nothing written (the caller inserts instead)."""
        return None

    def copy_encoded(self, conn: Any, chunks: Iterable[bytes | memoryview]) -> int | None:
        return None

    def written(self, conn: Any, earliest_us: int | None, added: int) -> None:
        """Nothing to announce: MariaDB's dispatchers poll."""


def source_rows(table: str) -> SourceRows:
    """A table (``table``: its quoted name) a migration takes rows out of and puts back, with this
    backend's statements."""
    return SourceRows(
        QUERIES["bulk_take_keys"].format(table=table), QUERIES["bulk_put_back"].format(table=table), "%s"
    )
