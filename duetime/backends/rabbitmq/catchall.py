"""The catch-all of the native delay topology: messages whose destination was gone on arrival.

They wait in a quorum queue instead of being dropped (or wedging a level); an operator lists them
and sends them back once the destination exists again (or to another queue).
"""

from __future__ import annotations

from duetime.backends.rabbitmq.arrival import arrival_headers
from duetime.backends.rabbitmq.native import NativeDelays
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError
from duetime.message import DelayedMessage


def destination_of(routing_key: str) -> str:
    """The destination is what follows the 28 bit words of the routing key."""
    parts = routing_key.split(".")
    return ".".join(parts[28:]) if len(parts) > 28 else routing_key


async def inspect_catchall(
    native: NativeDelays, *, limit: int = 100, send_back: bool = False, to: str | None = None
) -> list[tuple[str, str, str]]:
    """(message id, destination, what happened) for up to ``limit`` messages.

    Listing leaves them in place (they are requeued when the channel closes). Sending back
    publishes each to its destination (or ``to``) through the delivery exchange and acknowledges
    it only after the broker confirmed the publish: a failure leaves it in the catch-all."""
    if native.names.catchall is None:
        raise ConfigurationError(f"the {native.names.delivery} names have no catch-all queue.")
    connection = native.transport._connection
    assert connection is not None
    channel = await connection.channel(publisher_confirms=True)
    report: list[tuple[str, str, str]] = []
    try:
        queue = await channel.declare_queue(native.names.catchall, passive=True)
        for _ in range(limit):
            incoming = await queue.get(no_ack=False, fail=False)
            if incoming is None:
                break
            destination = to or destination_of(incoming.routing_key or "")
            ident = incoming.message_id or "?"
            if not send_back:
                report.append((ident, destination, "waiting in the catch-all"))
                continue
            headers = {k: v for k, v in arrival_headers(dict(incoming.headers or {})).items()}
            message = DelayedMessage(
                ident if ident != "?" else f"catchall-{incoming.delivery_tag}",
                destination,
                SYSTEM.now(),
                incoming.body,
                {
                    k: (v.decode() if isinstance(v, bytes) else str(v))
                    for k, v in headers.items()
                    if k != "duetime-due-at"
                },
            )
            [error] = await native.send_batch([message])
            if error is None:
                await incoming.ack()
                report.append((ident, destination, "sent back"))
            else:
                await incoming.nack(requeue=True)
                report.append((ident, destination, f"still here: {error}"))
    finally:
        await channel.close()
    return report


__all__ = ["destination_of", "inspect_catchall"]
