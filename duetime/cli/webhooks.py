"""`duetime webhooks add | list | rotate | remove`: the HTTP endpoints messages are delivered to."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

import typer

from duetime.audit import Action
from duetime.cli.common import DEFAULT_STORE, EndpointOpt, StoreOpt, app, changing, with_capability
from duetime.cli.terminal import console, err, fail, table
from duetime.cli.terminal import show as show_table
from duetime.clock import SYSTEM
from duetime.inputs.urls import remember_secret
from duetime.interfaces import WebhookStore
from duetime.settings import DEFAULT_ENDPOINT
from duetime.webhooks import (
    STANDARD_SCHEDULE_TEXT,
    WebhookEndpoint,
    check_header_names,
    check_networks,
    check_secret,
    new_secret,
    read_schedule,
)

T = TypeVar("T")

webhooks_app = typer.Typer(
    help="The HTTP endpoints messages are delivered to: a message whose destination is a webhook's "
    "name is POSTed, signed, to its URL by `duetime run --transport webhooks://` (or a route to "
    "webhooks://). Kept in the store, so every dispatcher of it delivers to the same ones.",
    no_args_is_help=True,
)
app.add_typer(webhooks_app, name="webhooks")


def _with_webhooks(store: str, endpoint: str, work: Callable[[WebhookStore], Awaitable[T]]) -> T:
    return with_capability(store, endpoint, WebhookStore, "webhook endpoints", work)  # type: ignore[type-abstract]


def _given(secret: str | None) -> str | None:
    """The secret given (``-``: read from standard input, out of the process list), kept out of
    every line printed from now on."""
    if secret == "-":
        secret = sys.stdin.readline().strip()
    if secret:
        remember_secret(secret)
    return secret or None


def shown_url(url: str) -> str:
    """The URL without its query (a token is often kept there): what lists and logs show."""
    parts = urlsplit(url)
    return parts._replace(query="***" if parts.query else "", fragment="").geturl()


@webhooks_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The destination name messages are sent to (billing).")],
    url: Annotated[
        str,
        typer.Argument(
            help="Where they are POSTed: https://billing.example.com/hooks. Or a pattern "
            "(https://*.partners.example/hooks/*): then a message whose destination is a URL it "
            "allows is POSTed to that URL."
        ),
    ],
    secret: Annotated[
        str | None,
        typer.Option(
            help="The signing secret (whsec_ and base64), as the receiver has it; - reads it from "
            "standard input. Left out, one is made and printed once, as the last line.",
            show_default=False,
        ),
    ] = None,
    header: Annotated[
        list[str],
        typer.Option("--header", help="A message header to pass on as an HTTP header (repeatable)."),
    ] = [],  # noqa: B006
    allow: Annotated[
        list[str],
        typer.Option(
            "--allow",
            help="An internal address or network the URL may reach on purpose (127.0.0.1, "
            "10.0.0.0/8, ::1); repeatable. Without it, loopback, private, link-local and cloud "
            "metadata addresses are refused.",
        ),
    ] = [],  # noqa: B006
    retry_schedule: Annotated[
        str,
        typer.Option(
            help="The waits after each failed attempt (a 5xx, 408, 429, a timeout); out of them, "
            "the error queue. 'none' for no retries. Default: Standard Webhooks' schedule.",
            show_default=False,
        ),
    ] = STANDARD_SCHEDULE_TEXT,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take in all.")] = 10.0,
    connect_timeout: Annotated[float, typer.Option(help="Seconds connecting may take.")] = 5.0,
    max_connections: Annotated[int, typer.Option(help="Requests in flight to it at once, at most.")] = 10,
    follow_redirects: Annotated[
        bool, typer.Option(help="Follow a redirect (each address checked as the first is).")
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Register a webhook endpoint: messages to NAME are POSTed, signed, to URL.

    Each request carries the Standard Webhooks headers (webhook-id is the message id, for the
    receiver to drop a repeat by), so the receiver checks it with the standardwebhooks library
    and the secret.

      duetime webhooks add billing https://billing.example.com/hooks --header customer-id

    With a URL pattern, the endpoint delivers messages whose destination is a URL: '*.' first
    in the host is any subdomain, '*' in the path any characters.

      duetime webhooks add partners 'https://*.partners.example/hooks/*'
      duetime schedule https://acme.partners.example/hooks/order '{"id": 7}' --in 1h
    """
    secret = _given(secret)
    made = secret is None
    hook = WebhookEndpoint(
        name=name,
        url=url,
        secrets=(check_secret(secret) if secret is not None else new_secret(),),
        created_at=SYSTEM.now(),
        headers=check_header_names(header),
        allow=check_networks(allow),
        retry_schedule=read_schedule(retry_schedule),
        timeout=timeout,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        follow_redirects=follow_redirects,
    )
    said = {"detail": f"to {shown_url(url)}"}
    _with_webhooks(
        store, endpoint, changing(lambda s: s.add_webhook(hook), Action.WEBHOOK_ADD, name, lambda _: said)
    )
    if made:
        err.print(f"added webhook {name!r} -> {shown_url(url)}; its signing secret follows, shown this once:")
        sys.stdout.write(hook.secrets[0] + "\n")
    else:
        console.print(f"added webhook {name!r} -> {shown_url(url)}")


