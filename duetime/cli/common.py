"""What every command shares: the app, its options, and how a URL becomes a store or a transport."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Annotated, Any, TypeVar

import typer

from duetime import audit
from duetime.audit import Action, Actor, Via
from duetime.cli.terminal import err, say
from duetime.client import record
from duetime.clock import SYSTEM
from duetime.errors import ConfigurationError, MessageRefused, command
from duetime.inputs.durations import parse_duration, parse_time
from duetime.inputs.identifiers import check_name
from duetime.inputs.urls import redact
from duetime.interfaces import InspectableQueue, WebhookStore
from duetime.message import DelayedMessage, check_due_time, refused_destination
from duetime.observability.logs import LogFormat, configure
from duetime.operations.carry import CarryRule as CarryRules
from duetime.registry import (
    DEFAULT_STORE_URL,
    check_store_exists,
    default_transport,
    open_ready_store,
    open_transport,
)
from duetime.settings import (
    ACTOR_VARIABLE,
    DEFAULT_ENDPOINT,
    ENDPOINT_VARIABLE,
    ERROR_QUEUE_VARIABLE,
    OTHER_VARIABLES,
    STORE_VARIABLE,
    TRANSPORT_VARIABLE,
    DelayedDeliverySettings,
    check_option_value,
    misspelt,
    option_value,
    option_variable_names,
    option_variables,
    setting_variables,
    variable,
)
from duetime.webhooks import endpoint_for_url, is_url

T = TypeVar("T")
DEFAULT_STORE = DEFAULT_STORE_URL

app = typer.Typer(
    help=(
        "duetime keeps delayed messages in a durable store and forwards each to its destination "
        "when it is due.\n\nStart with `duetime demo`. Then: `duetime setup`, `duetime queues declare "
        "orders`, `duetime schedule orders 'hello' --in 10s`, and `duetime run` to deliver."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
errors_app = typer.Typer(help="Inspect the error queue and send messages back for another try.")
queues_app = typer.Typer(
    help="Declare and consume the queues duetime delivers into (SQL queues, RabbitMQ, Redis, NATS)."
)
app.add_typer(errors_app, name="errors")
app.add_typer(queues_app, name="queues")

StoreOpt = Annotated[
    str,
    typer.Option("--store", help="Where delayed messages are kept, e.g. sqlite:///duetime.db."),
]
EndpointOpt = Annotated[
    str,
    typer.Option("--endpoint", help="The endpoint; its table is <endpoint>.delayed."),
]


def _queue_name(name: str | None) -> str | None:
    try:
        return None if name is None else check_name("error queue", name)
    except ConfigurationError as error:
        raise typer.BadParameter(str(error)) from None


#: The error queue, read the same way by every command that uses it (run, setup's declare via the
#: settings, errors, the dashboard): the flag, else DUETIME_ERROR_QUEUE, else "error".
ErrorQueueOpt = Annotated[
    str,
    typer.Option(
        "--error-queue",
        callback=_queue_name,
        help="The error queue's name (the dispatchers' --error-queue).",
    ),
]
#: The flags whose value may come from the environment, and the variable each reads: every command
#: that takes one of them reads it the same way (a test walks every command).
SETTING_VARIABLES = {
    "--store": STORE_VARIABLE,
    "--transport": TRANSPORT_VARIABLE,
    "--endpoint": ENDPOINT_VARIABLE,
    "--error-queue": ERROR_QUEUE_VARIABLE,
}
InOpt = Annotated[str | None, typer.Option("--in", help="Delay: 90, 1.5s, 10m, 1h30m, 2d.")]
AtOpt = Annotated[str | None, typer.Option("--at", help="Due time, ISO 8601 with offset.")]
GroupOpt = Annotated[
    str | None,
    typer.Option(
        help="A key this message shares with others (an order, a saga), to list or cancel them together."
    ),
]
HeaderOpt = Annotated[list[str], typer.Option("--header", "-H", help="name=value, repeatable.")]
MessageIdOpt = Annotated[str | None, typer.Option("--id", help="Your own message id (default: generated).")]
TransportOpt = Annotated[
    str | None,
    typer.Option(
        "--transport",
        help="Where due messages go. Default: the queue tables in the store's own database (SQLite, PostgreSQL).",
    ),
]


def transport_url_for(store: str, transport: str | None) -> str:
    """The transport given, else the store's default (the queue tables of its own database)."""
    return transport or default_transport(store)


#: A word that reads as a duration's unit: after a bare ``--in 5`` it was meant for the duration.
UNIT_WORD = re.compile(
    r"(?i)(ms|msecs?|millis(econds?)?|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?)"
)


