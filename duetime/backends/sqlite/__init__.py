"""The embedded default: a SQLite store and a SQLite queue transport (stdlib only)."""

from duetime.backends.sqlite.queue import SqliteQueueTransport, SyncSqliteQueue
from duetime.backends.sqlite.store import SqliteStore, SyncSqliteStore

__all__ = ["SqliteQueueTransport", "SqliteStore", "SyncSqliteQueue", "SyncSqliteStore"]
