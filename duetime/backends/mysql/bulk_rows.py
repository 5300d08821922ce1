"""The MariaDB store's bulk writes: whole batches of rows into one endpoint's table, inside the
caller's transaction (a bulk job's ledger row commits with them), 500 rows a statement.

The only writer of a MariaDB store table besides the store itself. A row here is the store's:
``(id, destination, due µs since 1970, headers JSON text, body, failure count, group)``.
:func:`source_rows` is the other side of a migration: taking rows out of the table it
reads (a store's, or another layout's) and putting them back if the job aborts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime.backends.mysql.store import QUERIES, table_identifier
from duetime.backends.source_rows import SourceRows

#: Rows a statement: 7 parameters each, well under the server's 65,535 placeholders.
ROWS_A_STATEMENT = 500


class MariaDbBulkRows:
    """One endpoint's table (``table``, unquoted) of a MariaDB store, written a batch at a time."""

    def __init__(self, table: str) -> None:
        self.insert = QUERIES["bulk_insert_ignoring"].format(table=table_identifier(table))

    def insert_new(self, cursor: Any, rows: Sequence[tuple[Any, ...]]) -> set[str]:
        """``rows`` whose ids the table does not hold (``INSERT IGNORE``: the first of an id
        given twice): the ids that went in."""
        new: set[str] = set()
        for start in range(0, len(rows), ROWS_A_STATEMENT):
            chunk = rows[start : start + ROWS_A_STATEMENT]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(self.insert.replace("{values}", values), [v for row in chunk for v in row])
            new |= {r[0] for r in cursor.fetchall()}
        return new


def source_rows(table: str) -> SourceRows:
    """A table (``table``: its quoted name) a migration takes rows out of and puts back, with this
    backend's statements."""
    return SourceRows(
        QUERIES["bulk_take_keys"].format(table=table), QUERIES["bulk_put_back"].format(table=table), "%s"
    )
