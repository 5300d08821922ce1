"""Deduplication for receivers of at-least-once delivery, in Redis.

At-least-once means a message may arrive twice (same ``message_id``) after a crash. Ask
``first_time(message_id)`` before handling a message and skip it when the answer is False:
``SET NX`` with a time to live, one round trip, for receivers whose side effects are not in a
database of their own (otherwise use the PostgreSQL one, which commits with the work).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class RedisDeduplicator:
    """Remembers ids for ``ttl`` (keep it longer than any redelivery can take: the claim timeout
    plus the broker's own redelivery delay)."""

    def __init__(
        self, client: Any, *, prefix: str = "duetime:seen:", ttl: timedelta = timedelta(days=7)
    ) -> None:
        self.client, self.prefix, self.ttl = client, prefix, ttl

    def first_time(self, message_id: str) -> bool:
        return bool(self.client.set(self.prefix + message_id, b"1", nx=True, ex=self.ttl))

    async def afirst_time(self, message_id: str) -> bool:
        """The same with a ``redis.asyncio`` client."""
        return bool(await self.client.set(self.prefix + message_id, b"1", nx=True, ex=self.ttl))

    def forget(self, message_id: str) -> None:
        """Undo a mark when handling failed and the message should be handled again."""
        self.client.delete(self.prefix + message_id)
