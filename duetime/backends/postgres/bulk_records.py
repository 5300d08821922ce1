"""A bulk job's records computed by a PostgreSQL server from a source table's rows, so a
same-server move, an export or a report never brings a row to Python that needs no look.

What a record is (``duetime.bulk.records.Record``: id, destination, due µs, headers text, body,
failure count, extra) and the rule that says what is wrong with one (``problem``) are the bulk
jobs'; how this server reads each layout's columns as a record (:data:`RECORD_COLUMNS`, its
group as :data:`GROUP_VALUES`) and which rows it can vouch for (:func:`plainly_fine_sql`) are
this backend's, so a change to the store table's column types is made here.
"""

from __future__ import annotations

from collections.abc import Sequence

from duetime.message import MAX_BODY_BYTES, MAX_DESTINATION_LENGTH, MAX_HEADERS_BYTES, MAX_ID_LENGTH
from duetime.nservicebus_wire import EMPTY_GUID, MSMQ_PROPERTIES
from duetime.plainly_fine import COMPACT_HEADERS, EARLIEST_US, LATEST_US, PLAIN_TEXT

#: For each layout this server can read as records (by the layout's name), the expressions of a
#: record's columns over one of its rows. ``extract(epoch …)`` is exact (numeric) from 14 on.
RECORD_COLUMNS: dict[str, list[str]] = {
    "duetime": [
        "message_id",
        "destination",
        "(extract(epoch FROM due_at) * 1000000)::bigint",
        "headers::text",
        "body",
        "failure_count",
        "CASE WHEN group_key IS NULL THEN NULL ELSE json_build_object('group', group_key)::text END",
    ],
    "timeoutdata": [
        '"Id"::text',
        '"Destination"',
        """(extract(epoch FROM "Time") * 1000000)::bigint""",
        '"Headers"',
        """coalesce("State", ''::bytea)""",
        "0",
        """json_build_object('SagaId', "SagaId"::text, 'PersistenceVersion', "PersistenceVersion")::text""",
    ],
}
#: Each layout's group text read from its own column, without the round trip through the
#: record's ``extra`` JSON (it cost a same-database move 40 % of its time).
GROUP_VALUES: dict[str, str] = {"duetime": "group_key", "timeoutdata": '"SagaId"::text'}


def plainly_fine_sql(exprs: Sequence[str]) -> str:
    """A condition over a record's expressions, true only for rows ``problem`` finds nothing
    wrong with and whose headers a store keeps as they are (``store_ready``).

    Why: a same-database move then leaves such rows in the server, and only the rest (those it
    is false or null for) come to Python, where ``problem`` stays the one rule. So it may be
    stricter than the rule, never looser: printable ASCII ids and destinations, compact JSON
    headers of plain strings; anything else is simply checked in Python. A test holds it to
    ``problem`` over generated rows.
    """
    ident, destination, due, headers, body, failures, _ = exprs
    checks = [
        f"({ident}) ~ '{PLAIN_TEXT}'",
        f"length({ident}) <= {MAX_ID_LENGTH}",
        f"({destination}) ~ '{PLAIN_TEXT}'",
        f"length({destination}) <= {MAX_DESTINATION_LENGTH}",
        f"({due}) >= {EARLIEST_US}",
        f"({due}) < {LATEST_US}",
        f"({headers}) ~ '{COMPACT_HEADERS}'",
        f"position('null' in ({headers})) = 0",
        f"position('{MSMQ_PROPERTIES}' in ({headers})) = 0",
        f"octet_length({headers}) <= {MAX_HEADERS_BYTES}",
        f"coalesce(octet_length({body}), 0) <= {MAX_BODY_BYTES}",
        f"({failures}) >= 0",
    ]
    return "coalesce(" + " AND ".join(checks) + ", false)"


def group_sql(extra: str) -> str:
    """A record's group (``group_of``: duetime's own, or an NServiceBus saga's) over its
    ``extra`` text column."""
    return group_value_sql(f"coalesce(({extra})::json->>'group', ({extra})::json->>'SagaId')")


def group_value_sql(value: str) -> str:
    """A group over the group's text itself: the empty GUID NServiceBus stores outside a saga
    is no group."""
    return f"NULLIF({value}, '{EMPTY_GUID}')"
