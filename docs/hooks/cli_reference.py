"""MkDocs hook: the command-line reference is generated from the commands themselves, never typed.

``docs/reference/cli.md`` holds a marker line; at build time it becomes what Typer's own
documentation generator says of ``duetime`` and every subcommand (their help texts, options and
defaults), so the page cannot drift from the code.
"""

from __future__ import annotations

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
    return markdown.replace(MARKER, body.replace("\n## ", "\n### ").replace("\n# ", "\n## "))
