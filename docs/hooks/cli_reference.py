"""MkDocs hook: the command-line reference is generated from the commands themselves, never typed.

``docs/reference/cli.md`` holds a marker line; at build time it becomes what Typer's own
documentation generator says of ``duetime`` and every subcommand (their help texts, options and
defaults), so the page cannot drift from the code.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from typing import Any

MARKER = "<!-- the duetime command, generated -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    generated = subprocess.run(
        [sys.executable, "-m", "typer", "duetime.cli", "utils", "docs", "--name", "duetime"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "100", "PATH": ""},
    ).stdout
    # one page: its top heading is the page's own; the commands' headings sit under it
    body = generated.split("\n", 1)[1] if generated.startswith("# ") else generated
    body = readable(body.replace("\n## ", "\n### ").replace("\n# ", "\n## "))
    return markdown.replace(MARKER, body)


def readable(generated: str) -> str:
    """Typer's generator escapes text for HTML, which Markdown shows literally inside code
    (``schedule orders &#x27;hello&#x27;``), and cuts each command's summary at 45 characters
    ("Create the store's tables (idempotent;..."). Quotes are unescaped everywhere, code spans
    wholly, and each summary is the command's first sentence, whole."""
    text = generated.replace("&#x27;", "'").replace("&quot;", '"')
    text = re.sub(r"`[^`\n]*`", lambda m: html.unescape(m.group(0)), text)
    summaries = first_sentences()
    return re.sub(
        r"^\* `([\w-]+)`: .*\.\.\.$",
        lambda m: (
            f"* `{m.group(1)}`: {html.escape(summaries[m.group(1)], quote=False)}"
            if m.group(1) in summaries
            else m.group(0)
        ),
        text,
        flags=re.M,
    )


def first_sentences() -> dict[str, str]:
    """Each command's (and group's) name -> the first sentence of its help."""
    import typer.main

    from duetime.cli import app

    found: dict[str, str] = {}

    def walk(command: Any) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            words = " ".join((sub.help or "").split())
            found.setdefault(name, re.split(r"(?<=\.)\s", words, maxsplit=1)[0])
            walk(sub)

    walk(typer.main.get_command(app))
    return found