def split_duration(in_: str | None, word: str) -> str | None:
    """What is wrong with ``--in 5 minutes`` (the duration 5, then a word that reads as its unit),
    or None: the one rule for a body that would be taken for the rest of ``--in``, and for a word
    the command would not take at all."""
    if in_ is None or not re.fullmatch(r"\d+(\.\d+)?", in_.strip()) or not UNIT_WORD.fullmatch(word.strip()):
        return None
    said = word.strip().lower()
    unit = "ms" if said.startswith("m") and said not in ("m", "min", "mins", "minute", "minutes") else said[0]
    written = f"{in_}{unit}" if unit != "w" else f"{float(in_) * 7:g}d"
    return (
        f"--in {in_} {word}: a duration is one word here, so {word!r} would be the body. Write "
        f"--in {written}; for the body {word!r} itself, give the duration its unit: --in {in_}s."
    )


def split_duration_in(argv: list[str]) -> str | None:
    """:func:`split_duration` over a whole command line, before the command parses it: with a
    body already given (``schedule orders hi --in 5 minutes``) the unit is an extra argument the
    parser would refuse without saying why."""
    for i, word in enumerate(argv):
        if word == "--in" and i + 2 < len(argv):
            found = split_duration(argv[i + 1], argv[i + 2])
        elif word.startswith("--in=") and i + 1 < len(argv):
            found = split_duration(word.removeprefix("--in="), argv[i + 1])
        else:
            continue
        if found:
            return found
    return None


def refuse_split_duration(in_: str | None, body: str) -> None:
    """``--in 5 minutes`` gave the duration 5 (seconds) and the body "minutes": refused, with how
    to write it, rather than a message stored with the wrong body and the wrong due time."""
    found = split_duration(in_, body)
    if found:
        raise typer.BadParameter(found)


def due_from_options(in_: str | None, at: str | None, body: str | None = None) -> dict[str, Any]:
    """``--in`` or ``--at`` as the client takes them; ``body``, the command's body argument (None
    when the body comes from a file), is refused when it reads as the rest of ``--in``."""
    if body is not None:
        refuse_split_duration(in_, body)
    if (in_ is None) == (at is None):
        raise typer.BadParameter("give exactly one of --in (e.g. 10m) or --at (ISO 8601 time)")
    if in_ is not None:
        return {"delay": parse_duration(in_)}
    due = check_due_time(parse_time(at or ""), "--at")  # refused first, warned about after
    if due <= SYSTEM.now():
        say(
            "warning:",
            "yellow",
            f"{due.isoformat()} has passed: the message is due now and goes at once.",
            to=err,
        )
    return {"due_at": due}


def body_bytes(body: str) -> bytes:
    """A body given on the command line, as the bytes the shell passed. Python decodes arguments
    with ``surrogateescape`` and ``os.fsencode`` undoes it, so a body that is not UTF-8 is kept
    byte for byte (``str.encode`` refused it with an internal error)."""
    return os.fsencode(body)


def headers_from_pairs(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"header {pair!r} must look like name=value")
        if key in headers and headers[key] != value:  # one would be dropped without a word
            raise typer.BadParameter(
                f"header {key!r} is given twice ({headers[key]!r} and {value!r}); give it once"
            )
        headers[key] = value
    return headers


def configure_logging(verbose: bool, fmt: LogFormat = LogFormat.TEXT) -> None:
    configure(logging.DEBUG if verbose else logging.INFO, fmt)


def _version(value: bool) -> None:
    if value:
        from duetime import __version__

        print(f"duetime {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    store: Annotated[
        str | None,
        typer.Option("--store", help="The store, for the command that follows (as DUETIME_STORE)."),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option("--endpoint", help="The endpoint, for the command that follows (as DUETIME_ENDPOINT)."),
    ] = None,
    transport: Annotated[
        str | None,
        typer.Option(
            "--transport", help="The transport, for the command that follows (as DUETIME_TRANSPORT)."
        ),
    ] = None,
) -> None:
    """duetime keeps delayed messages in a durable store and forwards each to its destination when
    it is due."""
    for line in misspelt(known_variables()):
        say("warning:", "yellow", line, to=err)
    # Given before the command (`duetime --store URL list`): as its variable, which the command's
    # own option reads, and still overrides. Click reads the command's options after this runs
    # (their defaults from this map), so each command of every group sees it.
    given = {"--store": store, "--endpoint": endpoint, "--transport": transport}
    ctx.default_map = from_environment(
        ctx.command,
        {SETTING_VARIABLES[flag]: value for flag, value in given.items() if value is not None},
        ctx.invoked_subcommand,
    )


