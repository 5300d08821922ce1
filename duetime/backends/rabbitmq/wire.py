"""AMQP integers of a stated width, as NServiceBus.RabbitMQ writes them.

pamqp (under aio-pika) encodes a Python int in the smallest AMQP type that holds it, so a TTL of
1,000 ms goes out as a 16-bit integer and a delay of 5 s as an 8-bit one. NServiceBus declares
``x-message-ttl`` as a 64-bit integer (``Convert.ToInt64``) and writes
``NServiceBus.Transport.RabbitMQ.DelayInSeconds`` as a 32-bit one, and its tools read them as such.
:class:`Int64` and :class:`Int32` keep their width on the wire: pamqp's one integer encoder is
wrapped (once, on import) to honour them; every plain int is encoded exactly as before, by
pamqp's own code. pamqp has no public way to give an integer's width, and queue declarations are
encoded inside aiormq, out of duetime's reach, so this is the one patch of another library in
duetime: here alone, and ``test_integers_keep_the_width_nservicebus_gives_them`` fails if it
stops working (or changes a plain int).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pamqp import encode


class Int64(int):
    """An int sent as an AMQP signed 64-bit integer (field type ``l``)."""


class Int32(int):
    """An int sent as an AMQP signed 32-bit integer (field type ``I``)."""


def _sized(original: Callable[[int], bytes]) -> Callable[[int], bytes]:
    def table_integer(value: int) -> bytes:
        if isinstance(value, Int64):
            return b"l" + struct.pack(">q", value)
        if isinstance(value, Int32):
            return b"I" + struct.pack(">i", value)
        return original(value)

    table_integer.duetime_sized = True  # type: ignore[attr-defined]
    return table_integer


if not getattr(encode.table_integer, "duetime_sized", False):
    encode.table_integer = _sized(encode.table_integer)  # type: ignore[assignment]
