"""Deduplication for receivers of at-least-once delivery, in the receiver's own PostgreSQL.

At-least-once means a message may arrive twice (same ``message_id``) after a crash. An
``INSERT … ON CONFLICT DO NOTHING`` *in the receiver's own transaction* marks the id, so "seen"
commits together with the work it guards: if the work rolls back, so does the mark, and the
redelivery is handled. This is the exactly-once receiver (NServiceBus's "outbox or custom
de-duplication mechanism").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from duetime.inputs.identifiers import check_name, quote_identifier


class PostgresDeduplicator:
    """Marks ids in a table of the receiver's database, inside the receiver's transaction."""

    def __init__(self, table: str = "duetime_seen", schema: str = "public") -> None:
        self.table = (
            f"{quote_identifier(check_name('schema', schema))}.{quote_identifier(check_name('table', table))}"
        )

    def setup(self, conn: Any) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (message_id varchar(250) PRIMARY KEY, "
            "seen_at timestamptz NOT NULL DEFAULT now())"
        )

    def first_time(self, conn: Any, message_id: str) -> bool:
        """Call inside the transaction that does the work (psycopg connection or cursor)."""
        cur = conn.execute(
            f"INSERT INTO {self.table} (message_id) VALUES (%s) ON CONFLICT DO NOTHING", (message_id,)
        )
        return bool(cur.rowcount == 1)

    def prune(self, conn: Any, older_than: timedelta) -> int:
        """Forget ids seen long ago (run daily; keep more than any redelivery window)."""
        cur = conn.execute(f"DELETE FROM {self.table} WHERE seen_at < now() - %s", (older_than,))
        return int(cur.rowcount)
