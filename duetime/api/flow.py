"""``/v1/limits`` and ``/v1/destinations``: flow-control limits and pauses, as ``duetime limits``
and ``duetime destinations`` set them (the same store capability underneath)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from duetime.api.models import TEXT, Instant
from duetime.api.problems import ApiProblem, problems
from duetime.api.state import HttpApi, Served, caller_with
from duetime.api_keys import Scope
from duetime.audit import Action
from duetime.interfaces import FlowControlStore
from duetime.limits import COUNT_MOST, NAME_MOST, Limit, Pause, Rate, destination_states

router = APIRouter(tags=["flow control"], responses=problems(501))

DestinationPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=NAME_MOST,
        pattern=TEXT,
        description="A destination's name or a pattern of them (partner-*).",
    ),
]


#: A rate as the API takes it: a count (more than none, at most six digits before a point) per unit.
RATE = r"^ *(0\.[0-9]*[1-9][0-9]*|[1-9][0-9]{0,5}(\.[0-9]+)?) */ *(s|sec|second|m|min|minute|h|hour) *$"
#: A header's name (an HTTP token).
HEADER = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$"
#: One line of text.
LINE = r"^[^\x00\r\n]*$"


def _no_nulls(*fields: str) -> Callable[[Any], Any]:
    """A field is given or left out; a null is neither (the document says each is its type)."""

    def check(data: Any) -> Any:
        if isinstance(data, dict):
            for name in fields:
                if name in data and data[name] is None:
                    raise ValueError(f"{name} is null: give it, or leave it out")
        return data

    return check


class LimitIn(BaseModel):
    """A rate, a concurrency, or both (the document says so: one of them is required)."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["rate"]}, {"required": ["concurrency"]}]}
    )
    _given = model_validator(mode="before")(_no_nulls("rate", "burst", "concurrency", "key"))

    rate: (
        Annotated[str, Field(pattern=RATE, description="At most this many: 50/s, 600/min, 2/h.")]
        | SkipJsonSchema[None]
    ) = None
    burst: int = Field(
        1, ge=1, le=COUNT_MOST, description="How many of the rate may go at once after a quiet spell."
    )
    concurrency: (
        Annotated[int, Field(ge=1, le=COUNT_MOST, description="At most this many sent and not yet settled.")]
        | SkipJsonSchema[None]
    ) = None
    key: (
        Annotated[
            str, Field(pattern=HEADER, description="A header whose every value gets the limit of its own.")
        ]
        | SkipJsonSchema[None]
    ) = None


class LimitOut(BaseModel):
    destination: str
    rate: str | None
    per_second: float | None
    burst: int | None
    concurrency: int | None
    key: str | None
    set_by: str
    set_at: Instant | None


class PauseIn(BaseModel):
    _given = model_validator(mode="before")(_no_nulls("reason", "by"))
    reason: str = Field("", max_length=500, pattern=LINE)
    by: (
        Annotated[
            str,
            Field(max_length=200, pattern=LINE, description="Who paused it; by default the API key's name."),
        ]
        | SkipJsonSchema[None]
    ) = None


class DestinationOut(BaseModel):
    destination: str
    stored: int
    limit: str | None
    paused_by: str | None
    paused_at: Instant | None
    reason: str | None


def _flow(api: HttpApi) -> FlowControlStore:
    if not isinstance(api.store, FlowControlStore):
        raise ApiProblem(501, "not-kept", f"{type(api.store).__name__} keeps no flow-control limits")
    return api.store


def _out(x: Limit) -> LimitOut:
    return LimitOut(
        destination=x.destination,
        rate=x.rate.text() if x.rate else None,
        per_second=x.rate.per_second if x.rate else None,
        burst=x.rate.burst if x.rate else None,
        concurrency=x.concurrency,
        key=x.key,
        set_by=x.set_by,
        set_at=x.set_at,
    )


@router.get("/v1/limits", response_model=list[LimitOut], summary="Every flow-control limit")
async def limits(served: Annotated[Served, Depends(caller_with(Scope.READ))]) -> list[LimitOut]:
    api = served.api
    return [_out(x) for x in await api.within(_flow(api).limits())]


@router.put(
    "/v1/limits/{destination:text}",
    response_model=LimitOut,
    responses=problems(400),
    summary="Limit a destination (or each key of it), in place of any limit it had",
)
async def set_limit(
    destination: DestinationPath,
    given: LimitIn,
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
) -> LimitOut:
    """Every dispatcher of the store applies it within a few seconds."""
    api = served.api
    rate = Rate.parse(given.rate, given.burst) if given.rate is not None else None
    limit = Limit(destination, rate, given.concurrency, given.key, served.caller.name, api.clock.now())
    await api.within(_flow(api).set_limit(limit))
    await served.audit(Action.LIMIT_SET, destination, detail=limit.said())
    return _out(limit)


@router.delete(
    "/v1/limits/{destination:text}",
    status_code=204,
    responses=problems(404),
    summary="Remove a destination's limit",
)
async def remove_limit(
    destination: DestinationPath, served: Annotated[Served, Depends(caller_with(Scope.MANAGE))]
) -> Response:
    api = served.api
    if not await api.within(_flow(api).remove_limit(destination)):
        raise ApiProblem(404, "not-found", f"no limit for {destination!r}")
    await served.audit(Action.LIMIT_REMOVE, destination)
    return Response(status_code=204)


@router.get(
    "/v1/destinations", response_model=list[DestinationOut], summary="Destinations, limits and pauses"
)
async def destinations(served: Annotated[Served, Depends(caller_with(Scope.READ))]) -> list[DestinationOut]:
    """Every destination with messages stored, and every limited or paused one."""
    api = served.api
    flow = _flow(api)
    counts = await api.within(api.store.counts(api.clock.now()))
    found, paused = await api.within(flow.limits()), await api.within(flow.paused())
    return [
        DestinationOut.model_validate(state.as_json())
        for state in destination_states(counts.by_destination, found, paused)
    ]


@router.post(
    "/v1/destinations/{destination:text}/pause",
    status_code=204,
    responses=problems(400, 409),
    summary="Send nothing to a destination until it is resumed",
)
async def pause(
    destination: DestinationPath,
    given: PauseIn,
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
) -> Response:
    api = served.api
    made = Pause(destination, given.by or served.caller.name, api.clock.now(), given.reason)
    if not await api.within(_flow(api).pause_destination(made)):
        raise ApiProblem(409, "paused-already", f"{destination!r} is paused already")
    await served.audit(Action.PAUSE, destination, detail=given.reason)
    return Response(status_code=204)


@router.post(
    "/v1/destinations/{destination:text}/resume",
    status_code=204,
    responses=problems(404),
    summary="Resume a paused destination: its backlog goes at its limit",
)
async def resume(
    destination: DestinationPath, served: Annotated[Served, Depends(caller_with(Scope.MANAGE))]
) -> Response:
    api = served.api
    if not await api.within(_flow(api).resume_destination(destination)):
        raise ApiProblem(404, "not-paused", f"{destination!r} is not paused")
    await served.audit(Action.RESUME, destination)
    return Response(status_code=204)
