"""Table layouts the bulk jobs read and write: duetime's own, NServiceBus ``TimeoutData``, the MSMQ transport's delayed store.

A layout knows its columns, turns a row into a :class:`Record` and back (so ``abort`` can put a
row back as it was), and finds the tables of each endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from duetime.bulk.records import (
    Record,
    bulk_row,
    due_us_of,
    group_extra,
    parse_headers,
    to_header_infos,
)
from duetime.bulk_interfaces import Selection, SqlDatabase
from duetime.clock import from_micros, to_micros
from duetime.errors import ConfigurationError
from duetime.store_row import STORE_COLUMNS


class Layout:
    name = ""
    columns: tuple[str, ...] = ()
    key = ""
    due = ""
    #: Suffix of the default table name after the endpoint.
    suffix = ""
    #: PostgreSQL type of the key column (for ``= ANY(%s::type[])``).
    key_type = "text"
    in_flight = False

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    def table_for(self, endpoint: str) -> str:
        return self.db.table or f"{endpoint}{self.suffix}"

    def endpoint_of(self, table: str) -> str:
        return table[: -len(self.suffix)] if self.suffix and table.endswith(self.suffix) else table

    def discover(self, conn: Any) -> list[tuple[str, str]]:
        """(endpoint, table) for every table of this layout in the database."""
        if self.db.table:
            return [(self.endpoint_of(self.db.table), self.db.table)]
        found = []
        for table in self.db.tables(conn):
            if table.endswith(self.suffix) and self.db.has_columns(conn, table, self.columns):
                found.append((self.endpoint_of(table), table))
        return found

    #: Columns read as their stored text, byte for byte (a driver may parse a json column).
    as_stored: tuple[str, ...] = ()

    def selection(self, cutoff_us: int | None, now_us: int) -> Selection:
        """The rows a job takes: due at the cutoff or later (the timeout migration tool's
        ``Time >= @CutOffTime``)."""
        due_from = None if cutoff_us is None else self.due_param(cutoff_us)
        return Selection(self.due, due_from=due_from, key=self.key)

    def due_param(self, due_us: int) -> Any:
        return due_us

    def to_record(self, endpoint: str, row: Sequence[Any]) -> Record:
        raise NotImplementedError

    def to_row(self, record: Record) -> tuple[Any, ...]:
        raise NotImplementedError


class DuetimeLayout(Layout):
    """duetime's own store tables. Rows a live dispatcher has claimed are in flight: left alone."""

    name = "duetime"
    columns = STORE_COLUMNS
    key = "message_id"
    due = "due_at"
    suffix = ".delayed"

    def discover(self, conn: Any) -> list[tuple[str, str]]:
        if self.db.table:
            return [(self.endpoint_of(self.db.table), self.db.table)]
        return [(self.endpoint_of(t), t) for t in self.db.store_tables(conn)]

    as_stored = ("headers",)  # export carries the stored text byte for byte

    def selection(self, cutoff_us: int | None, now_us: int) -> Selection:
        chosen = super().selection(cutoff_us, now_us)
        return chosen if self.in_flight else replace(chosen, unclaimed_at=self.due_param(now_us))

    def due_param(self, due_us: int) -> Any:
        return self.db.store_due(due_us)

    def to_record(self, endpoint: str, row: Sequence[Any]) -> Record:
        extra = None if row[6] is None else group_extra(row[6])
        return Record(endpoint, row[0], row[1], due_us_of(row[2]), row[3], bytes(row[4]), int(row[5]), extra)

    def to_row(self, record: Record) -> tuple[Any, ...]:
        """The row a duetime store keeps (:func:`bulk_row`), its due time as this database takes it."""
        row = bulk_row(record)
        return (*row[:2], self.due_param(row[2]), *row[3:])


#: The timeout migration tool's cutoff when none is given: ``DateTime.Parse("2012-01-01")`` in its
#: Program.cs, for preview and migrate alike. The endpoint never sends older timeouts either (its
#: poller starts ten years back and SQL persistence asks for ``Time > start``).
TOOL_CUTOFF = datetime(2012, 1, 1, tzinfo=UTC)
TOOL_CUTOFF_US = to_micros(TOOL_CUTOFF)


