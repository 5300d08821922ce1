"""How a migration takes rows out of the table it reads and puts them back: the statements are
each backend's own (its ``bulk_rows.source_rows``), the executing of them is this, once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SourceRows:
    """A table a migration takes rows out of by key and puts back, in the caller's transaction.
    The statements are its backend's (``bulk_take_keys`` and ``bulk_put_back`` in that backend's
    ``queries.sql``, the table filled in; ``{key}``, ``{columns}`` and ``{marks}`` left to fill);
    ``mark`` is its driver's parameter mark."""

    take: str
    back: str
    mark: str = "%s"

    def take_keys(self, conn: Any, key: str, keys: Sequence[Any]) -> int:
        """Delete the rows whose ``key`` (a quoted column) is one of ``keys``: how many went."""
        if not keys:
            return 0
        cursor = conn.cursor()
        cursor.execute(self.take.replace("{key}", key).replace("{marks}", self._marks(len(keys))), list(keys))
        return int(cursor.rowcount)

    def put_back(self, conn: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows taken out, back into the table (``columns``: quoted, in the rows' order)."""
        if rows:
            text = self.back.replace("{columns}", ", ".join(columns)).replace(
                "{marks}", self._marks(len(columns))
            )
            conn.cursor().executemany(text, [tuple(r) for r in rows])

    def _marks(self, count: int) -> str:
        return ", ".join([self.mark] * count)
