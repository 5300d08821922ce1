"""The store's row is defined once (``duetime.store_row``), and only a store's own backend
folder writes rows into its table: the bulk jobs hand their batches to the store's bulk writer
(``duetime/backends/<store>/bulk_rows.py``) instead of statements of their own, and take a
migration's rows out of the table it reads the same way (``Database.source_rows``)."""

from __future__ import annotations

import re
from pathlib import Path

import duetime
from duetime.store_row import CLAIM_COLUMNS, STORE_COLUMNS

PACKAGE = Path(duetime.__file__).parent
#: The backends whose folders hold a SQL store and its writes.
STORE_BACKENDS = ("postgres", "mysql", "sqlite")

#: A column list of the store's row, as SQL or Python spells it: ``message_id, destination,
#: due_at`` and the names (with casts) that follow.
ROW_LIST = re.compile(r"(?<![\w.])message_id,\s*destination,\s*due_at(?:,\s*[a-z_]+(?:::[a-z]+)?)*")
#: A statement that changes a table, and the table it names (SQL's keywords are upper case here;
#: a docstring's "COPY on PostgreSQL" names no table, since no clause follows).
TABLE_WRITE = re.compile(
    r"\b(?:INSERT(?:\s+IGNORE|\s+OR\s+[A-Z]+)?\s+INTO|COPY|UPDATE|DELETE\s+FROM)\s+"
    r"(\{[^}]*\}|[A-Za-z_][\w.]*)(?=\s*(?:\(|WHERE\b|SET\b|VALUES\b|SELECT\b|FROM\b|RETURNING\b))",
)
#: The tables the bulk jobs keep for themselves (``duetime.bulk_interfaces.STATE_TABLES`` as the
#: shared statements name them).
BULK_OWN_TABLES = {"{runs}", "{batches}", "{staged}", "{ledger}", "{scheduled}", "{log}"}
#: A statement that puts rows into a table by naming the store's columns.
ROW_WRITE = re.compile(
    r"\b(?:INSERT(?:\s+IGNORE)?\s+INTO|COPY)\s+\S+\s*\(\s*message_id,\s*destination,\s*due_at", re.IGNORECASE
)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".sql"))


def _statements(path: Path) -> str:
    """What of ``path`` could be SQL: a ``.sql`` file whole, a module's string literals."""
    import io
    import tokenize

    if path.suffix == ".sql":
        return path.read_text()
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return "\n".join(t.string for t in tokens if t.type == tokenize.STRING)


def _spelled(found: str) -> tuple[str, ...]:
    return tuple(re.sub(r"::[a-z]+", "", name).strip() for name in found.split(","))


def test_every_list_of_the_store_rows_columns_is_the_one() -> None:
    lists = [
        (path.relative_to(PACKAGE.parent), _spelled(m.group()))
        for path in _sources()
        for m in ROW_LIST.finditer(_statements(path))
    ]
    assert len(lists) > 20  # the stores' queries, at least
    # Three, then an expression, is a look at some columns, not a row.
    rows = [(path, names) for path, names in lists if len(names) > 3]
    wrong = [
        f"{path}: {', '.join(names)}"
        for path, names in rows
        if names[: len(STORE_COLUMNS)] != STORE_COLUMNS
        or names[len(STORE_COLUMNS) :] not in ((), CLAIM_COLUMNS, CLAIM_COLUMNS[:1])
    ]
    assert wrong == [], "a store row spelled other than duetime.store_row.STORE_COLUMNS"


def test_only_a_stores_backend_writes_rows_into_its_table() -> None:
    inside = [PACKAGE / "backends" / name for name in STORE_BACKENDS]
    writes = [
        f"{path.relative_to(PACKAGE.parent)}: {m.group()}"
        for path in _sources()
        if not any(folder in path.parents for folder in inside)
        for m in ROW_WRITE.finditer(_statements(path))
    ]
    assert writes == []
    for name in STORE_BACKENDS:  # and each has its bulk writer
        assert (PACKAGE / "backends" / name / "bulk_rows.py").exists()


def test_the_bulk_jobs_shared_statements_name_no_store_table() -> None:
    """``sqldb.sql`` holds the bulk jobs' own tables (runs, batches, staging, ledgers, the
    delivery log) and reads of the legacy layouts: no write to a ``{table}``."""
    text = (PACKAGE / "backends" / "sqldb.sql").read_text()
    assert re.findall(r"\b(?:INSERT(?:\s+IGNORE)?\s+INTO|COPY|UPDATE|DELETE\s+FROM)\s+\{table\}", text) == []


def test_outside_the_stores_folders_nothing_writes_any_table_but_the_bulk_jobs_own() -> None:
    """``INSERT``, ``COPY``, ``UPDATE`` and ``DELETE`` on a store's or a queue's table (or on a
    table a migration reads) are written only in that backend's folder: elsewhere a statement
    that changes a table names one of the bulk jobs' own."""
    inside = [PACKAGE / "backends" / name for name in (*STORE_BACKENDS, "redis")]
    found = [
        (path.relative_to(PACKAGE.parent), m.group(1))
        for path in _sources()
        if not any(folder in path.parents for folder in inside)
        for m in TABLE_WRITE.finditer(_statements(path))
    ]
    assert len(found) >= 10  # the bulk jobs' own statements are seen
    assert [f"{path}: {table}" for path, table in found if table not in BULK_OWN_TABLES] == []
