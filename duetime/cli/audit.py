"""`duetime audit list | export | prune`: the audit trail of the changes people and keys made.

Every change made through the command line, the dashboard, the HTTP API, or a Python client given
an actor is kept by the store it changed (:mod:`duetime.audit`); these commands read it and keep
it to a size.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Annotated

import typer

from duetime.audit import Action, AuditEntry, AuditQuery
from duetime.cli.common import DEFAULT_STORE, EndpointOpt, StoreOpt, app, record_change, with_capability
from duetime.cli.terminal import console, err, table
from duetime.cli.terminal import show as show_table
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError
from duetime.inputs.durations import parse_duration, parse_time
from duetime.interfaces import AuditStore
from duetime.settings import DEFAULT_ENDPOINT

audit_app = typer.Typer(
    help="The audit trail: who cancelled, rescheduled, replaced, retried, discarded, paused, "
    "limited, rotated or changed what, when, through what and from where.",
    no_args_is_help=True,
)
app.add_typer(audit_app, name="audit")

SinceOpt = Annotated[
    str | None,
    typer.Option(
        help="From this time (ISO 8601) or this long ago (24h, 7d).", show_default=False, metavar="WHEN"
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option(help="Up to this time (ISO 8601) or this long ago.", show_default=False, metavar="WHEN"),
]
ActorOpt = Annotated[
    str | None, typer.Option(help="Only this actor's changes (as the list shows it).", show_default=False)
]
ActionOpt = Annotated[
    str | None,
    typer.Option(help="Only this action (cancel, reschedule, retry, pause, ...).", show_default=False),
]


def moment(text: str | None, what: str) -> datetime | None:
    """A time given as ISO 8601, or as a span before now (``7d``)."""
    if text is None:
        return None
    if "-" in text or ":" in text:
        return parse_time(text)
    try:
        return SYSTEM.now() - parse_duration(text)
    except ValueError:
        raise ConfigurationError(
            f"{what} {text!r} is neither a time (ISO 8601 with an offset) nor a span before now (24h, 7d)."
        ) from None


def _trail(store: str, endpoint: str, query: AuditQuery) -> tuple[list[AuditEntry], str | None]:
    async def read(s: AuditStore) -> tuple[list[AuditEntry], str | None]:
        return await s.audit_entries(query)

    return with_capability(store, endpoint, AuditStore, "audit trail", read)  # type: ignore[type-abstract]


def _query(since: str | None, until: str | None, actor: str | None, action: str | None) -> AuditQuery:
    return AuditQuery(
        since=moment(since, "--since"),
        until=moment(until, "--until"),
        actor=actor,
        action=None if action is None else Action.of(action).value,
    )


@audit_app.command("list")
def list_(
    since: SinceOpt = None,
    until: UntilOpt = None,
    actor: ActorOpt = None,
    action: ActionOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Entries on the page.")] = 50,
    after: Annotated[
        str | None,
        typer.Option(help="Where the page starts: the cursor the previous page printed.", show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """The latest changes, newest first.

    duetime audit list
    duetime audit list --since 24h --action cancel
    duetime audit list --actor 'key:billing' --json
    """
    query = _query(since, until, actor, action)
    query = AuditQuery(query.since, query.until, query.actor, query.action, limit, after)
    entries, cursor = _trail(store, endpoint, query)
    if as_json:
        sys.stdout.writelines(json.dumps(e.as_json(), ensure_ascii=False) + "\n" for e in entries)
    elif not entries:
        err.print("no changes recorded" + (" that match" if any((since, until, actor, action)) else ""))
    else:
        grid = table("when", "who", "via", "from", "action", "target", "detail", free=("detail",))
        for e in entries:
            grid.add_row(
                e.at.isoformat(timespec="seconds"), e.actor, e.via, e.origin or "-", e.action, e.target,
                e.detail or ("" if not e.ids else ", ".join(e.ids[:3]) + (" ..." if len(e.ids) > 3 else "")),
            )  # fmt: skip
        show_table(grid)
    if cursor is not None:
        err.print(f"more: duetime audit list --after {cursor}")


@audit_app.command("export")
def export(
    since: SinceOpt = None,
    until: UntilOpt = None,
    actor: ActorOpt = None,
    action: ActionOpt = None,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Every entry, oldest first, as JSON lines on standard output (for a log system or an archive).

    duetime audit export --since 30d > audit.jsonl
    """
    base = _query(since, until, actor, action)

    async def every_page(s: AuditStore) -> int:
        cursor: str | None = None
        written = 0
        while True:
            query = AuditQuery(
                base.since, base.until, base.actor, base.action, 1000, cursor, oldest_first=True
            )
            entries, cursor = await s.audit_entries(query)
            sys.stdout.writelines(json.dumps(e.as_json(), ensure_ascii=False) + "\n" for e in entries)
            written += len(entries)
            if cursor is None:
                sys.stdout.flush()
                return written

    written = with_capability(store, endpoint, AuditStore, "audit trail", every_page)  # type: ignore[type-abstract]
    err.print(f"exported {written:,} entries")


@audit_app.command("prune")
def prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Forget the entries older than this (90d, 1y as 365d).")
    ],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Forget the entries older than a span (export them first to keep them elsewhere).

    duetime audit prune --older-than 90d
    """
    before = moment(older_than, "--older-than") or SYSTEM.now()

    async def work(s: AuditStore) -> int:
        gone = await s.prune_audit(before)
        await record_change(
            s, Action.AUDIT_PRUNE, "audit trail", detail=f"{gone} entries before {before.isoformat()}"
        )
        return gone

    gone = with_capability(store, endpoint, AuditStore, "audit trail", work)  # type: ignore[type-abstract]
    console.print(f"forgot {gone:,} entries from before {before.isoformat(timespec='seconds')}")
