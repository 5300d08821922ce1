"""Redis transport (extra: ``duetime[redis]``, redis-py)."""

from duetime.backends.redis.transport import RedisTransport

__all__ = ["RedisTransport"]
