"""A PostgreSQL database as the bulk jobs and the delivery log see it (:class:`Database`'s
PostgreSQL answers): schemas, ``bytea``, server-side cursors, COPY, and the abilities only a
PostgreSQL server has here (reading a table by blocks, computing a record's columns in the
server, moving rows between two tables or piping them between two servers without Python).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

from duetime.backends.postgres.bulk_rows import PgBulkRows, source_rows, take_sql, timestamptz_sql
from duetime.backends.postgres.connection import PgOptions, connect
from duetime.backends.source_rows import SourceRows
from duetime.backends.sqldb import Database
from duetime.bulk_interfaces import Selection
from duetime.clock import from_micros
from duetime.inputs.identifiers import postgres_name

#: ``ctid`` range scans and an exact ``extract(epoch …)`` (numeric, not double) came in 14.
EXACT_FROM = 140000
_CURSORS = itertools.count()


@dataclass(frozen=True)
class PostgresDatabase(Database):
    """A PostgreSQL database (``postgresql://``), its tables in the URL's schema (``public``)."""

    dialect: ClassVar[str] = "postgres"
    blob: ClassVar[str] = "bytea"
    computes_records: ClassVar[bool] = True

    def _words(self) -> dict[str, str]:
        return super()._words() | {"due_us_as_timestamptz": timestamptz_sql("due_us")}

    def schema_params(self) -> list[str]:
        return [self.schema or "public"]

    def _store_options(self) -> list[tuple[str, str]]:
        return [("schema", self.schema)] if self.schema else []

    def qualified(self, table: str) -> str:
        return f"{self.quote(self.schema or 'public')}.{self.quote(self.kept_name(table))}"

    def kept_name(self, table: str) -> str:
        return postgres_name(table)

    def _schema_table(self) -> str:
        return self.qualified("duetime_schema")

    def as_text(self, column: str) -> str:
        return f"{self.quote(column)}::text"

    def store_due(self, due_us: int) -> Any:
        return from_micros(due_us)

    def uuid_param(self, text: str) -> Any:
        return uuid.UUID(text)

    def block_range(self, lower: int | None, upper: int | None) -> tuple[str, list[Any]] | None:
        if lower is None and upper is None:
            return None
        where: list[str] = []
        params: list[Any] = []
        if lower is not None:
            where, params = [*where, "ctid >= %s::tid"], [*params, f"({lower},0)"]
        if upper is not None:
            where, params = [*where, "ctid < %s::tid"], [*params, f"({upper},0)"]
        return " AND ".join(where), params

    def source_rows(self, table: str) -> SourceRows:
        return source_rows(self.qualified(table))

    def store_rows(self, table: str) -> PgBulkRows:
        return PgBulkRows(self.schema or "public", table)

    def moving_rows(self, table: str) -> PgBulkRows:
        return PgBulkRows(self.schema or "public", table)

    def reads_by_blocks(self, conn: Any) -> bool:
        return bool(conn.info.server_version >= EXACT_FROM)

    def table_blocks(self, conn: Any, table: str) -> tuple[int, int]:
        """How many blocks ``table`` has, and the rows its statistics expect (-1 or 0 before the
        first ANALYZE)."""
        q = self.qualified(table)
        blocks, tuples = self.execute(
            conn,
            "SELECT (pg_relation_size(%s::regclass) / current_setting('block_size')::int)::bigint, "
            "reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [q, q],
        ).fetchone()
        return int(blocks), int(tuples)

    def count_block_slices(
        self, conn: Any, table: str, selection: Selection, starts: Sequence[int]
    ) -> list[int]:
        """The selected rows in each slice of blocks from one start to the next, each slice by
        its own TID range scan, all in one round trip (a pipeline)."""
        counts: list[Any] = []
        with conn.pipeline():
            for i, start in enumerate(starts):
                end = starts[i + 1] if i + 1 < len(starts) else None
                where, params = self.where(replace(selection, blocks=(start, end)))
                counts.append(
                    self.execute(conn, f"SELECT count(*) FROM {self.qualified(table)} WHERE {where}", params)
                )
        return [int(cursor.fetchone()[0]) for cursor in counts]

    def exact_in_server(self, conn: Any) -> bool:
        return bool(conn.info.server_version >= EXACT_FROM)

    def taking(self, table: str, where: str, returning: str) -> str:
        return take_sql(table, where, returning)

    def same_database(self, other: Database) -> bool:
        if not isinstance(other, PostgresDatabase):
            return False
        if PgOptions.from_url(self.url).conninfo == PgOptions.from_url(other.url).conninfo:
            return True  # spelled alike (the usual case; this is asked once per batch): no round trip
        if urlsplit(self.url).username != urlsplit(other.url).username:
            return False
        return self.place()[:-1] == other.place()[:-1]  # the schema aside: one database

    def pipes_from(self, other: Database) -> bool:
        return isinstance(other, PostgresDatabase)

    def write_staged(self, conn: Any, rows: Sequence[Sequence[Any]]) -> None:
        with conn.cursor().copy(self.query("copy_staged")) as copy:
            for row in rows:
                copy.write_row(row)

    def claim_ids(self, conn: Any, job: str, ids: Sequence[str]) -> set[str]:
        cur = self.execute(conn, self.query("claim_ids"), [job, list(ids)])
        return {r[0] for r in cur.fetchall()}

    def connect(self, write: bool = True) -> Any:
        return connect(PgOptions.from_url(self.url))

    def ensure_schema(self, conn: Any) -> None:
        if self.schema and not self.execute(conn, self.query("schema_exists"), [self.schema]).fetchone():
            self.execute(conn, self.query("create_schema", schema=self.quote(self.schema)))

    def _streaming_cursor(self, conn: Any, size: int) -> Any:
        """A server-side cursor: a plain one fetches the whole result at once."""
        cur = conn.cursor(name=f"duetime_stream_{next(_CURSORS)}")
        cur.itersize = size
        return cur
