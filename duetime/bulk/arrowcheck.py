"""The rows of a typed batch that Arrow alone can vouch for, so most rows never pass through Python.

Why: a bulk import or schedule from Parquet (or a DataFrame) checked every row in Python, 8 µs a
row, about half of the job's Python time; the rows of an export, or of any tidy data set, are
plain: text ids and destinations, µs due times, compact JSON headers. :func:`split_plainly_fine` takes
those out with Arrow's vectorized functions and hands back the rest, which :func:`check_row`
checks row by row as before. So :func:`check_row` stays the one rule: the Arrow test may be
stricter than it, never looser (printable ASCII ids and destinations, headers a compact JSON
object of strings without ``\\u`` escapes, a group of printable ASCII, an id given), and a test holds it to
:func:`check_row` over generated rows, as :func:`duetime.backends.postgres.bulk_records.plainly_fine_sql` is held to
:func:`duetime.bulk.records.problem` for rows a database moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from duetime.message import MAX_BODY_BYTES, MAX_DESTINATION_LENGTH, MAX_HEADERS_BYTES, MAX_ID_LENGTH
from duetime.nservicebus_wire import EMPTY_GUID
from duetime.plainly_fine import COMPACT_HEADERS, EARLIEST_US, GROUP_OPEN, LATEST_US, PLAIN_TEXT

_INT32_MAX = 2**31 - 1
#: A group JSON writes as it is (printable ASCII but the quote and the backslash), so its extra
#: is ``{"group": "…"}`` as :func:`group_extra` writes it.
_PLAIN_GROUP = r"^[!#-\[\]-~]+$"


def split_plainly_fine(
    batch: Any, endpoint: str | None, endpoint_ok: Callable[[str], bool]
) -> tuple[list[Any] | None, Any]:
    """``batch`` (columns as :func:`duetime.bulk.frames.normalize` gives them) split into the
    rows that need no check in Python, as the columns of their records (in :class:`Record`'s
    order) and their groups, and the other rows as they came. ``(None, batch)`` when a column's
    type rules the test out (text ids as numbers, due times as text): every row is checked in
    Python. ``endpoint_ok(name)`` says whether rows may go to the endpoint ``name``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not _plain_types(batch.schema):
        return None, batch
    for name in ("message_id", "destination", "headers", "endpoint", "body", "group"):
        try:
            batch.column(name).validate(full=True)  # Arrow's text may hold bytes that are not UTF-8
        except pa.ArrowInvalid:
            return None, batch
    ident, destination, due = batch.column("message_id"), batch.column("destination"), batch.column("due_at")
    headers, body, encoded = batch.column("headers"), batch.column("body"), batch.column("body_base64")
    failures, group = batch.column("failure_count"), batch.column("group")
    fallback = endpoint or ""
    named = batch.column("endpoint")
    if pa.types.is_null(named.type):
        chosen = pa.array([fallback] * len(batch), pa.string())
    else:
        chosen = pc.if_else(pc.fill_null(pc.equal(named, ""), True), fallback, named)
    allowed = [name for name in pc.unique(chosen).to_pylist() if endpoint_ok(name)]
    checks = [
        _plain_text(ident, MAX_ID_LENGTH),
        _plain_text(destination, MAX_DESTINATION_LENGTH),
        pc.greater_equal(due, EARLIEST_US),
        pc.less(due, LATEST_US),
        pc.is_in(chosen, value_set=pa.array(allowed, pa.string())),
    ]
    if not pa.types.is_null(group.type):
        plain = pc.and_kleene(pc.match_substring_regex(group, _PLAIN_GROUP), pc.not_equal(group, EMPTY_GUID))
        checks.append(pc.or_kleene(pc.is_null(group), plain))
    if not pa.types.is_null(headers.type):
        compact = pc.match_substring_regex(headers, COMPACT_HEADERS)
        small = pc.less_equal(pc.binary_length(headers), MAX_HEADERS_BYTES)
        checks.append(pc.or_kleene(pc.is_null(headers), pc.and_kleene(compact, small)))
    if not pa.types.is_null(body.type):
        checks.append(pc.or_kleene(pc.is_null(body), pc.less_equal(pc.binary_length(body), MAX_BODY_BYTES)))
    if not pa.types.is_null(encoded.type):  # base64 is decoded (strictly) in Python
        checks.append(pc.or_kleene(pc.is_valid(body), pc.is_null(encoded)))
    if not pa.types.is_null(failures.type):
        checks.append(
            pc.or_kleene(
                pc.is_null(failures),
                pc.and_kleene(pc.greater_equal(failures, 0), pc.less_equal(failures, _INT32_MAX)),
            )
        )
    fine = checks[0]
    for check in checks[1:]:
        fine = pc.and_kleene(fine, check)
    fine = pc.fill_null(fine, False)
    rest = batch.filter(pc.invert(fine))
    if rest.num_rows == len(batch):
        return None, batch
    body = pc.fill_null(pc.filter(body, fine).cast(pa.binary()), b"")
    failures = pc.fill_null(pc.filter(failures, fine).cast(pa.int32()), 0)
    kept = [pc.filter(column, fine) for column in (chosen, ident, destination, due, headers)]
    group = pc.filter(group, fine).cast(pa.string())
    extra = pc.binary_join_element_wise(GROUP_OPEN, group, '"}', "")  # group_extra, nothing to escape
    return [*kept, body, failures, extra, group], rest


def _plain_text(column: Any, limit: int) -> Any:
    """Printable ASCII without spaces, 1 to ``limit`` characters: text no check refuses."""
    import pyarrow.compute as pc

    return pc.and_kleene(
        pc.match_substring_regex(column, PLAIN_TEXT), pc.less_equal(pc.utf8_length(column), limit)
    )


def _plain_types(schema: Any) -> bool:
    """Column types whose values Arrow can judge as :func:`check_row` would."""
    import pyarrow as pa

    def text(name: str, null_ok: bool = True) -> bool:
        kind = schema.field(name).type
        return (
            pa.types.is_string(kind) or pa.types.is_large_string(kind) or (null_ok and pa.types.is_null(kind))
        )

    body = schema.field("body").type
    failures = schema.field("failure_count").type
    return (
        text("message_id", null_ok=False)
        and text("destination", null_ok=False)
        and pa.types.is_int64(schema.field("due_at").type)
        and text("headers")
        and text("endpoint")
        and text("body_base64")
        and text("group")
        and (
            pa.types.is_binary(body)
            or pa.types.is_large_binary(body)
            or pa.types.is_string(body)
            or pa.types.is_large_string(body)
            or pa.types.is_null(body)
        )
        and (pa.types.is_integer(failures) or pa.types.is_null(failures))
    )
