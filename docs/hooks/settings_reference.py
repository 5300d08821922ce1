"""MkDocs hook: the settings and environment variables pages' tables, generated from the code.

``<!-- settings, generated -->`` becomes a table of :class:`duetime.DelayedDeliverySettings`: each
field, its ``DUETIME_*`` variable, its default and the comment written above it in the source.
``<!-- command variables, generated -->`` becomes a table of every option of the ``duetime``
commands that an environment variable can give. A test checks that every ``DUETIME_*`` name the
package reads is on the page (the few read outside these two are written on the page by hand).
"""

from __future__ import annotations

import dataclasses
import inspect
from datetime import timedelta
from typing import Any

SETTINGS = "<!-- settings, generated -->"
COMMANDS = "<!-- command variables, generated -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if SETTINGS in markdown:
        markdown = markdown.replace(SETTINGS, _settings())
    if COMMANDS in markdown:
        markdown = markdown.replace(COMMANDS, _commands())
    return markdown


def _cell(text: str) -> str:
    """One table cell: one line, its pipes and angle brackets kept as text."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _default(value: object) -> str:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"
    return "(not set)" if value is None else str(value)


def _comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment lines written just above each field, by field name."""
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
        elif ":" in text and not text.startswith(("def ", "@", "class ", '"""', "#")):
            found[text.split(":", 1)[0].strip()] = " ".join(pending)
            pending = []
        else:
            pending = []
    return found


def _settings() -> str:
    from duetime.settings import DelayedDeliverySettings

    comments = _comments(DelayedDeliverySettings)
    defaults = DelayedDeliverySettings()
    rows = ["| Setting | Environment variable | Default | What it does |", "|---|---|---|---|"]
    for field in dataclasses.fields(DelayedDeliverySettings):
        what = comments.get(field.name) or "NServiceBus's setting of the same name."
        rows.append(
            f"| `{field.name}` | `DUETIME_{field.name.upper()}` | {_default(getattr(defaults, field.name))} "
            f"| {_cell(what)} |"
        )
    return "\n".join(rows)


def _commands() -> str:
    import typer

    from duetime.cli import app
    from duetime.cli.common import command_options
    from duetime.settings import option_variables

    seen: dict[str, tuple[set[str], set[str], str]] = {}

    for words, param in command_options(typer.main.get_command(app)):
        path = " ".join(["duetime", *words])
        for name in option_variables(words[0], param.opts):
            options, commands, help_ = seen.setdefault(name, (set(), set(), ""))
            options.update(o for o in param.opts if o.startswith("--"))
            commands.add(path)
            if not help_ and getattr(param, "help", None):
                seen[name] = (options, commands, param.help)
    rows = ["| Variable | Option | Commands | What it gives |", "|---|---|---|---|"]
    for name in sorted(seen):
        options, commands, help_ = seen[name]
        shown = ", ".join(f"`{c}`" for c in sorted(commands)[:6])
        if len(commands) > 6:
            shown += f" and {len(commands) - 6} more"
        rows.append(
            f"| `{name}` | {', '.join(f'`{o}`' for o in sorted(options))} | {shown} | {_cell(help_)} |"
        )
    return "\n".join(rows)
