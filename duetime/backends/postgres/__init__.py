"""PostgreSQL store and queue transport (extra: ``duetime[postgres]``, psycopg 3 and its pool)."""

from duetime.backends.postgres.connection import PgOptions
from duetime.backends.postgres.queue import PostgresQueueTransport, SyncPostgresQueue
from duetime.backends.postgres.store import PostgresStore, SyncPostgresStore

__all__ = [
    "PgOptions",
    "PostgresQueueTransport",
    "PostgresStore",
    "SyncPostgresQueue",
    "SyncPostgresStore",
]
