"""Find the message that breaks a connection, instead of taking it for an outage.

Most messages a transport cannot carry are refused before they are sent (each transport checks
its own rules). What no check foresaw - a broker that closes the connection on one message without
naming it - looks like an outage: every message the batch had not settled comes back
"unavailable". Sent again whole, the batch would fail again, the dispatch breaker would trip and
the process exit, on every restart. So when a connection drops mid-batch and the transport answers
again, the messages it lost are sent again one at a time until one drops the connection twice,
alone, with the transport reachable each time. That message alone fails
(:class:`MessageRefused`: it goes to the error queue, or stays stored when that cannot take it
either) and the rest go together again. One at a time, not in halves: a broker that closes a
connection has not confirmed what it took just before, so each message sent again may arrive
twice, and one at a time sends every other message again once per dropped connection, as
at-least-once delivery after any dropped connection does; halves would send those beside the
culprit again at every level.

A real outage stops the search at once: when the transport does not answer (``probe`` fails) or
a send fails as a whole, what is left keeps its "unavailable" result, which the dispatcher
handles as the outage it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from duetime.errors import DestinationUnavailable, MessageRefused, TransportUnavailable, one_line
from duetime.message import DelayedMessage

Send = Callable[[Sequence[DelayedMessage]], Awaitable[list[Exception | None]]]
Probe = Callable[[], Awaitable[None]]

#: How many times a message must drop the connection while sent alone before it is blamed: once
#: could be a broker restarting at that moment.
ALONE_TIMES = 2


async def send_pinpointing(
    batch: Sequence[DelayedMessage], send: Send, probe: Probe
) -> list[Exception | None]:
    """``send(batch)``'s results, with a connection lost mid-batch traced to the message that
    loses it. ``send`` raises when the transport fails as a whole (that propagates: nothing was
    sent); ``probe`` raises when the transport cannot be reached."""
    results = list(await send(batch))
    lost = _lost(results, range(len(batch)))
    alone = 1 if len(batch) == 1 else 0  # times lost[0] dropped the connection sent by itself
    while lost:
        try:
            await probe()  # reconnects; an outage ends the search
        except Exception:
            break
        if alone >= ALONE_TIMES:
            culprit = lost.pop(0)
            dropped = results[culprit]
            assert dropped is not None
            results[culprit] = MessageRefused(
                f"the transport dropped its connection each time message {batch[culprit].message_id} "
                f"was sent, alone too, and answered again after ({one_line(dropped)})"
            )
            alone, part = 0, lost  # found: the rest go together again
        else:
            part = lost[:1]
        if not part:
            break
        try:
            answers = await send([batch[i] for i in part])
        except Exception:
            break  # down as a whole: the rest stays "unavailable"
        for i, answer in zip(part, answers, strict=True):  # ``send`` answers one per message
            results[i] = answer
        again = _lost(results, part)
        alone = alone + 1 if again and len(part) == 1 else 0
        lost = again + lost[len(part) :]
    return results


def _lost(results: Sequence[Exception | None], indices: Sequence[int]) -> list[int]:
    """The messages a dropped connection lost (not those a destination could not take now)."""
    return [
        i
        for i in indices
        if isinstance(results[i], TransportUnavailable) and not isinstance(results[i], DestinationUnavailable)
    ]
