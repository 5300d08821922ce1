"""NATS JetStream transport (extra: ``duetime[nats]``, nats-py)."""

from duetime.backends.nats.transport import NatsTransport

__all__ = ["NatsTransport"]
