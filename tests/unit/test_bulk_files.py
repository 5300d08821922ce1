"""The files a store needs for bulk jobs are one list: the table on the how-to page for a store
of one's own is what every built-in store that bulk jobs write has, and what the registry opens."""

from __future__ import annotations

import re
from pathlib import Path

from duetime.registry import KEYED_BULK_ROWS, SQL_DATABASES

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "how-to" / "own-store.md"
BACKENDS = ROOT / "duetime" / "backends"


def _listed() -> dict[str, bool]:
    """Each ``<store>/FILE`` the page's table names, and whether only SQL stores need it."""
    rows = re.findall(r"^\| `<store>/([\w.]+)`( \(SQL\))? \|", PAGE.read_text(), re.MULTILINE)
    return {name: bool(sql) for name, sql in rows}


def _folder(target: str) -> Path:
    module = target.partition(":")[0]
    return ROOT / Path(*module.split(".")[:-1])


def test_every_store_bulk_jobs_write_has_the_files_the_page_lists() -> None:
    listed = _listed()
    assert {"sql_database.py", "bulk_rows.py", "queries.sql"} <= set(listed)
    for table, sql in ((SQL_DATABASES, True), (KEYED_BULK_ROWS, False)):
        for scheme, target in table.items():
            folder = _folder(target)
            needed = [name for name, only_sql in listed.items() if sql or not only_sql]
            missing = [name for name in needed if not (folder / name).exists()]
            assert missing == [], f"{scheme}:// ({folder.name}) lacks {missing}, which the page lists"


def test_what_the_registry_opens_is_a_file_the_page_lists() -> None:
    listed = set(_listed())
    for target in [*SQL_DATABASES.values(), *KEYED_BULK_ROWS.values()]:
        module = target.partition(":")[0].rsplit(".", 1)[1]
        assert f"{module}.py" in listed, f"{target} opens a file the page does not list"


def test_bulk_builds_no_sql_and_asks_no_dialect() -> None:
    """The bulk jobs ask the database for rows (a Selection, a layout's name) and run its named
    statements: no SQL keyword in their string literals, no identifier quoted or list of marks
    made there, and no dialect named (``duetime.bulk_interfaces`` is the boundary)."""
    import io
    import tokenize

    sql = re.compile(
        r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|CREATE\s+TABLE|WHERE)\b\s+[\w{(\"`*]"
    )
    found = []
    for path in sorted((ROOT / "duetime" / "bulk").glob("*.py")):
        text = path.read_text()
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        literals = [t.string for t in tokens if t.type == tokenize.STRING and not t.string.startswith('"""')]
        found += [f"{path.name}: {m.group()}" for literal in literals for m in sql.finditer(literal)]
        found += [
            f"{path.name}: {m.group()}"
            for m in re.finditer(r"\.(quote|qualified|in_list|sql)\(|dialect", text)
        ]
    assert found == []