class TimeoutDataLayout(Layout):
    """NServiceBus SQL persistence's ``TimeoutData``: Id, Destination, SagaId, State, Time,
    Headers (JSON), PersistenceVersion. ``Time`` is UTC without a zone; ``State`` is the body."""

    name = "timeoutdata"
    columns = ("Id", "Destination", "SagaId", "State", "Time", "Headers", "PersistenceVersion")
    key = "Id"
    due = "Time"
    suffix = "_TimeoutData"
    key_type = "uuid"

    def table_for(self, endpoint: str) -> str:
        return self.db.table or f"{endpoint.replace('.', '_')}{self.suffix}"

    def selection(self, cutoff_us: int | None, now_us: int) -> Selection:
        """Without a cutoff, the timeout migration tool's own: timeouts due before 2012 stay where
        they are, as the tool leaves them (and as the endpoint never sent them)."""
        return super().selection(TOOL_CUTOFF_US if cutoff_us is None else cutoff_us, now_us)

    def due_param(self, due_us: int) -> Any:
        return from_micros(due_us).replace(tzinfo=None)

    def to_record(self, endpoint: str, row: Sequence[Any]) -> Record:
        extra = json.dumps({"SagaId": None if row[2] is None else str(row[2]), "PersistenceVersion": row[6]})
        body = b"" if row[3] is None else bytes(row[3])
        return Record(endpoint, str(row[0]), row[1], due_us_of(row[4]), row[5], body, 0, extra)

    def to_row(self, record: Record) -> tuple[Any, ...]:
        extra = json.loads(record.extra or "{}")
        saga = extra.get("SagaId")
        ident = self.db.uuid_param(record.message_id)
        saga = None if saga is None else self.db.uuid_param(saga)
        due = None if record.due_us is None else self.due_param(record.due_us)
        return (
            ident,
            record.destination,
            saga,
            record.body,
            due,
            record.headers,
            extra.get("PersistenceVersion", ""),
        )


class MsmqLayout(Layout):
    """The NServiceBus MSMQ transport's delayed-message store (``SqlServerDelayedMessageStore``):
    Id, Destination, State, Time, Headers, RetryCount, in ``<endpoint>.timeouts`` by default.
    ``Headers`` are the bytes the transport writes (the XML list of ``HeaderInfo``); JSON text is
    read too. Written back as XML, as the transport and TimeoutMigrationTool's MSMQ target write."""

    name = "msmq"
    columns = ("Id", "Destination", "State", "Time", "Headers", "RetryCount")
    key = "Id"
    due = "Time"
    suffix = ".timeouts"

    def due_param(self, due_us: int) -> Any:
        return from_micros(due_us).replace(tzinfo=None)

    def to_record(self, endpoint: str, row: Sequence[Any]) -> Record:
        raw = row[4]
        if isinstance(raw, bytes | bytearray | memoryview):
            try:
                headers: str | None = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                headers = "\ufffd" + bytes(raw).hex()  # unreadable: preview says so, abort keeps it
        else:
            headers = raw
        body = b"" if row[2] is None else bytes(row[2])
        extra = json.dumps({"headers_binary": not isinstance(raw, str)})
        return Record(
            endpoint, str(row[0]), row[1], due_us_of(row[3]), headers, body, int(row[5] or 0), extra
        )

    def to_row(self, record: Record) -> tuple[Any, ...]:
        extra = json.loads(record.extra or "{}")
        headers: Any = record.headers
        if "headers_binary" not in extra:  # from another layout: headers in the MSMQ form
            headers = to_header_infos(parse_headers(headers))
            extra = {"headers_binary": True}
        if extra.get("headers_binary") and headers is not None:
            headers = bytes.fromhex(headers[1:]) if headers.startswith("\ufffd") else headers.encode()
        due = None if record.due_us is None else self.due_param(record.due_us)
        return (record.message_id, record.destination, record.body, due, headers, record.failure_count)


def layout_for(db: SqlDatabase) -> Layout:
    """The layout ``db``'s URL names, where the database can hold it."""
    if db.layout != "duetime" and not db.keeps_other_layouts:
        raise ConfigurationError(
            f"layout={db.layout} tables live in PostgreSQL or MariaDB, not SQLite ({db.display})."
        )
    return {"duetime": DuetimeLayout, "timeoutdata": TimeoutDataLayout, "msmq": MsmqLayout}[db.layout](db)
