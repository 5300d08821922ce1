"""``duetime.__all__`` is exactly the public surface: every name it lists exists, every public name
the package exposes is listed, and the list changes only on purpose (this snapshot)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import duetime

SURFACE = {
    "ConfigurationError", "CriticalError", "DeadlineExceeded", "DelayedDeliverySettings",
    "DelayedMessage", "DelayedMessageClient", "DelayedMessageStore", "DestinationNotFound",
    "DestinationUnavailable", "NotReplicated",
    "DispatchObserver", "DispatchStats", "Dispatcher", "DuetimeError", "DuplicateMessageId", "FrontDoor",
    "InvalidMessage", "ListQuery", "MessageInFlight", "MessageNotFound", "MessageRefused", "MissingExtra", "Page",
    "ReceivedMessage", "ReceivingTransport", "Settled", "StoreCounts", "StoreNotReady",
    "SyncDelayedMessageClient", "SyncDelayedMessageStore", "SystemClock", "TransactionMode",
    "Transport", "TransportError", "TransportUnavailable", "UnknownScheme",
    "UnsupportedTransactionMode", "new_message_id", "open_store", "open_sync_store",
    "open_transport", "send_delayed", "connect", "connect_sync",
    "InvalidSchedule", "ScheduleExists", "ScheduleNotFound", "Service", "IfExists", "Put", "StoreError",
}  # fmt: skip


def test_all_is_exactly_the_public_surface() -> None:
    exposed = {
        name
        for name, value in vars(duetime).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(duetime.__all__) == exposed, "__all__ and the package's public names differ"
    assert len(duetime.__all__) == len(set(duetime.__all__))
    assert set(duetime.__all__) == SURFACE, "the public surface changed: update SURFACE on purpose"


def test_the_version_is_written_once() -> None:
    from importlib.metadata import version

    assert version("duetime") == duetime.__version__


def test_every_command_takes_the_flags_it_can_mean() -> None:
    """Scripts pass --store/--endpoint to every command, and read --json from every listing."""
    import typer

    from duetime.cli import app

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, set[str]]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), {o for p in cmd.params for o in getattr(p, "opts", [])}

    commands = dict(walk(typer.main.get_command(app), []))
    assert len(commands) > 20
    for name, opts in commands.items():
        if "--store" in opts:
            assert "--endpoint" in opts, name
    for name in ("list", "show", "stats", "errors list", "rabbitmq status", "rabbitmq catchall"):
        assert "--json" in commands[name], name
    for name, opts in commands.items():
        if name.startswith("rabbitmq") or name in ("run", "send-delayed", "stats", "queues receive"):
            assert "--transport" in opts, name


def test_every_commands_line_in_a_listing_is_one_sentence_on_one_line() -> None:
    """A listing (``duetime --help``) shows a command's first paragraph with its line breaks kept:
    a docstring wrapped there showed as a ragged line. Such a command names a ``short_help``."""
    import typer

    from duetime.cli import app

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield " ".join([*path, name]), sub
            yield from walk(sub, [*path, name])

    for name, command in walk(typer.main.get_command(app), []):
        listed = command.short_help or (command.help or "").strip().split("\n\n")[0]
        assert "\n" not in listed.strip(), f"duetime {name}: {listed!r}"


def test_every_capability_method_says_what_it_must_guarantee() -> None:
    """A store or transport someone writes is held to the Protocols' docstrings: every method of
    every public Protocol has one."""
    from duetime import interfaces

    undocumented = [
        f"{name}.{method}"
        for name, protocol in vars(interfaces).items()
        if isinstance(protocol, type)
        and getattr(protocol, "_is_protocol", False)
        and not name.startswith("_")
        for method, member in vars(protocol).items()
        if not method.startswith("_")
        and callable(member.fget if isinstance(member, property) else member)
        and not (member.fget if isinstance(member, property) else member).__doc__
    ]
    assert undocumented == []


#: Each public subpackage's names, as its ``__all__`` lists them: a change is made on purpose
#: (and the CHANGELOG says so).
SUBPACKAGE_SURFACES = {
    "duetime.backends": {
        "AsyncStoreBridge", "DEFAULT_CLAIM_TIMEOUT", "Duplicate", "ROUND_LIMIT", "SCHEMA_VERSION",
        "StoreRules", "by_due", "matches",
    },
    "duetime.bulk": {
        "Exported", "FileTarget", "MigrationResult", "MigrationSpec", "Preview", "Report", "Scheduled",
        "StoreTarget", "Target", "abort", "backlog", "export", "import_", "lateness", "migrate",
        "open_target", "preview", "schedule", "spark_session", "write_csv", "write_html",
    },
    "duetime.recurring": {"PLANNED_HEADER", "Recurrence", "SCHEDULE_HEADER", "Schedule", "changed", "cron", "every"},
}  # fmt: skip


def test_each_public_subpackage_lists_exactly_its_surface() -> None:
    import importlib

    for name, surface in SUBPACKAGE_SURFACES.items():
        module = importlib.import_module(name)
        listed = set(module.__all__)
        assert all(hasattr(module, n) for n in listed), name
        assert listed == surface, f"{name}'s public surface changed: update SUBPACKAGE_SURFACES on purpose"