def tidy_flags(command: Any) -> Any:
    """``command`` (the click command the app is built into) with no type shown for its flags:
    Typer's help writes ``--paused <bool>``, which reads as if the flag took a value."""
    for param in command.params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", None) is None:
            param.metavar = ""
    made_help = command.get_help_option  # --help is made afresh each time it is shown

    def help_option(ctx: Any) -> Any:
        option = made_help(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        tidy_flags(sub)
    return command


def known_variables() -> set[str]:
    """Every DUETIME_* variable duetime reads: the commands' options', the dispatcher's settings
    and :data:`OTHER_VARIABLES`."""
    return option_variable_names() | setting_variables() | set(OTHER_VARIABLES)


def command_options(root: Any) -> Iterator[tuple[list[str], Any]]:
    """Every option of every command under ``root`` (the click command the app is built into),
    with the words of its command (``["errors", "list"]``); the root's own are not a command's."""
    for name, sub in getattr(root, "commands", {}).items():
        yield from (([name], param) for param in sub.params)
        yield from (([name, *words], param) for words, param in command_options(sub))


def name_variables(root: Any) -> Any:
    """``root`` with each option's help ending in the variables it reads (``[env var: …]``), as
    click's own ``envvar`` would show them."""
    for words, param in command_options(root):
        names = option_variables(words[0], getattr(param, "opts", []))
        shown = "\\" + f"[env var: {', '.join(names)}]"  # escaped: the help is Rich markup
        if names and shown not in (param.help or ""):
            param.help = f"{param.help or ''} {shown}".strip()
    return root


def from_environment(root: Any, given: dict[str, str], invoked: str | None = None) -> dict[str, Any]:
    """Click's ``default_map`` for ``root``: each option's value from its variables
    (:func:`~duetime.settings.option_variables`; ``given`` first), where one is set. An option
    the command line gives still wins; a repeatable one takes the value's words, one each."""
    found: dict[str, Any] = {}
    for words, param in command_options(root):
        names = option_variables(words[0], getattr(param, "opts", []))
        value = option_value(names, given)
        if value is None or param.name is None:
            continue
        if words == [invoked]:  # the command that runs: a value it cannot take names its variable
            _check_value(value, names, given)
        place = found
        for word in words:
            place = place.setdefault(word, {})
        place[param.name] = value.split() if getattr(param, "multiple", False) else value
    return found


def _check_value(value: str, names: Sequence[str], given: dict[str, str]) -> None:
    """One line naming the variable when ``value`` is not what its option takes (a port that is
    not a number): click would name only the option, which the user never typed."""
    check_option_value(next(n for n in names if (given.get(n) or variable(n)) == value), value)


def confirm_many(question: str, yes: bool) -> None:
    """Ask before a change to many messages; without a terminal to ask on, ``--yes`` must say so."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise ConfigurationError(f"{question} Add --yes to go ahead (no terminal to ask on).")
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)


#: Why a transport could never carry a message (None: it can), with the transport named.
CarryRule = Callable[[DelayedMessage], "str | None"]


@contextlib.asynccontextmanager
async def carry_rule(store_url: str, transport: str | None) -> AsyncIterator[CarryRule]:
    """The rule a message must meet before it is stored (:class:`duetime.operations.carry.CarryRule`),
    with the error queue in force, for the length of one command."""
    rule = await CarryRules.open(store_url, transport, DelayedDeliverySettings.from_env().error_queue)
    try:
        yield rule
    finally:
        await rule.close()


def refuse_destination(destination: str) -> None:
    """Refuse, before anything is stored, a destination no sender may write to (the error queue
    in force, an endpoint's timeouts queue)."""
    if why := refused_destination(destination, DelayedDeliverySettings.from_env().error_queue):
        raise MessageRefused(f"{why}. Nothing was stored.")


async def refuse_uncarriable(store_url: str, transport: str | None, message: DelayedMessage) -> None:
    """MessageRefused, before storing, for a message that could never be delivered."""
    async with carry_rule(store_url, transport) as rule:
        reason = rule(message)
    if reason:
        raise MessageRefused(f"{reason}. Nothing was stored.")


C = TypeVar("C")
R = TypeVar("R")


def with_capability(
    store_url: str, endpoint: str, capability: type[C], keeps: str, work: Callable[[C], Awaitable[R]]
) -> R:
    """``work`` on the store set up at ``store_url``, as the capability it needs (the API keys,
    the webhooks a store keeps); a store without it is one line saying it keeps no ``keeps``."""
    from duetime.cli.terminal import run_async

    async def go() -> R:
        s = await open_ready_store(store_url, endpoint)
        try:
            if not isinstance(s, capability):
                raise ConfigurationError(f"The store {type(s).__name__} keeps no {keeps}.")
            return await work(s)
        finally:
            await s.close()

    return run_async(go)


async def _by_webhooks(store_url: str, endpoint: str, destinations: Iterable[str]) -> set[str]:
    """Which of ``destinations`` the store's webhooks deliver: an endpoint's name, or a URL an
    endpoint's pattern allows (none where it cannot tell: an advisory look)."""
    try:
        store = await open_ready_store(store_url, endpoint)
    except Exception:
        return set()
    try:
        hooks = await store.webhooks() if isinstance(store, WebhookStore) else []
    except Exception:
        return set()
    finally:
        await store.close()
    names = {w.name for w in hooks if not w.is_pattern}
    return {d for d in destinations if d in names or (is_url(d) and endpoint_for_url(hooks, d) is not None)}


def can_warn_undeclared(store_url: str, transport: str | None) -> bool:
    """Whether :func:`warn_undeclared` has a transport to ask: given, or the store's own queue
    tables in a store that is there (a SQLite file is not made by looking)."""
    try:
        check_store_exists(transport_url_for(store_url, transport))
    except ConfigurationError:
        return False
    return True


async def warn_undeclared(
    store_url: str, transport: str | None, destinations: Iterable[str], endpoint: str = DEFAULT_ENDPOINT
) -> None:
    """Warn about destinations no queue is declared for, where the transport can tell: such a
    message is stored fine and would only be dead-lettered, in silence, when it falls due. A
    destination that is a webhook the store keeps is delivered by a route to webhooks://, so it
    needs no queue."""
    if not can_warn_undeclared(store_url, transport):
        return  # a store without queue tables of its own, and no --transport: nothing to ask
    url = transport_url_for(store_url, transport)
    try:
        t = open_transport(url)
    except ConfigurationError:
        return
    try:
        if not isinstance(t, InspectableQueue):
            return
        await asyncio.wait_for(t.start(), 5)
        missing = [d for d in sorted(set(destinations)) if not await asyncio.wait_for(t.has_queue(d), 5)]
    except Exception as error:  # an advisory check: the message is stored whatever it finds
        logging.getLogger("duetime.cli").debug("could not check the queues on %s: %s", redact(url), error)
        return
    finally:
        await t.close()
    if missing:  # only then is the store asked (a second open of it, for a warning alone)
        delivered = await _by_webhooks(store_url, endpoint, missing)
        missing = [d for d in missing if d not in delivered]
    flag = " (with the same --transport)" if transport else ""
    for name in missing[:5]:
        if is_url(name):  # a webhook delivers a URL, never a queue
            add = command("duetime", "webhooks", "add", "NAME", "https://host/path/*")
            advice = f"no webhook endpoint allows the URL {redact(name)}: when due, the message goes to the error queue. Register one whose URL is a pattern it matches (`{add}`)."
        else:
            advice = (
                f"no queue {name!r} is declared on {redact(url)}: when due, the message goes to the error "
                f"queue. Declare it with `{command('duetime', 'queues', 'declare', name)}`{flag}."
            )
        say("warning:", "yellow", advice, to=err)
    if len(missing) > 5:
        say("warning:", "yellow", f"... and {len(missing) - 5} more destinations without a queue.", to=err)


def who() -> str:
    """Who runs this command: DUETIME_ACTOR, else the user at the host (what a pause and the
    audit trail record)."""
    given = variable(ACTOR_VARIABLE)
    if given:
        return given
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def cli_actor() -> Actor:
    """The audit trail's actor of this command's changes."""
    return Actor(who(), Via.CLI, socket.gethostname())


async def record_change(store: object, action: Action, target: str, **said: Any) -> None:
    """Keep a change this command made in ``store``'s audit trail (:mod:`duetime.audit`)."""
    await record(store, audit.made(cli_actor(), action, target, **said))


def changing(
    work: Callable[[C], Awaitable[R]],
    action: Action,
    target: str,
    said: Callable[[R], dict[str, Any]] = lambda _: {},
) -> Callable[[C], Awaitable[R]]:
    """``work`` on a store, then, unless it answered False (nothing was there to change), the
    change kept in the store's audit trail; ``said`` gives the entry's ids and detail from what
    ``work`` answered."""

    async def go(store: C) -> R:
        done = await work(store)
        if done is not False:
            await record_change(store, action, target, **said(done))
        return done

    return go
