"""``/v1/audit``: the audit trail of the store, newest first, a page at a time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from duetime.api.models import TEXT, TIME, Instant, time_of
from duetime.api.problems import ApiProblem, problems
from duetime.api.state import Served, caller_with
from duetime.api_keys import Scope
from duetime.audit import CURSOR, NAME_MOST, Action, AuditEntry, AuditQuery
from duetime.interfaces import AuditStore

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=problems(501))


class AuditEntryOut(BaseModel):
    """One change: who made it (an API key's is ``key:NAME``), through what (cli, dashboard,
    http-api, python), from where, what it did, to what, the messages it touched (the first 100)."""

    at: Instant
    actor: str
    via: str
    origin: str
    action: str
    target: str
    ids: list[str]
    detail: str
    id: str

    @classmethod
    def of(cls, e: AuditEntry) -> AuditEntryOut:
        return cls.model_validate(e.as_json())


class AuditPage(BaseModel):
    entries: list[AuditEntryOut]
    next_cursor: str | None = Field(description="Pass as ?after= for the next page; null on the last one.")


@router.get("", response_model=AuditPage, summary="The audit trail, newest first")
async def list_(
    served: Annotated[Served, Depends(caller_with(Scope.MANAGE))],
    since: Annotated[
        str | None,
        Query(max_length=64, pattern=TIME, description="RFC 3339", json_schema_extra={"format": "date-time"}),
    ] = None,
    until: Annotated[
        str | None,
        Query(max_length=64, pattern=TIME, description="RFC 3339", json_schema_extra={"format": "date-time"}),
    ] = None,
    actor: Annotated[str | None, Query(min_length=1, max_length=NAME_MOST, pattern=TEXT)] = None,
    action: Annotated[Action | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        str | None,
        Query(max_length=64, pattern=CURSOR, description="The next_cursor of the previous page."),
    ] = None,
) -> AuditPage:
    """Every change made through the command line, the dashboard, this API or a Python client
    given an actor. Needs the manage scope: it names keys and addresses."""
    store = served.api.store
    if not isinstance(store, AuditStore):
        raise ApiProblem(501, "not-kept", f"{type(store).__name__} keeps no audit trail")
    query = AuditQuery(
        since=time_of("since", since),
        until=time_of("until", until),
        actor=actor,
        action=None if action is None else action.value,
        limit=limit,
        after=after,
    )
    entries, cursor = await served.api.within(store.audit_entries(query))
    return AuditPage(entries=[AuditEntryOut.of(e) for e in entries], next_cursor=cursor)
