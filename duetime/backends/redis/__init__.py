"""Redis store and transport (extra: ``duetime[redis]``, redis-py)."""

from duetime.backends.redis.store import RedisStore, SyncRedisStore
from duetime.backends.redis.transport import RedisTransport

__all__ = ["RedisStore", "RedisTransport", "SyncRedisStore"]
