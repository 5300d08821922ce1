"""Checked records in Arrow columns as PostgreSQL's binary COPY rows, encoded by Arrow, not per row.

Why: writing an imported batch record by record (a :class:`Record` per row, its due time as a
datetime, psycopg formatting each field) took 0.85-1 s of Python per 100,000 rows, the larger half
of a file import's Python time; Arrow's vectorized functions encode the same rows in 0.03-0.2 s.
The layout is COPY's binary format (a 16-bit field count, then each field as a 32-bit length and
its bytes, -1 for NULL); which PostgreSQL type each of the store row's columns is sent as is the
store's writer's to say (``copy_types``), so a change to the table's column types is made there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime.bulk.arrowrows import BATCH_COLUMNS, store_headers_column

#: What a binary COPY stream starts and ends with.
HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
#: 2000-01-01 in µs since 1970: PostgreSQL's timestamps count from there.
_PG_EPOCH_US = 946_684_800_000_000


def copy_rows(batch: Any, types: Sequence[str]) -> memoryview:
    """The rows of a record frame's batch (every row checked, none with a problem) as binary
    COPY rows of a store row's columns (:data:`~duetime.arrowrows.BATCH_COLUMNS`' order), each
    encoded as the store's writer says it takes it (``types``: its ``copy_types``); headers as
    :func:`store_headers` keeps them. A type this does not encode is a ``ValueError``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(types) != len(BATCH_COLUMNS):
        raise ValueError(f"{len(types)} COPY types for the store row's {len(BATCH_COLUMNS)} columns")
    fields = [_encoded(kind, _column(batch, name)) for kind, name in zip(types, BATCH_COLUMNS, strict=True)]
    count = len(BATCH_COLUMNS).to_bytes(2, "big")
    rows = pc.binary_join_element_wise(_scalar(count), *fields, _scalar(b""))
    assert isinstance(rows, pa.LargeBinaryArray)
    _, offsets, data = rows.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)
    return memoryview(data)[bounds[rows.offset] : bounds[rows.offset + len(rows)]]


def _column(batch: Any, name: str) -> Any:
    column = batch.column(name)
    return store_headers_column(column) if name == "headers" else column


def _encoded(kind: str, column: Any) -> Any:
    """One column as COPY fields of PostgreSQL's binary type ``kind``."""
    if kind in ("text", "bytea", "json"):  # json's binary form is its text
        return _field(column)
    if kind in ("int4", "int8"):
        width = 4 if kind == "int4" else 8
        values = column.to_numpy(zero_copy_only=False)
        return _fixed(width.to_bytes(4, "big"), values.astype(f">i{width}").tobytes(), width, len(values))
    if kind == "timestamptz":  # µs since 1970 as µs since 2000
        due = column.to_numpy(zero_copy_only=False)
        return _fixed(b"\x00\x00\x00\x08", (due - _PG_EPOCH_US).astype(">i8").tobytes(), 8, len(due))
    raise ValueError(f"binary COPY of PostgreSQL type {kind!r} is not written here")


def _scalar(value: bytes) -> Any:
    import pyarrow as pa

    return pa.scalar(value, pa.large_binary())


def _lengths(values: Any) -> bytes:
    import pyarrow.compute as pc

    lengths: bytes = (
        pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(">i4").tobytes()
    )
    return lengths


def _fixed(prefix: bytes, data: bytes, width: int, count: int) -> Any:
    """``count`` values of ``width`` bytes each (``data``), each after ``prefix``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), count, [None, pa.py_buffer(data)])
    values = values.cast(pa.large_binary())
    return pc.binary_join_element_wise(_scalar(prefix), values, _scalar(b"")) if prefix else values


def _field(column: Any) -> Any:
    """A text or binary column as COPY fields: each value's length and bytes, NULL as -1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.cast(pa.large_binary())
    fields = pc.binary_join_element_wise(_fixed(b"", _lengths(values), 4, len(values)), values, _scalar(b""))
    if values.null_count:
        fields = pc.if_else(pc.is_null(values), _scalar(b"\xff\xff\xff\xff"), fields)
    return fields
