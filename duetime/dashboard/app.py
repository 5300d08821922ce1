"""The dashboard's pages and actions: a Starlette app with Jinja2 templates.

Pages (GET) only read. Actions (POST, the only method they answer) change the store or the error
queue; each needs a login and its page's CSRF token, checked in :func:`_form` before anything else
(:mod:`duetime.dashboard.security`), answers with a redirect back to the page it came from and a
one-line note of what it did, and is refused with 403 when the dashboard is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from duetime import audit
from duetime.audit import Action, Actor, AuditEntry, AuditQuery, Via
from duetime.client import record
from duetime.clock import SYSTEM
from duetime.dashboard.charts import Series, line_chart, seconds_label
from duetime.dashboard.security import (
    CSRF_FIELD,
    BodyTooLarge,
    Credentials,
    Guard,
    LoginThrottle,
    RequireLogin,
    token_matches,
)
from duetime.dashboard.timeline import Timeline
from duetime.encryption import describe
from duetime.engine.deadline import within
from duetime.engine.summary import LatenessHistogram
from duetime.error_headers import (
    ERROR_ATTEMPTS,
    ERROR_MESSAGE,
    ERROR_STACKTRACE,
    ERROR_TIME,
    ERROR_TYPE,
    kept_in_store,
)
from duetime.errors import (
    ConfigurationError,
    DeadlineExceeded,
    DuetimeError,
    InvalidSchedule,
    MessageInFlight,
    MissingExtra,
    ScheduleNotFound,
    one_line,
)
from duetime.inputs.durations import parse_duration, parse_time, readable_duration
from duetime.inputs.urls import redact, scrub
from duetime.interfaces import (
    AuditStore,
    DelayedMessageStore,
    DispatcherRegistry,
    DueCounter,
    FlowControlStore,
    InspectableQueue,
    ListQuery,
    ReceivedMessage,
    RecurringStore,
    ServerClock,
    StoreCounts,
    WebhookStore,
    cursor_text,
    read_cursor,
)
from duetime.limits import Limit, Pause, Rate, check_destination, destination_states
from duetime.live_dispatchers import DispatcherInfo, describe_claims
from duetime.message import DelayedMessage, check_due_time
from duetime.operations.queue_depths import delivered_elsewhere, elsewhere_note, queue_depths
from duetime.operations.retry_or_discard import (
    LOOKED_AT,
    chosen,
    discard,
    goes_to,
    mine,
    open_error_transport,
    send_back,
    take,
)
from duetime.recurring.schedule import group_of
from duetime.registry import open_ready_store
from duetime.settings import DEFAULT_ENDPOINT, DEFAULT_ERROR_QUEUE
from duetime.webhooks import ADDRESS_REFUSED, TIMED_OUT, UNREACHABLE

try:
    from starlette.applications import Starlette
    from starlette.datastructures import FormData
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException
    from starlette.middleware import Middleware
    from starlette.middleware.sessions import SessionMiddleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
    from starlette.templating import Jinja2Templates
except ImportError as missing:  # pragma: no cover - depends on what is installed
    raise MissingExtra.of("The dashboard", "dashboard") from missing

log = logging.getLogger("duetime.dashboard")

#: Messages per page of the message list, unless the page asks for another number (at most MAX).
PAGE, MAX_PAGE = 50, 500
#: Bodies longer than this are cut in the message page; so are header values, and headers past
#: the first HEADERS_SHOWN (a message may carry a million: the page says how many it left out).
BODY_SHOWN = 64 * 1024
HEADER_VALUE_SHOWN, HEADERS_SHOWN = 2000, 200
#: Message pages read and prepared at once (the rest wait their turn): twenty requests for a
#: message with a million headers took 550 MB and held /healthz for 5 s.
MESSAGE_PAGES_AT_ONCE = 2
WINDOWS = {"15m": 900, "1h": 3600, "6h": 21600}
HORIZONS = (
    ("next minute", timedelta(minutes=1)),
    ("next hour", timedelta(hours=1)),
    ("next day", timedelta(days=1)),
)
HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
# Every value a page shows passes the scrubber: a driver's words about a URL never show its secrets.
templates.env.finalize = lambda value: scrub(value) if isinstance(value, str) else value


@dataclass
class Dashboard:
    """What the app serves: opened stores (one per endpoint), where the error queue is, and the
    timelines the sampler fills."""

    store_url: str
    stores: dict[str, DelayedMessageStore]
    transport_url: str
    error_queue: str = DEFAULT_ERROR_QUEUE
    read_only: bool = False
    credentials: Credentials | None = None
    #: Show message bodies and headers although no password is set (anyone who reaches the port
    #: reads them). With a password they are always shown: whoever logged in may see them.
    show_contents: bool = False
    sample_every: float = 10.0
    #: Seconds a page, an action or a sample waits for the store or broker: a partitioned server
    #: never answers, and a page that never answers tells the operator nothing.
    answer_within: float = 10.0
    timelines: dict[str, Timeline] = field(default_factory=dict)
    #: The broker's last answer per endpoint (see :func:`_broker_look`), kept a few seconds.
    broker_looks: dict[str, BrokerLook] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for endpoint in self.stores:
            self.timelines.setdefault(endpoint, Timeline())

    @property
    def can_change(self) -> bool:
        return not self.read_only and self.credentials is not None

    @property
    def shows_contents(self) -> bool:
        return self.credentials is not None or self.show_contents

    async def sample(self) -> None:
        """One look at every endpoint, for the charts; a store that does not answer is skipped."""
        for endpoint, store in self.stores.items():
            now = SYSTEM.now()
            try:
                counts, found = await within(self._look(store, now), self.answer_within, "sampling")
            except Exception as error:
                log.warning("could not sample endpoint %s: %s", endpoint, one_line(error))
                continue
            self.timelines[endpoint].add(now, counts, [d for d in found if d.status(now) == "live"])

    @staticmethod
    async def _look(store: DelayedMessageStore, now: datetime) -> tuple[StoreCounts, list[DispatcherInfo]]:
        counts = await store.counts(now)
        found = await store.dispatchers() if isinstance(store, DispatcherRegistry) else []
        return counts, found

    @classmethod
    async def open(
        cls,
        store_url: str,
        endpoints: Sequence[str] = (DEFAULT_ENDPOINT,),
        *,
        transport_url: str,
        **options: Any,
    ) -> Dashboard:
        """The dashboard of ``endpoints`` in the store at ``store_url`` (set up already: `duetime
        setup`), each endpoint's store opened; ``options`` are this class's fields (``read_only``,
        ``credentials``, ``sample_every``, ...). What `duetime dashboard` starts."""
        stores: dict[str, DelayedMessageStore] = {}
        try:
            for name in dict.fromkeys(endpoints):
                stores[name] = await open_ready_store(store_url, name)
        except BaseException:
            for opened in stores.values():
                await opened.close()
            raise
        return cls(store_url=store_url, stores=stores, transport_url=transport_url, **options)

    def app(self, *, secret: str, ready: Callable[[], None] = lambda: None) -> Any:
        """The ASGI application that serves these pages (see :func:`create_app`)."""
        return create_app(self, secret=secret, ready=ready)

    async def sample_forever(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.sample_every)

    async def close(self) -> None:
        for store in self.stores.values():
            with contextlib.suppress(Exception):
                await within(store.close(), self.answer_within, "closing the store")


def _endpoint(request: Request, dashboard: Dashboard) -> str:
    wanted = request.query_params.get("endpoint") or ""
    return wanted if wanted in dashboard.stores else next(iter(dashboard.stores))


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _at_most(value: float | None) -> str:
    """A lateness quantile as what it is: the upper bound of the bucket it fell in (buckets are a
    quarter apart), never a figure it is not."""
    if value is None:
        return "-"
    return "over 1 h" if math.isinf(value) else f"≤ {readable_duration(value)}"


def _live_lateness(live: list[DispatcherInfo]) -> LatenessHistogram:
    """How late the live dispatchers forwarded, since each started (their heartbeats' counts):
    right from the first view, not only once the dashboard has sampled a while."""
    total = LatenessHistogram()
    for dispatcher in live:
        total = total.plus(LatenessHistogram.from_sparse(dispatcher.lateness))
    return total


def _safe_back(value: str | None, fallback: str) -> str:
    """Where an action returns: a path on this site only (never another site: no open redirect)."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return fallback


def _done(request: Request, back: str, note: str, *, error: bool = False) -> Response:
    request.session["note"] = {"text": note, "error": error}
    return RedirectResponse(back, 303)


def _actor(request: Request, dashboard: Dashboard) -> Actor:
    """Who makes a change through the dashboard: its user, from the browser's address."""
    who = dashboard.credentials.user if dashboard.credentials else "dashboard"
    return Actor(who, Via.DASHBOARD, request.client.host if request.client else "")


async def _audit(
    request: Request, dashboard: Dashboard, endpoint: str, action: Action, target: str, **said: Any
) -> None:
    """Keep a change the dashboard made in the endpoint store's audit trail."""
    entry = audit.made(_actor(request, dashboard), action, target, **said)
    await record(dashboard.stores[endpoint], entry)


def _page(request: Request, name: str, dashboard: Dashboard, endpoint: str, **context: Any) -> Response:
    note = request.session.pop("note", None)
    return templates.TemplateResponse(
        request,
        name,
        {
            "dashboard": dashboard,
            "endpoint": endpoint,
            "endpoints": list(dashboard.stores),
            "store": redact(dashboard.store_url),
            "transport": redact(dashboard.transport_url),
            "csrftoken": request.scope["csrftoken"]() if "csrftoken" in request.scope else "",
            "note": note,
            "time": _time,
            "here": str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        },
    )


#: Seconds a look at the broker's queues is reused: a busy page must not hammer the broker.
BROKER_LOOK_SECONDS = 5.0


@dataclass(frozen=True)
class BrokerLook:
    """What the transport holds for an endpoint: each queue looked at and its depth (None: the
    transport cannot tell), the error queue's count, or why it could not be read."""

    depths: dict[str, int] | None
    error_count: int | None
    problem: str | None
    at: float


async def _broker_look(dashboard: Dashboard, endpoint: str, destinations: list[str]) -> BrokerLook:
    """The depth of each destination's queue and of the error queue, read through the transport's
    own depth capability (a passive declare on RabbitMQ, the stream's state on NATS) and kept
    :data:`BROKER_LOOK_SECONDS`."""
    cached = dashboard.broker_looks.get(endpoint)
    now = time.monotonic()
    if cached is not None and now - cached.at < BROKER_LOOK_SECONDS:
        return cached

    async def read() -> dict[str, int] | None:
        async with _error_transport(dashboard) as t:
            return await queue_depths(t, [dashboard.error_queue, *destinations])

    try:  # half the page's time at most: a broker that does not answer costs the page nothing else
        depths = await within(read(), dashboard.answer_within / 2, "reading the queues")
        look = BrokerLook(depths, None if depths is None else depths.get(dashboard.error_queue), None, now)
    except Exception as error:  # the page stands without it, and says why
        look = BrokerLook(None, None, f"could not read the queues: {one_line(error)}", now)
    dashboard.broker_looks[endpoint] = look
    return look


async def overview(request: Request) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    store = dashboard.stores[endpoint]
    now = SYSTEM.now()
    timeline = dashboard.timelines[endpoint]
    if timeline.latest is not None and (now - timeline.latest[0]).total_seconds() <= dashboard.sample_every:
        counted_at, counts = timeline.latest  # the sampler's look: counting millions is not free
    else:
        counted_at, counts = now, await store.counts(now)
    soon = await _due_soon(store, now)
    everyone = await store.dispatchers() if isinstance(store, DispatcherRegistry) else None
    broker = await _broker_look(dashboard, endpoint, list(counts.by_destination))
    flow = await _flow_look(store, list(counts.by_destination))
    live = [d for d in everyone or [] if d.status(now) == "live"]
    window = request.query_params.get("window", "1h")
    seconds = WINDOWS.get(window, 3600)
    samples = timeline.recent(seconds)
    recent = timeline.recent(300)
    reported = [s for s in samples if s.fresh]  # looks that learned nothing new are left out
    lateness = _live_lateness(live)
    charts = [
        line_chart(
            "Backlog",
            [
                Series("stored", [(s.at, s.stored) for s in samples]),
                Series("due now", [(s.at, s.due) for s in samples]),
            ],
        ),
        line_chart(
            "Delivered per minute",
            [Series("delivered / min", [(s.at, s.delivered_per_minute) for s in samples])],
        ),
        line_chart(
            "Lateness (due to forwarded)",
            [
                Series("p50", [(s.at, _seconds(s.p50_ms)) for s in reported]),
                Series("p99", [(s.at, _seconds(s.p99_ms)) for s in reported]),
            ],
            label=seconds_label,
        ),
    ]
    return _page(
        request,
        "overview.html",
        dashboard,
        endpoint,
        counts=counts,
        oldest_due=_oldest_due(counts, counted_at),
        counted_at=_time(counted_at),
        soon=soon,
        delivered_5m=sum(s.forwarded or 0 for s in recent),
        delivered_label=_delivered_label(timeline.span_seconds(now)),
        delivered_live=sum(d.forwarded for d in live),
        live_count=len(live),
        broker=broker,
        flow=flow,
        error_queue=dashboard.error_queue,
        p50=_at_most(lateness.quantile(0.5)),
        p99=_at_most(lateness.quantile(0.99)),
        dispatchers=None if everyone is None else [_dispatcher_row(d, now) for d in everyone],
        breakers=_breakers(everyone or [], now),
        webhooks=await _webhooks(store, live, now),
        elsewhere=_elsewhere(dashboard, everyone or [], now),
        charts=charts,
        window=window,
        windows=list(WINDOWS),
        sample_every=dashboard.sample_every,
    )


@dataclass(frozen=True)
class FlowLook:
    """The limits and pauses of the destinations shown: each one's limit as a line, and its
    pause; ``kept`` is False for a store that keeps none (no column, no buttons)."""

    kept: bool
    limits: dict[str, str] = field(default_factory=dict)
    pauses: dict[str, Pause] = field(default_factory=dict)
    #: Limits and pauses of destinations with nothing stored (a pattern, a drained one).
    others: list[str] = field(default_factory=list)
    #: The names with a limit of their own (not a pattern's): those a "Remove limit" removes.
    exact: set[str] = field(default_factory=set)


async def _flow_look(store: DelayedMessageStore, destinations: list[str]) -> FlowLook:
    if not isinstance(store, FlowControlStore):
        return FlowLook(False)
    try:
        limits, pauses = await store.limits(), await store.paused()
    except ConfigurationError:  # a store of the user's that keeps none
        return FlowLook(False)
    states = destination_states(dict.fromkeys(destinations, 0), limits, pauses)
    return FlowLook(
        True,
        {d.destination: d.limit.said() for d in states if d.limit is not None},
        {d.destination: d.pause for d in states if d.pause is not None},
        [d.destination for d in states[len(destinations) :]],
        {x.destination for x in limits},
    )


FlowChange = Callable[[FlowControlStore, str, str, FormData], Awaitable[str]]


async def _flow_change(request: Request, change: FlowChange, action: Action) -> Response:
    """A change of a destination's limit or pause from the overview: the form's CSRF token
    checked, the change made (``change`` answers the note, or raises ConfigurationError with the
    line that says why not), who made it the dashboard's user."""
    dashboard, form, endpoint, _ = await _form(request)
    if not dashboard.can_change:
        return _read_only()
    back = _safe_back(str(form.get("back") or ""), f"/?endpoint={endpoint}")
    store = dashboard.stores[endpoint]
    if not isinstance(store, FlowControlStore):
        return _done(request, back, "this store keeps no flow-control limits", error=True)
    who = f"{dashboard.credentials.user if dashboard.credentials else 'dashboard'} (dashboard)"
    destination = str(form.get("destination") or "")
    try:
        note = await change(store, destination, who, form)
    except ConfigurationError as error:
        return _done(request, back, str(error), error=True)
    log.info("dashboard: %s in endpoint %s", note, endpoint)
    await _audit(request, dashboard, endpoint, action, destination, detail=note)
    return _done(request, back, note)


async def _pause(store: FlowControlStore, name: str, who: str, form: FormData) -> str:
    if not await store.pause_destination(Pause(name, who, SYSTEM.now(), str(form.get("reason") or ""))):
        raise ConfigurationError(f"{name!r} is paused already")
    return f"paused {name}"


async def _resume(store: FlowControlStore, name: str, who: str, form: FormData) -> str:
    if not await store.resume_destination(check_destination(name)):
        raise ConfigurationError(f"{name!r} is not paused")
    return f"resumed {name}"


async def _limit(store: FlowControlStore, name: str, who: str, form: FormData) -> str:
    rate, most = str(form.get("rate") or "").strip(), str(form.get("concurrency") or "").strip()
    if most and not most.isdigit():
        raise ConfigurationError(f"concurrency {most!r} is not a whole number")
    limit = Limit(
        name, Rate.parse(rate) if rate else None, int(most) if most else None, None, who, SYSTEM.now()
    )
    await store.set_limit(limit)
    return f"limited {name} to {limit.said()}"


async def _unlimit(store: FlowControlStore, name: str, who: str, form: FormData) -> str:
    if not await store.remove_limit(check_destination(name)):
        raise ConfigurationError(f"{name!r} has no limit of its own")
    return f"removed the limit of {name}"


async def destinations_limit(request: Request) -> Response:
    return await _flow_change(request, _limit, Action.LIMIT_SET)


async def destinations_unlimit(request: Request) -> Response:
    return await _flow_change(request, _unlimit, Action.LIMIT_REMOVE)


async def destinations_pause(request: Request) -> Response:
    return await _flow_change(request, _pause, Action.PAUSE)


async def destinations_resume(request: Request) -> Response:
    return await _flow_change(request, _resume, Action.RESUME)


def _delivered_label(sampled: float) -> str:
    """What the sampled delivered count covers: five minutes, or as long as the dashboard has
    sampled (a count since it started is not one of the last five minutes)."""
    if sampled >= 300:
        return "delivered, last 5 min"
    return f"delivered since this dashboard started sampling, {int(sampled)} s ago"


async def _due_soon(store: DelayedMessageStore, now: datetime) -> list[tuple[str, int]]:
    """How many fall due in the next minute, hour and day (not counting those due already)."""
    if isinstance(store, DueCounter):  # an index range each, not a count of everything
        due_now = await store.count_due(now)
        return [(label, await store.count_due(now + ahead) - due_now) for label, ahead in HORIZONS]
    due_now = (await store.counts(now)).due
    return [(label, (await store.counts(now + ahead)).due - due_now) for label, ahead in HORIZONS]


def _oldest_due(counts: StoreCounts, counted_at: datetime) -> str:
    """How long the oldest due message had waited when ``counts`` were taken: measured against the
    count's own time, as the metric is (against now, a count 10 s old showed a 10 s wait that
    was not there)."""
    waited = counts.oldest_due_waited(counted_at)
    return "none due" if waited is None else readable_duration(waited)


def _dispatcher_row(d: DispatcherInfo, now: datetime) -> dict[str, Any]:
    status = d.status(now)
    return {
        "id": d.dispatcher_id,
        "host": d.host,
        "pid": d.pid,
        "version": d.version,
        "mode": d.mode,
        "transport": d.transport,
        "status": status,
        "started": _time(d.started_at),
        "last_seen": readable_duration((now - d.last_seen).total_seconds()) + " ago",
        "last_batch": _time(d.last_batch_at),
        "forwarded": d.forwarded,
        "in_flight": d.in_flight,
        "claims": describe_claims(d, now) if status == "gone" else "",
    }


def _breakers(dispatchers: list[DispatcherInfo], now: datetime) -> list[tuple[str, str]]:
    """Each breaker of the live dispatchers: closed, or armed (failing) for how long on which."""
    seen: dict[str, list[str]] = {}
    for d in dispatchers:
        if d.status(now) != "live":
            continue
        for name, armed in d.breakers.items():
            seen.setdefault(name, [])
            if armed is not None:
                seen[name].append(f"armed {armed:.0f} s on {d.dispatcher_id}")
    return [(name, "; ".join(states) or "closed") for name, states in sorted(seen.items())]


#: The outcomes an endpoint's row shows, in this order: delivered, refused, failing.
WEBHOOK_OUTCOMES = ("2xx", "4xx", ADDRESS_REFUSED, "5xx", TIMED_OUT, UNREACHABLE)


@dataclass(frozen=True)
class WebhookRow:
    """One webhook endpoint on the overview: its health and its attempts by outcome."""

    name: str
    health: str
    counts: tuple[int, ...]
    last: str


async def _webhooks(store: object, live: list[DispatcherInfo], now: datetime) -> list[WebhookRow]:
    """Each registered endpoint (and any a live dispatcher has tried since it started): what the
    live dispatchers' attempts came to, and its health by the latest of them."""
    seen: dict[str, dict[str, int | str]] = {}
    for d in live:
        for name, counts in d.webhooks.items():
            row = seen.setdefault(name, {})
            for outcome, value in counts.items():
                if outcome not in ("last", "last_at", "health") and isinstance(value, int):
                    row[outcome] = int(row.get(outcome, 0)) + value
            if int(counts.get("last_at", -1)) >= int(row.get("last_at", -1)):
                row.update({k: counts[k] for k in ("last", "last_at", "health") if k in counts})
    registered = [w.name for w in await store.webhooks()] if isinstance(store, WebhookStore) else []
    rows = []
    for name in sorted(set(registered) | set(seen)):
        row = seen.get(name, {})
        at = row.get("last_at")
        last = "no requests yet"
        if isinstance(at, int) and at > 0:
            ago = max(0, int(now.timestamp()) - at)
            last = f"{row.get('last')} {ago:,} s ago"
        tally = tuple(int(row.get(outcome, 0)) for outcome in WEBHOOK_OUTCOMES)
        rows.append(WebhookRow(name, str(row.get("health", "unknown")), tally, last))
    return rows


def _when(text: str, what: str) -> datetime | None:
    """A time from a search box: ISO 8601, with an offset or taken as UTC."""
    if not text.strip():
        return None
    return check_due_time(parse_time(text, naive_is_utc=True), what)


async def messages(request: Request) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    store = dashboard.stores[endpoint]
    q = request.query_params
    form = {k: q.get(k, "") for k in ("id", "destination", "due_after", "due_before", "group", "failing")}
    problem = None
    found: list[DelayedMessage] = []
    next_link = None
    try:
        limit = min(max(int(q.get("limit") or PAGE), 1), MAX_PAGE)
        if form["id"].strip():
            one = await store.get(form["id"].strip())
            found = [one] if one else []
        else:
            query = ListQuery(
                destination=form["destination"].strip() or None,
                due_after=_when(form["due_after"], "due after"),
                due_before=_when(form["due_before"], "due before"),
                min_failures=1 if form["failing"] else 0,
                group=form["group"].strip() or None,
                limit=limit,
                after=read_cursor(q["after"]) if q.get("after") else None,
            )
            page = await store.list(query)
            found = page.messages
            if page.next_cursor:
                kept = {k: v for k, v in form.items() if v} | {"endpoint": endpoint, "limit": str(limit)}
                next_link = "/messages?" + urlencode(kept | {"after": cursor_text(page.next_cursor)})
    except (DuetimeError, ValueError) as error:
        problem = one_line(error)
    now = SYSTEM.now()
    rows = [
        {
            "id": m.message_id,
            "destination": m.destination,
            "due": _time(m.due_at),
            "in": readable_duration((m.due_at - now).total_seconds()) if m.due_at > now else "due",
            "failures": m.failure_count,
            "group": m.group or "",
        }
        for m in found
    ]
    return _page(
        request,
        "messages.html",
        dashboard,
        endpoint,
        form=form,
        rows=rows,
        next_link=next_link,
        problem=problem,
    )


async def message(request: Request) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    message_id = request.query_params.get("id", "")
    found = await dashboard.stores[endpoint].get(message_id) if message_id else None
    if found is None:
        return _page(request, "message.html", dashboard, endpoint, m=None, message_id=message_id)
    body = found.body[:BODY_SHOWN]
    sealed = describe(found.headers)
    try:
        shown, kind = (sealed, "encrypted") if sealed else (body.decode(), "text")
    except UnicodeDecodeError:
        shown, kind = body.hex(" ", 16), "hex"
    headers = heapq.nsmallest(HEADERS_SHOWN + 1, found.headers.items())  # not all of a million sorted
    total, size = len(found.headers), len(found.body)
    summary = found.with_changes(headers={}, body=b"")
    del found  # the page needs only what it shows: a million headers go now, not after rendering
    headers_cut = total > HEADERS_SHOWN
    return _page(
        request,
        "message.html",
        dashboard,
        endpoint,
        m=summary,
        message_id=message_id,
        body=shown,
        body_kind=kind,
        body_cut=size > BODY_SHOWN,
        size=size,
        headers=[(k, _cut(v)) for k, v in headers[:HEADERS_SHOWN]],
        headers_cut=total - HEADERS_SHOWN if headers_cut else 0,
    )


class Refused(Exception):
    """A change request that is not carried out, with the status and the line it answers."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


async def _form(request: Request) -> tuple[Dashboard, FormData, str, str]:
    """The change's form, once its CSRF token is checked; a form that cannot be read, or one
    without this browser's token, is :class:`Refused` before anything is looked at."""
    dashboard: Dashboard = request.app.state.dashboard
    try:
        form = await request.form(max_files=0, max_fields=2000)
    except BodyTooLarge as error:
        raise Refused(413, str(error)) from None
    except (MultiPartException, HTTPException, ValueError) as error:
        detail = getattr(error, "detail", None) or getattr(error, "message", None) or str(error)
        raise Refused(400, "Could not read the form: " + " ".join(str(detail).split())[:200]) from None
    given = form.get(CSRF_FIELD)
    if not isinstance(given, str) or not token_matches(request.scope, given):
        raise Refused(
            403,
            "Refused: the form's CSRF token did not match this browser's. Reload the page and try "
            "again (a form from another site, or from before the dashboard restarted without "
            "DUETIME_DASHBOARD_SECRET, has no valid token).",
        )
    endpoint = str(form.get("endpoint") or "")
    if endpoint not in dashboard.stores:
        endpoint = next(iter(dashboard.stores))
    back = _safe_back(str(form.get("back") or ""), f"/messages?endpoint={endpoint}")
    return dashboard, form, endpoint, back


def _read_only() -> Response:
    return PlainTextResponse(
        "This dashboard is read-only (started with --read-only, or no DUETIME_DASHBOARD_PASSWORD is set).\n",
        403,
    )


async def cancel(request: Request) -> Response:
    dashboard, form, endpoint, back = await _form(request)
    if not dashboard.can_change:
        return _read_only()
    message_id = str(form.get("id") or "")
    try:
        done = await dashboard.stores[endpoint].cancel(message_id)
    except MessageInFlight:
        return _done(
            request, back, f"{message_id} is being delivered right now; it was not cancelled", error=True
        )
    if not done:
        return _done(
            request, back, f"no stored message {message_id} (delivered or cancelled already)", error=True
        )
    log.info("dashboard: cancelled %s in endpoint %s", message_id, endpoint)
    await _audit(request, dashboard, endpoint, Action.CANCEL, message_id, ids=[message_id])
    return _done(request, back, f"cancelled {message_id}")


async def reschedule(request: Request) -> Response:
    dashboard, form, endpoint, back = await _form(request)
    if not dashboard.can_change:
        return _read_only()
    return await _move(
        request, dashboard, endpoint, back, str(form.get("id") or ""), str(form.get("when") or "")
    )


async def send_now(request: Request) -> Response:
    dashboard, form, endpoint, back = await _form(request)
    if not dashboard.can_change:
        return _read_only()
    return await _move(request, dashboard, endpoint, back, str(form.get("id") or ""), "0")


async def _move(
    request: Request, dashboard: Dashboard, endpoint: str, back: str, message_id: str, when: str
) -> Response:
    """Reschedule to ``when``: a delay from now (10m, 1h30m) or an ISO 8601 time."""
    now = SYSTEM.now()
    try:
        due = now + parse_duration(when) if not ("-" in when or ":" in when) else _when(when, "new due time")
        if due is None:
            raise ValueError("give a delay (10m, 2h) or a time (2026-12-01T09:00:00+00:00)")
        due = check_due_time(due, "new due time")
        done = await dashboard.stores[endpoint].reschedule(message_id, due)
    except (DuetimeError, ValueError) as error:
        return _done(request, back, f"not rescheduled: {one_line(error)}", error=True)
    if not done:
        return _done(
            request, back, f"no stored message {message_id} (delivered or cancelled already)", error=True
        )
    log.info("dashboard: rescheduled %s in endpoint %s to %s", message_id, endpoint, due.isoformat())
    said = {"ids": [message_id], "detail": f"due {due.isoformat()}"}
    await _audit(request, dashboard, endpoint, Action.RESCHEDULE, message_id, **said)
    what = "due now" if due <= now else f"due {_time(due)}"
    return _done(request, back, f"rescheduled {message_id}: {what}")


def _cut(value: str, limit: int = HEADER_VALUE_SHOWN) -> str:
    return value if len(value) <= limit else f"{value[:limit]}… ({len(value) - limit:,} more characters)"


def _header_time(value: str) -> str:
    """A time a header holds (ISO 8601), as every page shows times; as written when unreadable."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return _time(moment) if moment.tzinfo is not None else value


def _error_row(item: ReceivedMessage) -> dict[str, Any]:
    h = item.headers
    return {
        "id": item.message_id,
        "destination": goes_to(item) or "",
        "error": h.get(ERROR_MESSAGE, ""),
        "type": h.get(ERROR_TYPE, ""),
        "stack": _cut(h.get(ERROR_STACKTRACE, ""), BODY_SHOWN),
        "attempts": h.get(ERROR_ATTEMPTS, ""),
        "failed_at": _header_time(h.get(ERROR_TIME, "")),
        "headers": [(k, _cut(v, 300)) for k, v in sorted(h.items())[:HEADERS_SHOWN]],
        "size": len(item.body),
        "kept": kept_in_store(h),
    }


def _elsewhere(dashboard: Dashboard, everyone: list[DispatcherInfo], now: datetime) -> str | None:
    """Said on a page when the endpoint's dispatchers deliver to another transport than the one
    the dashboard looks at (its error queue and queues would be the wrong ones)."""
    theirs = delivered_elsewhere(dashboard.transport_url, everyone, now)
    if not theirs:
        return None
    return elsewhere_note(dashboard.transport_url, theirs, "start the dashboard with --transport")


@contextlib.asynccontextmanager
async def _error_transport(dashboard: Dashboard) -> AsyncIterator[InspectableQueue]:
    """The transport, opened for one request: closing it puts back whatever was taken and not
    acknowledged (a retry cut short by an error loses nothing)."""
    t = open_error_transport(dashboard.transport_url)
    await t.start()
    try:
        yield t
    finally:
        await t.close()


async def errors(request: Request) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    destination = request.query_params.get("destination", "").strip()
    limit = PAGE * 4
    rows: list[dict[str, Any]] = []
    depth = whole = 0
    problem = None
    try:
        async with _error_transport(dashboard) as t:
            whole = await t.depth(dashboard.error_queue)
            seen = mine(await t.peek(dashboard.error_queue, LOOKED_AT), endpoint)
            depth = len(seen)
            rows = [_error_row(m) for m in seen if not destination or goes_to(m) == destination][:limit]
    except ConfigurationError as error:  # a transport that cannot show its queues
        problem = str(error)
    except Exception as error:
        problem = f"could not read the error queue: {one_line(error)}"
    destinations = sorted({r["destination"] for r in rows if r["destination"]})
    store = dashboard.stores[endpoint]
    try:
        everyone = await store.dispatchers() if isinstance(store, DispatcherRegistry) else []
    except Exception:  # the note is a courtesy; the page stands without it
        everyone = []
    return _page(
        request,
        "errors.html",
        dashboard,
        endpoint,
        rows=rows,
        depth=depth,
        among=f" among the first {LOOKED_AT:,} of its {whole:,}" if whole > LOOKED_AT else "",
        destination=destination,
        destinations=destinations,
        problem=problem,
        elsewhere=_elsewhere(dashboard, everyone, SYSTEM.now()),
    )


async def _error_action(request: Request, retry: bool) -> Response:
    dashboard, form, endpoint, _ = await _form(request)
    back = _safe_back(str(form.get("back") or ""), f"/errors?endpoint={endpoint}")
    if not dashboard.can_change:
        return _read_only()
    ids = [str(i) for i in form.getlist("id")]
    every = bool(form.get("all"))
    destination = str(form.get("destination") or "") or None
    try:
        delay = parse_duration(str(form.get("in") or "0"))
        async with _error_transport(dashboard) as t:
            wanted, absent = await chosen(t, dashboard.error_queue, ids, every, destination, endpoint)
            taken, gone = await take(t, dashboard.error_queue, wanted)
            missing = absent + gone
            if retry:
                actor = _actor(request, dashboard)
                done = await send_back(dashboard.stores[endpoint], t, taken, delay=delay, actor=actor)
                note = f"sent {done.sent} back for another try" + (
                    f" ({done.already} were stored already)" if done.already else ""
                )
                if done.nowhere:
                    note += f"; {len(done.nowhere)} do not say where they were going and stay (retry them with `duetime errors retry --to`)"
            else:
                discarded = await discard(dashboard.stores[endpoint], t, taken, _actor(request, dashboard))
                note = f"discarded {discarded}"
    except (DuetimeError, ValueError) as error:
        return _done(request, back, f"nothing done: {one_line(error)}", error=True)
    if missing:
        note += f"; {len(missing)} were no longer there"
    log.info("dashboard: %s (error queue %s)", note, dashboard.error_queue)
    return _done(request, back, note)


async def errors_retry(request: Request) -> Response:
    return await _error_action(request, retry=True)


async def errors_discard(request: Request) -> Response:
    return await _error_action(request, retry=False)


#: Schedules on one page of the recurring page.
SCHEDULES_PER_PAGE = 100


async def recurring(request: Request) -> Response:
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    store = dashboard.stores[endpoint]
    if not isinstance(store, RecurringStore):
        return _page(
            request,
            "recurring.html",
            dashboard,
            endpoint,
            rows=[],
            problem="This store keeps no recurring schedules.",
        )
    after = request.query_params.get("after") or ""
    found = await store.list_schedules(after, SCHEDULES_PER_PAGE + 1)
    shown = found[:SCHEDULES_PER_PAGE]
    server = await store.server_time() if isinstance(store, ServerClock) else None
    now = server or SYSTEM.now()  # the next tick as the dispatchers reckon it
    rows = [
        {
            "id": s.schedule_id,
            "group": group_of(s.schedule_id),
            "destination": s.destination,
            "when": s.recurrence.describe(),
            "state": s.state() if s.set_aside is None else f"{s.state()}: {s.set_aside}",
            "next": _time(s.next_planned(now)),
            "last": _time(s.last_planned),
            "planned": f"{s.ticks_planned:,}",
            "missed": f"{s.ticks_missed:,}",
            "actions": [
                ("resume", "Resume") if s.paused or s.set_aside is not None else ("pause", "Pause"),
                ("trigger", "Send one now"),
            ],
        }
        for s in shown
    ]
    more = len(found) > SCHEDULES_PER_PAGE and shown
    next_link = (
        f"/recurring?{urlencode({'endpoint': endpoint, 'after': shown[-1].schedule_id})}" if more else None
    )
    return _page(request, "recurring.html", dashboard, endpoint, rows=rows, next_link=next_link, problem=None)


async def _schedule_action(request: Request, action: str) -> Response:
    dashboard, form, endpoint, _ = await _form(request)
    if not dashboard.can_change:
        return _read_only()
    back = _safe_back(str(form.get("back") or ""), f"/recurring?endpoint={endpoint}")
    schedule_id = str(form.get("id") or "")
    store = dashboard.stores[endpoint]
    if not isinstance(store, RecurringStore):
        return _done(request, back, "this store keeps no recurring schedules", error=True)
    said: dict[str, Any] = {}
    try:
        if action == "pause":
            await store.pause_schedule(schedule_id)
        elif action == "resume":
            await store.resume_schedule(schedule_id)
        else:
            said["ids"] = [(await store.trigger_schedule(schedule_id)).message_id]
    except (ScheduleNotFound, InvalidSchedule) as error:
        return _done(request, back, str(error), error=True)
    done = {"pause": "paused", "resume": "resumed", "trigger": "sent one tick of"}[action]
    log.info("dashboard: %s %s in endpoint %s", done, schedule_id, endpoint)
    recorded = {"pause": Action.SCHEDULE_PAUSE, "resume": Action.SCHEDULE_RESUME}.get(
        action, Action.SCHEDULE_TRIGGER
    )
    await _audit(request, dashboard, endpoint, recorded, schedule_id, **said)
    return _done(request, back, f"{done} {schedule_id}")


async def recurring_pause(request: Request) -> Response:
    return await _schedule_action(request, "pause")


async def recurring_resume(request: Request) -> Response:
    return await _schedule_action(request, "resume")


async def recurring_trigger(request: Request) -> Response:
    return await _schedule_action(request, "trigger")


#: Entries on one page of the audit page.
AUDIT_PER_PAGE = 100


async def audit_page(request: Request) -> Response:
    """The audit trail, newest first, by actor or action, a page at a time."""
    dashboard: Dashboard = request.app.state.dashboard
    endpoint = _endpoint(request, dashboard)
    store = dashboard.stores[endpoint]
    q = request.query_params
    form = {k: q.get(k, "").strip() for k in ("actor", "action")}
    problem, next_link = None, None
    entries: list[AuditEntry] = []
    try:
        if not isinstance(store, AuditStore):
            raise ConfigurationError("This store keeps no audit trail.")
        query = AuditQuery(
            actor=form["actor"] or None,
            action=Action.of(form["action"]).value if form["action"] else None,
            limit=AUDIT_PER_PAGE,
            after=q.get("after") or None,
        )
        entries, cursor = await store.audit_entries(query)
        if cursor is not None:
            kept = {k: v for k, v in form.items() if v} | {"endpoint": endpoint}
            next_link = "/audit?" + urlencode(kept | {"after": cursor})
    except (DuetimeError, ValueError) as error:
        problem = one_line(error)
    return _page(
        request,
        "audit.html",
        dashboard,
        endpoint,
        form=form,
        entries=entries,
        actions=[a.value for a in Action],
        next_link=next_link,
        problem=problem,
    )


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def metrics(request: Request) -> Response:
    """The dashboard's own counts (its logins), for Prometheus; the dispatcher's are on ``run``'s."""
    return PlainTextResponse(
        request.app.state.login_throttle.metrics(), media_type="text/plain; version=0.0.4"
    )


Handler = Callable[[Request], Awaitable[Response]]


def a_few_at_a_time(handler: Handler) -> Handler:
    """Message pages, a few at a time (a message may be huge): a request waits for its turn at
    most half the answer time, then is told the dashboard is busy (503, Retry-After). The wait is
    outside ``handler``'s own deadline (:func:`answering`), so a page that waited its turn is not
    then told the store did not answer in time."""

    @functools.wraps(handler)
    async def in_turn(request: Request) -> Response:
        turns: asyncio.Semaphore = request.app.state.message_pages
        try:
            await asyncio.wait_for(turns.acquire(), request.app.state.dashboard.answer_within / 2)
        except TimeoutError:
            return PlainTextResponse(
                "Busy: other message pages are being prepared (some messages are very large); try "
                "again in a moment.\n",
                503,
                headers={"Retry-After": "5"},
            )
        try:
            return await handler(request)
        finally:
            turns.release()

    return in_turn


def answering(handler: Handler) -> Handler:
    """A page or action whose store or broker fails answers 503 with the reason on one line (and
    logs that line), never a stack trace; the next request tries again."""

    @functools.wraps(handler)
    async def guarded(request: Request) -> Response:
        seconds = request.app.state.dashboard.answer_within
        try:
            return await within(handler(request), seconds, f"{request.method} {request.url.path}")
        except Refused as refused:
            log.warning("dashboard: %s %s refused: %s", request.method, request.url.path, refused)
            return PlainTextResponse(f"{refused}\n", refused.status)
        except DeadlineExceeded as error:
            log.warning("dashboard: %s", error)
            changing = request.method != "GET"
            return PlainTextResponse(
                f"The store or the transport did not answer within {seconds:g} s (a network partition, "
                "or an overload?).\n"
                + (
                    "This request may or may not have been carried out: look before trying it again.\n"
                    if changing
                    else "Nothing was changed by this request; try again in a moment.\n"
                ),
                503,
            )
        except Exception as error:
            reason = one_line(error)
            log.warning("dashboard: %s %s failed: %s", request.method, request.url.path, reason)
            return PlainTextResponse(
                f"The store or the transport did not answer: {reason}\nNothing was changed by this "
                "request; try again in a moment.\n",
                503,
            )

    return guarded


def create_app(dashboard: Dashboard, *, secret: str, ready: Callable[[], None] = lambda: None) -> Any:
    """The ASGI app: pages, actions, the sampler running beside them, login and CSRF around.
    ``ready`` is called once the server has started (its stop signals are handled from then on)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.get_running_loop().create_task(dashboard.sample_forever())
        ready()
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    routes = [
        Route("/", answering(overview)),
        Route("/messages", answering(messages)),
        Route("/message", a_few_at_a_time(answering(message))),
        Route("/errors", answering(errors)),
        Route("/recurring", answering(recurring)),
        Route("/audit", answering(audit_page)),
        Route("/healthz", healthz),
        Route("/metrics", metrics),
        Route("/actions/cancel", answering(cancel), methods=["POST"]),
        Route("/actions/reschedule", answering(reschedule), methods=["POST"]),
        Route("/actions/send-now", answering(send_now), methods=["POST"]),
        Route("/errors/retry", answering(errors_retry), methods=["POST"]),
        Route("/errors/discard", answering(errors_discard), methods=["POST"]),
        Route("/recurring/pause", answering(recurring_pause), methods=["POST"]),
        Route("/recurring/resume", answering(recurring_resume), methods=["POST"]),
        Route("/recurring/trigger", answering(recurring_trigger), methods=["POST"]),
        Route("/destinations/pause", answering(destinations_pause), methods=["POST"]),
        Route("/destinations/limit", answering(destinations_limit), methods=["POST"]),
        Route("/destinations/unlimit", answering(destinations_unlimit), methods=["POST"]),
        Route("/destinations/resume", answering(destinations_resume), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                SessionMiddleware, secret_key=secret, session_cookie="duetime_note", same_site="strict"
            )
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    app.state.login_throttle = LoginThrottle()
    app.state.message_pages = asyncio.Semaphore(MESSAGE_PAGES_AT_ONCE)
    inner = (
        RequireLogin(app, dashboard.credentials, app.state.login_throttle, secret=secret)
        if dashboard.credentials
        else app
    )
    return Guard(inner, secret)
