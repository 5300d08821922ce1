"""The `duetime` command: one module per command group, put together here.

``duetime.cli.common`` holds the app and the options every command shares; ``run``, ``messages``,
``errors``, ``queues``, ``rabbitmq`` and ``bulk`` each add their commands to it.
"""

from __future__ import annotations

import copy
import importlib
import sys
from typing import Any, TextIO, cast

from duetime.cli import exit_watchdog as lastresort
from duetime.cli.bulk import bulk_app
from duetime.cli.common import app, name_variables, split_duration_in, tidy_flags
from duetime.cli.rabbitmq import rabbitmq_app
from duetime.cli.terminal import fail
from duetime.errors import DuetimeError, MissingExtra, not_permitted
from duetime.inputs.urls import remember, remember_secret, scrub
from duetime.observability.logs import quiet_drivers
from duetime.settings import DEBUG_VARIABLE, SECRET_VARIABLES, option_variable_names, variable

for _group in (
    "run",
    "messages",
    "recurring",
    "errors",
    "queues",
    "dashboard",
    "serve",
    "webhooks",
    "limits",
    "keys",
    "audit",
):  # each adds its commands, in --help's order
    importlib.import_module(f"duetime.cli.{_group}")
app.add_typer(bulk_app, name="bulk")
app.add_typer(rabbitmq_app, name="rabbitmq")
__all__ = ["app", "command", "main"]


def command(args: list[str] | None = None) -> Any:
    """The click command the app is built into, as ``duetime`` runs it (flags shown as flags).

    Given the command line's ``args``, only the command they name is built, beside the app's own
    options: building every command (their signatures read, their options made) cost a third of
    each ``duetime`` process's start. Without a command named exactly (``--help``, a misspelling
    that is answered with the names there are), everything is built."""
    import typer

    named = _named(args or [])
    built = app
    if named is not None:
        built = copy.copy(app)
        built.registered_commands = [c for c in app.registered_commands if _name(c) == named]
        built.registered_groups = [g for g in app.registered_groups if g.name == named]
    return name_variables(tidy_flags(typer.main.get_command(built)))


#: The app's own options that take a value (``duetime --store URL list``).
_VALUED = ("--store", "--endpoint", "--transport")


def _named(args: list[str]) -> str | None:
    """The command or group ``args`` run, when it is one of the app's; None otherwise."""
    words = iter(args)
    for word in words:
        if word in _VALUED:
            next(words, None)
        elif not word.startswith(_VALUED) or "=" not in word:
            names = {_name(c) for c in app.registered_commands} | {g.name for g in app.registered_groups}
            return word if word in names else None
    return None


def _name(info: Any) -> str | None:
    """A command's name as Typer gives it: its own, else its function's, with dashes."""
    import typer

    if info.name:
        return str(info.name)
    return typer.main.get_command_name(info.callback.__name__) if info.callback else None


#: Seconds the process may take to exit once its command is over (see duetime.cli.exit_watchdog).
EXIT_GRACE = 15.0


def main() -> None:
    lastresort.enable()  # this process is ours: a stop that hangs on a dead server may end it
    lastresort.at_exit(EXIT_GRACE)
    try:
        _main()
    except SystemExit as leaving:  # the code to leave with, should the exit itself hang
        lastresort.exiting(leaving.code)
        raise


class _Scrubbing:
    """stdout or stderr with every secret duetime was given replaced by ``***`` (see
    ``duetime.inputs.urls.scrub``): one net under everything the command prints, its own text,
    a driver's words in an error, the logs."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _guard_secrets() -> None:
    """Remember the secrets of every URL the command was given (its arguments and the settings it
    reads from the environment) and the secrets given on their own, and print only through the
    scrubber."""
    settings = [variable(name) or "" for name in sorted(option_variable_names())]
    for value in [*sys.argv[1:], *settings]:
        remember(value.partition("=")[2] if value.startswith("--") else value)
    for name in SECRET_VARIABLES:
        remember_secret(variable(name) or "")
    sys.stdout = cast(TextIO, _Scrubbing(sys.stdout))
    sys.stderr = cast(TextIO, _Scrubbing(sys.stderr))


def _main() -> None:
    _guard_secrets()
    quiet_drivers(verbose=bool(variable(DEBUG_VARIABLE)))
    split = split_duration_in(sys.argv[1:])
    if split:  # a usage error, said before the parser calls the unit an unexpected argument
        fail(split)
        sys.exit(2)
    try:
        command(sys.argv[1:])(prog_name="duetime")
    except DuetimeError as error:  # bad input found before any async work started
        fail(str(error))
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except ModuleNotFoundError as error:  # an optional library the command needs is not installed
        missing = MissingExtra.for_module(error, f"`duetime {_command()}`")
        if missing is None:
            _internal_error(error)
        fail(str(missing))
        sys.exit(1)
    except Exception as error:
        refused = not_permitted(error)  # a database user short of a privilege: say which
        if refused is None:
            _internal_error(error)
        fail(str(refused))
        sys.exit(1)


def _command() -> str:
    """The command the user ran, without its arguments: ``run``, ``bulk report``."""
    words = [word for word in sys.argv[1:3] if not word.startswith("-")]
    groups = {group.name for group in app.registered_groups}
    return " ".join(words[:2] if words and words[0] in groups else words[:1])


def _internal_error(error: Exception) -> None:
    """A bug of ours: still one line, the traceback only on request."""
    if variable(DEBUG_VARIABLE):
        raise error
    fail(
        f"internal error ({type(error).__name__}: {error}); this is a duetime bug, please report it "
        "with the output of the same command run with DUETIME_DEBUG=1."
    )
    sys.exit(1)