@webhooks_app.command("list")
def list_(
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Every webhook endpoint, its URL's query hidden and never a secret.

    Shown: the name, the URL, how many secrets sign, the headers passed on, the networks it may
    reach, how many retries and the timeout.
    """
    rows = [
        {
            "name": w.name,
            "url": shown_url(w.url),
            "secrets": len(w.secrets),
            "headers": list(w.headers),
            "allow": list(w.allow),
            "retry_schedule": list(w.retry_schedule),
            "timeout": w.timeout,
            "max_connections": w.max_connections,
            "follow_redirects": w.follow_redirects,
            "created_at": w.created_at.isoformat(),
        }
        for w in _with_webhooks(store, endpoint, lambda s: s.webhooks())
    ]
    if as_json:
        sys.stdout.writelines(json.dumps(r) + "\n" for r in rows)
        return
    if not rows:
        err.print("no webhooks (duetime webhooks add NAME URL registers one)")
        return
    grid = table("name", "url", "secrets", "headers", "allow", "retries", "timeout")
    for r in rows:
        grid.add_row(
            str(r["name"]),
            str(r["url"]),
            str(r["secrets"]),
            ",".join(r["headers"]) or "-",  # type: ignore[arg-type]
            ",".join(r["allow"]) or "-",  # type: ignore[arg-type]
            str(len(r["retry_schedule"])),  # type: ignore[arg-type]
            f"{r['timeout']:g}s",
        )
    show_table(grid)


@webhooks_app.command("rotate")
def rotate(
    name: Annotated[str, typer.Argument(help="The webhook's name.")],
    secret: Annotated[
        str | None,
        typer.Option(help="The new secret; left out, one is made and printed once.", show_default=False),
    ] = None,
    finish: Annotated[
        bool,
        typer.Option(
            "--finish",
            help="End a rotation: only the newest secret signs from now on (every receiver has it).",
        ),
    ] = False,
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Rotate the signing secret without a moment when a receiver refuses a request.

    The new secret and the one before it both sign each request until `--finish` (receivers
    accept either), so give the new one to the receiver, then finish.

      duetime webhooks rotate billing            # prints the new secret
      duetime webhooks rotate billing --finish   # once the receiver uses it
    """
    secret = _given(secret)
    made = secret is None and not finish
    new = check_secret(secret) if secret is not None else new_secret()

    async def change(s: WebhookStore) -> WebhookEndpoint | bool:
        hook = next((w for w in await s.webhooks() if w.name == name), None)
        if hook is None:
            return False
        changed = hook.without_old_secret() if finish else hook.rotated(new)
        return changed if await s.change_webhook(changed) else False

    said = {"detail": "finished: the newest secret only" if finish else "a new secret beside the one before"}
    hook = _with_webhooks(store, endpoint, changing(change, Action.WEBHOOK_ROTATE, name, lambda _: said))
    if hook is False:
        raise fail(f"no webhook named {name!r} (see duetime webhooks list)")
    if finish:
        console.print(f"webhook {name!r} now signs with its newest secret only")
    elif made:
        err.print(f"webhook {name!r} signs with a new secret and the one before it; the new one follows:")
        sys.stdout.write(new + "\n")
    else:
        console.print(f"webhook {name!r} signs with the new secret and the one before it")


@webhooks_app.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="The webhook's name.")],
    store: StoreOpt = DEFAULT_STORE,
    endpoint: EndpointOpt = DEFAULT_ENDPOINT,
) -> None:
    """Forget a webhook and its secrets.

    Messages still sent to its name go to the error queue (no such destination) until it is
    added again.
    """
    if not _with_webhooks(
        store, endpoint, changing(lambda s: s.remove_webhook(name), Action.WEBHOOK_REMOVE, name)
    ):
        raise fail(f"no webhook named {name!r} (see duetime webhooks list)")
    console.print(f"removed {name}")
