"""``/v1/errors``: the endpoint's messages in the error queue, and sending them back or dropping
them, as ``duetime errors list|retry|discard`` do (the same operations underneath)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from duetime.api.models import TEXT, Discarded, FailedMessage, FailedPage, Pick, Retried, Retry
from duetime.api.problems import ApiProblem, problems
from duetime.api.state import HttpApi, Served, caller_with
from duetime.api_keys import Scope
from duetime.inputs.durations import parse_duration
from duetime.interfaces import InspectableQueue, ReceivedMessage
from duetime.message import MAX_DESTINATION_LENGTH, refused_destination
from duetime.operations.retry_or_discard import (
    chosen,
    discard,
    failed_row,
    failures,
    open_error_transport,
    send_back,
    take,
)

router = APIRouter(prefix="/v1/errors", tags=["error queue"], responses=problems(501))


@asynccontextmanager
async def _queue(api: HttpApi) -> AsyncIterator[InspectableQueue]:
    if api.transport_url is None:
        raise ApiProblem(
            501,
            "no-error-queue",
            "this server was given no transport, and its store has no queues of its own: start "
            "duetime serve with --transport (the dispatchers' one) to reach the error queue",
        )
    t = open_error_transport(api.transport_url)
    try:
        await api.within(t.start())
        yield t
    finally:
        await t.close()


@router.get("", response_model=FailedPage, summary="The endpoint's messages in the error queue, oldest first")
async def list_(
    served: Annotated[Served, Depends(caller_with(Scope.READ))],
    destination: Annotated[
        str | None, Query(min_length=1, max_length=MAX_DESTINATION_LENGTH, pattern=TEXT)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> FailedPage:
    """Nothing is taken: on a broker the messages are read and put back in their order."""
    api = served.api
    async with _queue(api) as t:
        got = await api.within(failures(t, api.error_queue, api.endpoint, destination, limit))
    return FailedPage(
        messages=[FailedMessage(**failed_row(m)) for m in got.shown], found=got.found, depth=got.depth
    )


async def _taken(api: HttpApi, t: InspectableQueue, pick: Pick) -> list[ReceivedMessage]:
    if bool(pick.ids) == pick.all:
        raise ApiProblem(400, "invalid-request", "give ids, or all: true (not both)")
    if pick.ids and pick.destination is not None:
        raise ApiProblem(
            400, "invalid-request", "destination picks which messages all: true takes; with ids, leave it out"
        )
    ids, missing = await api.within(
        chosen(t, api.error_queue, pick.ids, pick.all, pick.destination, api.endpoint)
    )
    taken, gone = await api.within(take(t, api.error_queue, ids)) if ids else ([], [])
    if (missing or gone) and not pick.all and not taken:
        shown = ", ".join([*missing, *gone][:5])
        raise ApiProblem(
            404, "not-in-error-queue", f"not in error queue {api.error_queue!r} (handled already?): {shown}"
        )
    return taken


@router.post(
    "/retry",
    response_model=Retried,
    responses=problems(404, 422),
    summary="Send messages back into the store for another try",
)
async def retry(pick: Retry, served: Annotated[Served, Depends(caller_with(Scope.MANAGE))]) -> Retried:
    """Each is stored first and only then removed from the error queue: a retry that stops half-way
    loses nothing, and sending it again finishes it (ids stored already are counted in ``already``)."""
    api = served.api
    if pick.to is not None and (why := refused_destination(pick.to, api.error_queue)):
        raise ApiProblem(422, "message-refused", f"{why}; nothing was sent back")
    delay = parse_duration(str(pick.delay) if isinstance(pick.delay, int | float) else pick.delay)
    window = parse_duration(str(pick.spread) if isinstance(pick.spread, int | float) else pick.spread)
    async with _queue(api) as t:
        taken = await _taken(api, t, pick)
        done = await api.within(
            send_back(api.store, t, taken, to=pick.to, delay=delay, spread=window, actor=served.actor)
        )
    return Retried(sent=done.sent, already=done.already, nowhere=done.nowhere)


@router.post(
    "/discard",
    response_model=Discarded,
    responses=problems(404),
    summary="Remove messages from the error queue for good",
)
async def discard_(pick: Pick, served: Annotated[Served, Depends(caller_with(Scope.MANAGE))]) -> Discarded:
    api = served.api
    async with _queue(api) as t:
        taken = await _taken(api, t, pick)
        return Discarded(discarded=await api.within(discard(api.store, t, taken, served.actor)))
