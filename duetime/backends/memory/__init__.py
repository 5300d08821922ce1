"""In-memory store and transport: for unit tests; they pass the same contract suites."""

from duetime.backends.memory.store import MemoryStore, SyncMemoryStore
from duetime.backends.memory.transport import MemoryTransport

__all__ = ["MemoryStore", "MemoryTransport", "SyncMemoryStore"]
