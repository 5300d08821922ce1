"""``/v1/schedules``: recurring messages, with the verbs of ``duetime recurring``: add, list,
show, next, change, pause, resume, trigger, backfill, remove."""

from __future__ import annotations

from datetime import datetime
from itertools import islice
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from duetime import audit
from duetime.api.models import (
    SCHEDULE_ID,
    Backfill,
    Count,
    Message,
    NewSchedule,
    NextTicks,
    ScheduleChange,
    SchedulePage,
    ScheduleView,
    body_of,
    time_of,
)
from duetime.api.problems import problems
from duetime.api.state import HttpApi, Served, caller_with
from duetime.api_keys import Scope
from duetime.audit import Action
from duetime.interfaces import ServerClock
from duetime.message import MAX_ID_LENGTH, DelayedMessage
from duetime.recurring.schedule import MAX_SCHEDULE_ID_LENGTH, Schedule, changed, new_schedule

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

#: A schedule's id (the library's rule, less what a pattern cannot say: characters Python does
#: not print), without '/': a schedule whose id holds one is reached from the command line only.
ScheduleId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_SCHEDULE_ID_LENGTH,
        pattern=SCHEDULE_ID,
    ),
]
Reader = Annotated[Served, Depends(caller_with(Scope.READ))]
Manager = Annotated[Served, Depends(caller_with(Scope.MANAGE))]


async def _now(api: HttpApi) -> datetime:
    """The store's time (a schedule's next tick is reckoned from it, as the dispatchers reckon)."""
    store = api.store
    server = await api.within(store.server_time()) if isinstance(store, ServerClock) else None
    return server or api.clock.now()


async def _view(api: HttpApi, s: Schedule) -> ScheduleView:
    return ScheduleView.of(s, await _now(api))


@router.post(
    "",
    status_code=201,
    response_model=ScheduleView,
    responses=problems(409, 422),
    summary="Add a recurring message",
)
async def add(new: NewSchedule, served: Manager) -> ScheduleView:
    api = served.api
    when = new.when(None)
    made = new_schedule(
        new.id,
        new.destination,
        when,
        api.clock.now(),
        body=body_of(new.body, new.body_base64),
        headers=new.headers,
        paused=new.paused,
    )
    api.carry.refuse(_probe(made))
    added = await api.within(api.schedules.add_schedule(made))
    await served.audit(
        Action.SCHEDULE_ADD, new.id, detail=audit.schedule_detail(added.destination, added.paused)
    )
    return await _view(api, added)


def _probe(s: Schedule) -> DelayedMessage:
    """A tick of ``s`` as the carry rule sees it (its destination, body and headers)."""
    return DelayedMessage.create(s.destination, s.body, delay=0, headers=s.headers)


@router.get("", response_model=SchedulePage, summary="Recurring schedules by id, a page at a time")
async def list_(
    served: Reader,
    after: Annotated[str, Query(max_length=MAX_ID_LENGTH, pattern=r"^[^\x00]*$")] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> SchedulePage:
    api = served.api
    page = await api.within(api.schedules.list_schedules(after, limit))
    now = await _now(api)
    return SchedulePage(
        schedules=[ScheduleView.of(s, now) for s in page],
        next_after=page[-1].schedule_id if len(page) == limit else None,
    )


@router.get(
    "/{schedule_id}/next",
    response_model=NextTicks,
    responses=problems(404),
    summary="The next planned tick times",
)
async def next_(
    schedule_id: ScheduleId, served: Reader, count: Annotated[int, Query(ge=1, le=1000)] = 10
) -> NextTicks:
    s = await served.api.within(served.api.schedules.get_schedule(schedule_id))
    return NextTicks(ticks=list(islice(s.recurrence.ticks(await _now(served.api)), count)))


@router.get("/{schedule_id}", response_model=ScheduleView, responses=problems(404), summary="One schedule")
async def show(schedule_id: ScheduleId, served: Reader) -> ScheduleView:
    return await _view(served.api, await served.api.within(served.api.schedules.get_schedule(schedule_id)))


@router.patch(
    "/{schedule_id}",
    response_model=ScheduleView,
    responses=problems(404, 422),
    summary="Change a schedule from its next tick",
)
async def change(schedule_id: ScheduleId, change: ScheduleChange, served: Manager) -> ScheduleView:
    api = served.api
    body = (
        None
        if change.body is None and change.body_base64 is None
        else body_of(change.body, change.body_base64)
    )

    def apply(s: Schedule) -> Schedule:
        when = change.when(s.recurrence)
        made = changed(s, when=when, destination=change.destination, body=body)
        api.carry.refuse(_probe(made))
        return made

    now = await api.within(api.schedules.change_schedule(schedule_id, apply))
    given = change.model_dump(exclude_unset=True, exclude_none=True)
    await served.audit(Action.SCHEDULE_CHANGE, schedule_id, detail=audit.changes_detail(given))
    return await _view(api, now)


@router.post(
    "/{schedule_id}/pause",
    response_model=ScheduleView,
    responses=problems(404),
    summary="No ticks until resumed",
)
async def pause(schedule_id: ScheduleId, served: Manager) -> ScheduleView:
    now = await served.api.within(served.api.schedules.pause_schedule(schedule_id))
    await served.audit(Action.SCHEDULE_PAUSE, schedule_id)
    return await _view(served.api, now)


@router.post(
    "/{schedule_id}/resume", response_model=ScheduleView, responses=problems(404), summary="Tick again"
)
async def resume(schedule_id: ScheduleId, served: Manager) -> ScheduleView:
    now = await served.api.within(served.api.schedules.resume_schedule(schedule_id))
    await served.audit(Action.SCHEDULE_RESUME, schedule_id)
    return await _view(served.api, now)


@router.post(
    "/{schedule_id}/trigger",
    response_model=Message,
    responses=problems(404),
    summary="One extra tick now",
)
async def trigger(schedule_id: ScheduleId, served: Manager) -> Message:
    tick = await served.api.within(served.api.schedules.trigger_schedule(schedule_id))
    await served.audit(Action.SCHEDULE_TRIGGER, schedule_id, ids=[tick.message_id])
    return Message.of(tick)


@router.post(
    "/{schedule_id}/backfill",
    response_model=Count,
    responses=problems(404),
    summary="Send now the ticks planned in a window",
)
async def backfill(schedule_id: ScheduleId, window: Backfill, served: Manager) -> Count:
    api = served.api
    start, end = time_of("start", window.start), time_of("end", window.end)
    assert start is not None and end is not None
    n = await api.within(api.schedules.backfill_schedule(schedule_id, start, end))
    await served.audit(Action.SCHEDULE_BACKFILL, schedule_id, detail=audit.backfill_detail(start, end, n))
    return Count(count=n)


@router.delete(
    "/{schedule_id}",
    response_model=Count,
    responses=problems(404),
    summary="Remove a schedule and its stored ticks",
)
async def remove(schedule_id: ScheduleId, served: Manager) -> Count:
    """``count``: how many stored ticks were removed with it."""
    n = await served.api.within(served.api.schedules.remove_schedule(schedule_id))
    await served.audit(Action.SCHEDULE_REMOVE, schedule_id, detail=f"{n} waiting ticks removed")
    return Count(count=n)
