"""A PostgreSQL database as the bulk jobs and the delivery log see it (:class:`Database`'s
PostgreSQL answers): schemas, ``bytea``, server-side cursors, COPY, and the abilities only a
PostgreSQL server has here (reading a table by blocks, computing a record's columns in the
server, moving rows between two tables or piping them between two servers without Python).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

from duetime.backends.postgres.bulk_records import (
    GROUP_VALUES,
    RECORD_COLUMNS,
    group_sql,
    group_value_sql,
    plainly_fine_sql,
)
from duetime.backends.postgres.bulk_rows import PgBulkRows, source_rows, take_sql, timestamptz_sql
from duetime.backends.postgres.connection import PgOptions, connect
from duetime.backends.source_rows import SourceRows
from duetime.backends.sqldb import Database
from duetime.bulk_interfaces import STATE_TABLES, MovingBulkRows, Selection
from duetime.clock import from_micros
from duetime.inputs.identifiers import postgres_name


def _not_held(ident: str, held: Sequence[str]) -> str:
    """Rows whose id is not one of ``held`` (the statement's last parameter, a text array).

    A long list as an anti-join: ``<> ALL(ids)`` is hashed only from PostgreSQL 15 on, and
    compared id by id a batch whose 100,000 rows the target all holds is 10^10 comparisons. A
    short one (the usual: none) as the array, which is the faster plan when it is short."""
    if len(held) > 1_000:
        return f"NOT EXISTS (SELECT 1 FROM unnest(%s::text[]) AS duetime_present(id) WHERE duetime_present.id = ({ident}))"
    return f"({ident}) <> ALL(%s::text[])"


#: ``ctid`` range scans and an exact ``extract(epoch …)`` (numeric, not double) came in 14.
EXACT_FROM = 140000
_CURSORS = itertools.count()


@dataclass(frozen=True)
class PostgresDatabase(Database):
    """A PostgreSQL database (``postgresql://``), its tables in the URL's schema (``public``)."""

    dialect: ClassVar[str] = "postgres"
    blob: ClassVar[str] = "bytea"

    def _words(self) -> dict[str, str]:
        return super()._words() | {
            "due_us_as_timestamptz": timestamptz_sql("due_us"),
            "group_of_extra": group_sql("extra"),
        }

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

    # -- records computed in the server (a layout of RECORD_COLUMNS, where exact_in_server) -------

    def record_columns(self, layout: str) -> list[str] | None:
        return RECORD_COLUMNS.get(layout)

    def read_records(
        self, conn: Any, table: str, layout: str, selection: Selection, size: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        where, params = self.where(selection)
        columns = ", ".join([*RECORD_COLUMNS[layout], group_value_sql(GROUP_VALUES[layout])])
        return self.stream(conn, f"SELECT {columns} FROM {self.qualified(table)} WHERE {where}", params, size)

    def stage_records(
        self, conn: Any, table: str, layout: str, selection: Selection, run_id: str, batch: int, endpoint: str
    ) -> int:
        """One statement: the rows the source gives up feed the staging table's INSERT."""
        where, params = self.where(selection)
        returning = ", ".join(f"{e} AS c{i}" for i, e in enumerate(RECORD_COLUMNS[layout]))
        taken = take_sql(self.qualified(table), where, returning)
        cur = self.execute(conn, self.query("stage_taken", taken=taken), [*params, run_id, batch, endpoint])
        return int(cur.rowcount)

    def staged_to_check(self, conn: Any, run_id: str, batch: int) -> list[tuple[Any, ...]]:
        fine = plainly_fine_sql(
            ["message_id", "destination", "due_us", "headers", "body", "failure_count", "extra"]
        )
        rows = self.execute(conn, self.query("staged_rows_to_check", fine=fine), [run_id, batch])
        return [tuple(r) for r in rows.fetchall()]

    def ids_held(
        self, conn: Any, table: str, layout: str, selection: Selection, rows: MovingBulkRows
    ) -> list[str]:
        where, params = self.where(selection)
        ident = RECORD_COLUMNS[layout][0]
        return rows.ids_present(
            conn, f"SELECT {ident} AS id FROM {self.qualified(table)} WHERE {where}", params
        )

    def move_plainly_fine(
        self,
        conn: Any,
        table: str,
        layout: str,
        selection: Selection,
        held: Sequence[str],
        rows: MovingBulkRows,
    ) -> tuple[int, int, int | None]:
        exprs = RECORD_COLUMNS[layout]
        where, params = self.where(selection)
        # The store's row: c0..c6 (the group as duetime keeps it: no empty GUID)
        cols = ", ".join(
            f"{e} AS c{i}" for i, e in enumerate([*exprs[:6], group_value_sql(GROUP_VALUES[layout])])
        )
        fine = f"{where} AND {plainly_fine_sql(exprs)} AND {_not_held(exprs[0], held)}"
        return rows.move(conn, take_sql(self.qualified(table), fine, cols), [*params, list(held)])

    def records_left(
        self, conn: Any, table: str, layout: str, selection: Selection, held: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        exprs = RECORD_COLUMNS[layout]
        where, params = self.where(selection)
        text = f"SELECT {', '.join(exprs)} FROM {self.qualified(table)} WHERE {where} AND {_not_held(exprs[0], held)}"
        return [tuple(r) for r in self.execute(conn, text, [*params, list(held)]).fetchall()]

    def take_ids(
        self, conn: Any, table: str, layout: str, selection: Selection, ids: Sequence[str]
    ) -> set[str]:
        ident = RECORD_COLUMNS[layout][0]
        where, params = self.where(selection)
        text = take_sql(self.qualified(table), f"{where} AND ({ident}) = ANY(%s::text[])", ident)
        return {r[0] for r in self.execute(conn, text, [*params, list(ids)]).fetchall()}

    def figures(
        self,
        conn: Any,
        table: str,
        layout: str,
        selection: Selection,
        now_us: int,
        horizons: Sequence[tuple[str, float | None]],
        top: int,
    ) -> list[tuple[Any, ...]]:
        """One scan's figures: the few columns they need kept aside (a materialized CTE), then
        counted by destination, horizon and failures (``GROUPING``) and searched for the largest
        bodies. Two statements scanned the table twice, and a scan reads every row's page (about
        1.6 KB a message) where what is kept aside is a few dozen bytes a row."""
        exprs = RECORD_COLUMNS[layout]
        ident, dest, due, body, failures = exprs[0], exprs[1], exprs[2], exprs[4], exprs[5]
        where, params = self.where(selection)
        # The first bucket whose bound the due time is within, as the rows' way picks it.
        cases = " ".join(
            f"WHEN ({due}) - %s <= {int(bound * 1_000_000)} THEN '{name}'"
            for name, bound in horizons
            if bound is not None
        )
        horizon = f"CASE WHEN ({due}) IS NULL THEN 'later' {cases} ELSE 'later' END"
        bounded = [now_us for _, bound in horizons if bound is not None]
        # octet_length reads a compressed body's size from its header: no body is unpacked
        text = (
            f"WITH r AS MATERIALIZED ("
            f"SELECT COALESCE({dest}, '') AS d, {horizon} AS h, ({failures})::bigint AS f, "
            f"COALESCE(octet_length({body}), 0) AS s, ({ident})::text AS i FROM {self.qualified(table)} WHERE {where}"
            f") SELECT * FROM ("
            f"SELECT d, h, f, GROUPING(d, h, f) AS g, count(*) AS n, NULL::text AS i FROM r "
            f"GROUP BY GROUPING SETS ((d), (h), (f))) AS counted "
            f"UNION ALL SELECT * FROM ("
            f"SELECT d, NULL::text, NULL::bigint, -1, s::bigint, i FROM r "
            f'ORDER BY s DESC, i COLLATE "C" LIMIT %s) AS largest'
        )
        return [tuple(r) for r in self.execute(conn, text, [*bounded, *params, top]).fetchall()]

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

    def staged_store_rows(self, source: Database) -> str:
        return self.query("staged_store_rows", staged=source.qualified(STATE_TABLES["staged"]))

    def copy_staged_out(self) -> str:
        return self.query("copy_staged_out")

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
