"""RabbitMQ transport (extra: ``duetime[rabbitmq]``, aio-pika)."""

from duetime.backends.rabbitmq.transport import RabbitMqTransport

__all__ = ["RabbitMqTransport"]
