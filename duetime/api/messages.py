"""``/v1/messages``: create (one, or a batch), get, list, reschedule, cancel (one, a group, a
destination). Each call is the Python client's, so the rules are the library's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from duetime.api.models import (
    MAX_BATCH,
    BatchItem,
    BatchResult,
    Cancelled,
    Message,
    MessagePage,
    NewBatch,
    NewMessage,
    Reschedule,
    due_of,
    same_content,
)
from duetime.api.problems import ApiProblem, problems
from duetime.api.state import Served, caller_with
from duetime.api_keys import Scope
from duetime.errors import DuplicateMessageId, MessageInFlight
from duetime.inputs.durations import parse_time
from duetime.interfaces import cursor_text, read_cursor
from duetime.message import MAX_DESTINATION_LENGTH, MAX_GROUP_LENGTH, MAX_ID_LENGTH, DelayedMessage

router = APIRouter(prefix="/v1/messages", tags=["messages"])

Id = Annotated[str, "the message id"]
MessageId = Annotated[str, Query(max_length=MAX_ID_LENGTH)]


def _gone(message_id: str) -> ApiProblem:
    return ApiProblem(
        404, "message-not-found", f"no stored message {message_id!r} (already delivered, or cancelled?)"
    )


@router.post(
    "",
    status_code=201,
    response_model=Message,
    responses={
        200: {"model": Message, "description": "Stored before, with the same content."},
        **problems(409, 422),
    },
    summary="Store a delayed message",
)
async def create(
    new: NewMessage, response: Response, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> Message:
    """201 when stored; 200 when a message of this id and content is stored already; 409 when one
    of this id holds other content."""
    message = new.message(served.api.clock.now())
    served.api.carry.refuse(message)
    try:
        await served.api.within(served.api.client.schedule_many([message]))
    except DuplicateMessageId:
        stored = await served.api.within(served.api.client.get(message.message_id))
        if stored is None or not same_content(stored, message, new.due_at is not None):
            raise ApiProblem(
                409,
                "duplicate-message-id",
                f"a message of id {message.message_id!r} is stored with other content; give a new id, "
                "or cancel the stored one first",
            ) from None
        response.status_code = 200
        return Message.of(stored)
    response.headers["Location"] = f"/v1/messages/{message.message_id}"
    return Message.of(message)


@router.post(
    "/batch",
    response_model=BatchResult,
    responses=problems(409, 422),
    summary=f"Store up to {MAX_BATCH} delayed messages in one request",
)
async def create_batch(
    batch: NewBatch, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> BatchResult:
    """All or none: every message is checked first, and when one of them is refused, or an id
    is stored with other content, nothing is stored. A message whose id is stored with the same
    content is reported as ``existing`` (so a retried batch creates nothing twice)."""
    now = served.api.clock.now()
    messages = [new.message(now) for new in batch.messages]
    for m in messages:
        served.api.carry.refuse(m)
    ids = [m.message_id for m in messages]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise ApiProblem(400, "invalid-request", f"id {twice!r} is given twice in this batch; ids are unique")
    client = served.api.client
    try:
        await served.api.within(client.schedule_many(messages))
        return BatchResult(
            created=len(messages), existing=0, results=[BatchItem(id=i, status="created") for i in ids]
        )
    except DuplicateMessageId:
        pass
    existing: set[str] = set()
    for new, m in zip(batch.messages, messages, strict=True):
        stored = await served.api.within(client.get(m.message_id))
        if stored is None:
            continue
        if not same_content(stored, m, new.due_at is not None):
            raise ApiProblem(
                409,
                "duplicate-message-id",
                f"a message of id {m.message_id!r} is stored with other content; nothing of this batch "
                "was stored",
            )
        existing.add(m.message_id)
    fresh = [m for m in messages if m.message_id not in existing]
    if fresh:
        await served.api.within(served.api.store_new(fresh))
    return BatchResult(
        created=len(fresh),
        existing=len(existing),
        results=[BatchItem(id=i, status="existing" if i in existing else "created") for i in ids],
    )


@router.get("/{message_id}", response_model=Message, responses=problems(404), summary="One stored message")
async def get(message_id: str, served: Annotated[Served, Depends(caller_with(Scope.READ))]) -> Message:
    found = await served.api.within(served.api.client.get(message_id))
    if found is None:
        raise _gone(message_id)
    return Message.of(found)


@router.get("", response_model=MessagePage, summary="Stored messages, soonest due first, a page at a time")
async def list_(
    served: Annotated[Served, Depends(caller_with(Scope.READ))],
    destination: Annotated[str | None, Query(max_length=MAX_DESTINATION_LENGTH)] = None,
    group: Annotated[str | None, Query(max_length=MAX_GROUP_LENGTH)] = None,
    due_before: Annotated[str | None, Query(max_length=64, description="RFC 3339")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None, Query(max_length=400, description="The next_cursor of the previous page.")
    ] = None,
) -> MessagePage:
    page = await served.api.within(
        served.api.client.list(
            destination=destination,
            group=group,
            due_before=None if due_before is None else parse_time(due_before),
            limit=limit,
            after=None if after is None else read_cursor(after),
        )
    )
    return MessagePage(
        messages=[Message.of(m) for m in page.messages],
        next_cursor=None if page.next_cursor is None else cursor_text(page.next_cursor),
    )


@router.patch(
    "/{message_id}",
    response_model=Message,
    responses=problems(404, 409),
    summary="Give a message a new due time",
)
async def reschedule(
    message_id: str, change: Reschedule, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> Message:
    """409 while a dispatcher is delivering it (look again in a moment)."""
    due = due_of(change.due_at, change.delay, served.api.clock.now())
    if not await served.api.within(served.api.client.reschedule(message_id, due_at=due)):
        raise _gone(message_id)
    found = await served.api.within(served.api.client.get(message_id))
    if found is None:  # delivered in the moment between (it was due at once)
        raise _gone(message_id)
    return Message.of(found)


@router.delete(
    "/{message_id}", status_code=204, responses=problems(404, 409), summary="Cancel a stored message"
)
async def cancel(
    message_id: str, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> Response:
    """It is never delivered. 409 while a dispatcher is delivering it (it may be delivered already)."""
    if not await served.api.within(served.api.client.cancel(message_id)):
        raise _gone(message_id)
    return Response(status_code=204)


#: Messages of a destination cancelled a page at a time.
CANCEL_PAGE = 1000


@router.delete("", response_model=Cancelled, summary="Cancel every message of a group, or for a destination")
async def cancel_many(
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
    group: Annotated[str | None, Query(max_length=MAX_GROUP_LENGTH)] = None,
    destination: Annotated[str | None, Query(max_length=MAX_DESTINATION_LENGTH)] = None,
) -> Cancelled:
    """Give exactly one of ``group`` and ``destination``. Those being delivered at that moment are
    left alone (counted in ``in_flight``)."""
    if (group is None) == (destination is None):
        raise ApiProblem(400, "invalid-request", "give ?group= or ?destination= (one of them)")
    client = served.api.client
    if group is not None:
        found = await served.api.within(client.count_group(group))
        done = 0
        while n := await served.api.within(client.cancel_group(group, limit=5000)):
            done += n
        return Cancelled(cancelled=done, in_flight=max(found - done, 0))
    done = busy = 0
    after = None
    while True:
        page = await served.api.within(client.list(destination=destination, limit=CANCEL_PAGE, after=after))
        for m in page.messages:
            done, busy = await _cancel_one(served, m, done, busy)
        if page.next_cursor is None:
            return Cancelled(cancelled=done, in_flight=busy)
        after = page.next_cursor


async def _cancel_one(served: Served, m: DelayedMessage, done: int, busy: int) -> tuple[int, int]:
    try:
        return done + await served.api.within(served.api.client.cancel(m.message_id)), busy
    except MessageInFlight:
        return done, busy + 1
