"""``/v1/messages``: create (one, or a batch), get, list, reschedule, cancel (one, a group, a
destination). Each call is the Python client's, so the rules are the library's."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Response

from duetime.api.models import (
    CURSOR,
    MAX_BATCH,
    TEXT,
    TIME,
    BatchItem,
    BatchResult,
    Cancelled,
    Message,
    MessagePage,
    NewBatch,
    NewBatchMessage,
    NewMessage,
    Reschedule,
    cursor_of,
    due_of,
    read_cursor_of,
    same_content,
    time_of,
)
from duetime.api.problems import ApiProblem, problems
from duetime.api.state import Served, caller_with
from duetime.api_keys import Scope
from duetime.audit import Action
from duetime.errors import DuplicateMessageId, MessageInFlight
from duetime.interfaces import ListQuery
from duetime.message import MAX_DESTINATION_LENGTH, MAX_GROUP_LENGTH, MAX_ID_LENGTH, DelayedMessage

router = APIRouter(prefix="/v1/messages", tags=["messages"])
#: A batch has an address of its own: under /v1/messages/ every name is a message's id.
batches = APIRouter(prefix="/v1/batches", tags=["messages"])

MessageId = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LENGTH, pattern=TEXT, description="The message id.")
]


def _other_content(message_id: str, then: str) -> ApiProblem:
    return ApiProblem(
        409, "duplicate-message-id", f"a message of id {message_id!r} is stored with other content{then}"
    )


def _once_each(asked: list[NewBatchMessage], messages: list[DelayedMessage]) -> list[DelayedMessage]:
    """The batch with each id once: an id given twice with the same content is one message (a
    client that retried inside its own batch), with other content a conflict (409)."""
    first: dict[str, DelayedMessage] = {}
    for new, m in zip(asked, messages, strict=True):
        seen = first.setdefault(m.message_id, m)
        if seen is not m and not same_content(seen, m, new.due_at is not None):
            raise ApiProblem(
                409,
                "duplicate-message-id",
                f"id {m.message_id!r} is given twice in this batch with other content",
            )
    return list(first.values())


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
    of this id holds other content. With ``if_exists`` keep, replace or debounce: 200 with the
    message as stored, and the ``Duetime-Outcome`` header says ``kept`` or ``replaced``; 409 while
    the waiting one is being delivered."""
    message = new.message(served.api.clock)
    served.api.carry.refuse(message)
    if new.if_exists != "refuse":
        done = await served.api.within(served.client.put(message, new.if_exists))
        if done.outcome != "stored":
            return _found(response, done.message, done.outcome)
        return _made(response, message)
    try:
        message = await served.api.within(served.api.client.schedule_message(message))
    except DuplicateMessageId:
        stored = await served.api.within(served.api.client.get(message.message_id))
        if stored is None or not same_content(stored, message, new.due_at is not None):
            raise _other_content(
                message.message_id, "; give a new id, or cancel the stored one first"
            ) from None
        return _found(response, stored, "kept")
    return _made(response, message)


def _made(response: Response, message: DelayedMessage) -> Message:
    """201, where the new message is, and that it was stored."""
    response.headers["Duetime-Outcome"] = "stored"
    response.headers["Location"] = f"/v1/messages/{quote(message.message_id, safe='')}"
    return Message.of(message)


def _found(response: Response, message: DelayedMessage, outcome: str) -> Message:
    """200: a message of the id was waiting, and it was kept or replaced."""
    response.status_code = 200
    response.headers["Duetime-Outcome"] = outcome
    return Message.of(message)


