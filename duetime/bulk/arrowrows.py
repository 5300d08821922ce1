"""A record frame's Arrow batch of valid rows as a duetime store table's rows, column by column.

Why: a :class:`~duetime.bulk.records.Record` per row, then a row tuple from it, was most of the
Python time of an import into SQLite or MariaDB (0.4 s per 100,000 rows, against 0.43 s for
SQLite's own inserts). The columns come out of Arrow once each and are zipped into rows; the
headers a store would rewrite (:func:`~duetime.bulk.records.store_headers`) are found by Arrow and
only those go through Python.
"""

from __future__ import annotations

from typing import Any

from duetime.bulk.records import store_headers
from duetime.nservicebus_wire import MSMQ_PROPERTIES

#: For each of the store's columns (:data:`~duetime.store_row.STORE_COLUMNS`), in its
#: order, the record batch's column it comes from.
BATCH_COLUMNS = ("message_id", "destination", "due_us", "headers", "body", "failure_count", "group")


def store_rows(batch: Any) -> list[tuple[Any, ...]]:
    """The rows :meth:`DuetimeLayout.to_row` gives for each record of ``batch`` where the due time
    is a count of µs (SQLite, MariaDB): id, destination, due µs, headers as a store keeps them,
    body, failure count, group."""
    columns = [
        (store_headers_column(batch.column(name)) if name == "headers" else batch.column(name)).to_pylist()
        for name in BATCH_COLUMNS
    ]
    return list(zip(*columns, strict=True))


def store_headers_column(headers: Any) -> Any:
    """:func:`store_headers` over a column: the text as it is where it is plainly ready (a JSON
    object from its first character, no ``null``, none of the MSMQ transport's properties), and
    Python's own answer for the rare other rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    headers = pc.if_else(pc.fill_null(pc.equal(headers, ""), True), "{}", headers)
    odd = pc.or_(
        pc.invert(pc.starts_with(headers, "{")),  # XML (the MSMQ transport's), or space before it
        pc.or_(pc.match_substring(headers, "null"), pc.match_substring(headers, MSMQ_PROPERTIES)),
    )
    if not pc.any(odd).as_py():
        return headers
    rewritten = [store_headers(text) for text in pc.filter(headers, odd).to_pylist()]
    return pc.replace_with_mask(headers, odd, pa.array(rewritten, headers.type))