@batches.post(
    "",
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
    messages = [new.message(served.api.clock) for new in batch.messages]
    for m in messages:
        served.api.carry.refuse(m)
    messages = _once_each(batch.messages, messages)
    ids = [m.message_id for m in messages]
    client = served.api.client
    try:
        await served.api.within(client.schedule_many(messages))
        return BatchResult(
            created=len(messages), existing=0, results=[BatchItem(id=i, status="created") for i in ids]
        )
    except DuplicateMessageId:
        pass
    existing: set[str] = set()
    absolute = {new.id: new.due_at is not None for new in batch.messages}
    for m in messages:
        stored = await served.api.within(client.get(m.message_id))
        if stored is None:
            continue
        if not same_content(stored, m, absolute.get(m.message_id, False)):
            raise _other_content(m.message_id, "; nothing of this batch was stored")
        existing.add(m.message_id)
    fresh = [m for m in messages if m.message_id not in existing]
    if fresh:
        await served.api.within(served.api.store_new(fresh))
    return BatchResult(
        created=len(fresh),
        existing=len(existing),
        results=[BatchItem(id=i, status="existing" if i in existing else "created") for i in ids],
    )


@router.get(
    "/{message_id:text}", response_model=Message, responses=problems(404), summary="One stored message"
)
async def get(message_id: MessageId, served: Annotated[Served, Depends(caller_with(Scope.READ))]) -> Message:
    found = await served.api.within(served.api.client.get(message_id))
    if found is None:
        raise _gone(message_id)
    return Message.of(found)


@router.get("", response_model=MessagePage, summary="Stored messages, soonest due first, a page at a time")
async def list_(
    served: Annotated[Served, Depends(caller_with(Scope.READ))],
    destination: Annotated[
        str | None, Query(min_length=1, max_length=MAX_DESTINATION_LENGTH, pattern=TEXT)
    ] = None,
    group: Annotated[str | None, Query(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=TEXT)] = None,
    due_before: Annotated[
        str | None,
        Query(max_length=64, pattern=TIME, description="RFC 3339", json_schema_extra={"format": "date-time"}),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None, Query(max_length=300, pattern=CURSOR, description="The next_cursor of the previous page.")
    ] = None,
) -> MessagePage:
    # the cursor is a place in the listing, not an id: any text after the due time will do
    query = ListQuery(
        destination=destination,
        group=group,
        due_before=time_of("due_before", due_before),
        limit=limit,
        after=None if after is None else read_cursor_of(after),
    )
    page = await served.api.within(served.api.store.list(query))
    return MessagePage(
        messages=[Message.of(m) for m in page.messages],
        next_cursor=None if page.next_cursor is None else cursor_of(page.next_cursor),
    )


@router.patch(
    "/{message_id:text}",
    response_model=Message,
    responses=problems(404, 409),
    summary="Give a message a new due time",
)
async def reschedule(
    message_id: MessageId, change: Reschedule, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> Message:
    """409 while a dispatcher is delivering it (look again in a moment)."""
    due = due_of(change.due_at, change.delay, served.api.clock.now())
    if not await served.api.within(served.client.reschedule(message_id, due_at=due)):
        raise _gone(message_id)
    found = await served.api.within(served.api.client.get(message_id))
    if found is None:  # delivered in the moment between (it was due at once)
        raise _gone(message_id)
    return Message.of(found)


@router.delete(
    "/{message_id:text}", status_code=204, responses=problems(404, 409), summary="Cancel a stored message"
)
async def cancel(
    message_id: str, served: Annotated[Served, Depends(caller_with(Scope.SCHEDULE))]
) -> Response:
    """It is never delivered. 409 while a dispatcher is delivering it (it may be delivered already)."""
    if not await served.api.within(served.client.cancel(message_id)):
        raise _gone(message_id)
    return Response(status_code=204)


#: What one request cancels at most: a destination's messages one by one, a group's in one
#: transaction. More is left for the next request (``more``), so that no request runs for
#: minutes on a large backlog (Schemathesis found one that ran past its 10 s).
CANCEL_PER_REQUEST = 500
CANCEL_BATCH = 5000

groups = APIRouter(prefix="/v1/groups", tags=["messages"])
destinations = APIRouter(prefix="/v1/destinations", tags=["messages"])


@groups.delete("/{group:text}/messages", response_model=Cancelled, summary="Cancel every message of a group")
async def cancel_group(
    group: Annotated[str, Path(min_length=1, max_length=MAX_GROUP_LENGTH, pattern=TEXT)],
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
) -> Cancelled:
    """At most 5,000 in one transaction a request (``more``: send it again). Those being
    delivered at that moment are left alone (counted in ``in_flight``)."""
    client = served.client
    done = await served.api.within(client.cancel_group(group, limit=CANCEL_BATCH))
    left = await served.api.within(client.count_group(group))
    more = done == CANCEL_BATCH and left > 0
    return Cancelled(cancelled=done, in_flight=0 if more else left, more=more)


@destinations.delete(
    "/{destination:text}/messages", response_model=Cancelled, summary="Cancel every message for a destination"
)
async def cancel_destination(
    destination: Annotated[str, Path(min_length=1, max_length=MAX_DESTINATION_LENGTH, pattern=TEXT)],
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
) -> Cancelled:
    """A queue that is gone, say: at most 500 a request (``more``: send it again). Those being
    delivered at that moment are left alone."""
    client = served.api.client
    page = await served.api.within(client.list(destination=destination, limit=CANCEL_PER_REQUEST))
    busy = 0
    cancelled: list[str] = []
    for m in page.messages:
        try:
            if await served.api.within(client.cancel(m.message_id)):
                cancelled.append(m.message_id)
        except MessageInFlight:
            busy += 1
    if cancelled:  # one entry for the request, not one a message
        said = f"{len(cancelled)} cancelled for {destination!r}"
        await served.audit(Action.CANCEL, destination, ids=cancelled, detail=said)
    return Cancelled(cancelled=len(cancelled), in_flight=busy, more=page.next_cursor is not None)
