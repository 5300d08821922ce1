"""DataFrames and files in, :class:`Record` out: Parquet, JSON Lines, or any DataFrame of rows.

Accepted columns (only ``destination`` and ``due_at`` are required): ``message_id`` or ``id``,
``destination``, ``due_at`` (a timestamp, ISO 8601 text with an offset, or µs since 1970),
``body`` (binary or text) or ``body_base64``, ``headers`` (JSON text, a map or a struct),
``endpoint``, ``failure_count``. Rows without an id get one derived from their content, so a re-run
schedules the same ids and never doubles a message.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from duetime.bulk.arrowcheck import split_plainly_fine
from duetime.bulk.records import Record, due_us_of, group_extra, problem
from duetime.errors import ConfigurationError, InvalidMessage
from duetime.inputs.identifiers import check_name
from duetime.inputs.jsontext import read_json
from duetime.message import MAX_FAILURE_COUNT, dump_headers, kind

T = TypeVar("T")
#: Pairs a bulk job carries: the record, and why it cannot be used (None when it can).
Checked = tuple[Record, str | None]
_NAMESPACE = uuid.UUID("6f0c5c2e-8f55-4c1a-9d7e-2b1f3a9c6d10")


def normalize(df: Any) -> Any:
    """The accepted columns of a DataFrame, each as Python will read it in :func:`check_row`.

    Values pass through as the table holds them, so a value of the wrong type is that row's reason
    by the same rules as a JSON line's (a number as the destination or the body, a struct as the
    id, 1.5 failures), never a cast that quietly makes it something else ("5", the text "2" as a
    body, one failure). Only what has one faithful form is converted here: a timestamp becomes its
    microseconds since 1970, headers given as a map or struct become their JSON object."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StructType, TimestampNTZType, TimestampType

    fields = {f.name: f.dataType for f in df.schema.fields}
    if "destination" not in fields or "due_at" not in fields:
        raise ConfigurationError(
            f"Rows need at least 'destination' and 'due_at' columns; these have {sorted(fields)}."
        )

    def given(name: str, *others: str) -> Any:
        found = next((n for n in (name, *others) if n in fields), None)
        return (F.col(found) if found else F.lit(None)).alias(name)

    due = F.col("due_at")
    if isinstance(fields["due_at"], TimestampType):
        due = F.unix_micros(due)
    elif isinstance(fields["due_at"], TimestampNTZType):
        # A timestamp without a time zone (pandas' naive datetimes in Parquet) is UTC, as a naive
        # datetime is everywhere in duetime. A cast to TIMESTAMP would read it in the session's
        # time zone and move every due time by that zone's offset, and so does Spark's
        # timestampdiff; its fields (zone-free) put together again in UTC do not.
        due = F.expr(
            "unix_micros(make_timestamp(year(due_at), month(due_at), day(due_at), hour(due_at), "
            "minute(due_at), extract(SECOND FROM due_at), 'UTC'))"
        )
    headers = F.col("headers") if "headers" in fields else F.lit(None)
    if isinstance(fields.get("headers"), MapType | StructType):
        headers = F.to_json(headers)
    return df.select(
        given("destination"),
        due.alias("due_at"),
        given("message_id", "id"),
        given("body"),
        given("body_base64"),
        headers.alias("headers"),
        given("endpoint"),
        given("failure_count"),
        given("group"),
    )


def checked_rows(rows: Iterable[Any], endpoint: str | None) -> Iterator[Checked]:
    """Rows of :func:`normalize` (Spark Rows or dicts) as checked records."""
    for row in rows:
        data = row.asDict() if hasattr(row, "asDict") else dict(row)
        yield check_row(data, endpoint)


def check_row(data: dict[str, Any], endpoint: str | None) -> Checked:
    """A row as a record and why it cannot be stored (None: it can). A JSON line's values may
    be of any JSON type: one of the wrong type is a reason, never a crash of the task nor a
    quiet conversion (a number as the body once became that many zero bytes)."""
    reasons: list[str] = []
    due_text = data.get("due_at")
    due_us: int | None = None
    try:
        if due_text is None:
            due_us = None
        elif isinstance(due_text, int) and not isinstance(due_text, bool):  # a timestamp column's µs
            due_us = due_text
        else:
            due_us = int(due_text) if str(due_text).lstrip("-").isdigit() else due_us_of(str(due_text))
    except (InvalidMessage, ValueError) as error:
        reasons.append(f"due time {due_text!r} cannot be read: {error}")
    headers = data.get("headers")
    if isinstance(headers, bytes):
        headers = _text_or_none(headers, "headers", reasons)
    if isinstance(headers, dict):
        headers = dump_headers(headers)
    elif headers is not None and not isinstance(headers, str):
        reasons.append(f"headers must be a JSON object of text, got {kind(headers)}.")
        headers = None
    body = _body(data, reasons)
    name = _text_or_none(data.get("endpoint"), "endpoint", reasons) or endpoint or ""
    destination = _text_or_none(data.get("destination"), "destination", reasons)
    given_id = data.get("message_id")
    if isinstance(given_id, int) and not isinstance(given_id, bool):
        given_id = str(given_id)  # a numeric id in a JSON file is still that id
    message_id = _text_or_none(given_id, "message id", reasons) or derived_id(
        destination, due_us, body, headers
    )
    failures = _whole(data.get("failure_count") or 0)
    if failures is None or not 0 <= failures <= MAX_FAILURE_COUNT:
        reasons.append(
            f"failure_count must be a whole number from 0 to {MAX_FAILURE_COUNT:,}, "
            f"got {kind(data.get('failure_count'))}."
        )
        failures = 0  # a row with a reason is never written: any value fits the column
    group = _text_or_none(data.get("group"), "group", reasons)
    record = Record(
        name,
        message_id,
        destination,
        due_us,
        headers,
        body,
        failures or 0,
        None if group is None else group_extra(group),
    )
    if not reasons and (wrong := _endpoint_problem(name)):
        reasons.append(wrong)
    return record, reasons[0] if reasons else problem(record)


_NUMBER_OR_BOOLEAN = re.compile(r"[-+.0-9eE]+|true|false")


@functools.lru_cache(maxsize=1024)
def _endpoint_problem(name: str) -> str | None:
    """Why rows cannot go to endpoint ``name`` (its store table is named after it); asked once
    per name, as a data set names few."""
    if not name:
        return "no endpoint: give --endpoint or an 'endpoint' column."
    try:
        check_name("endpoint", name)
    except ConfigurationError as error:
        return str(error)
    return None


def _whole(value: object) -> int | None:
    """A whole number as JSON or a table may give it (3, 3.0, "3"); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _text_or_none(value: object, name: str, reasons: list[str]) -> str | None:
    """``value`` when it is text or missing; anything else is a reason (and None). Text may come
    as UTF-8 bytes: a Parquet column written without its string annotation reads as binary."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            reasons.append(f"{name} is not UTF-8 text.")
            return None
    reasons.append(f"{name} must be text, got {kind(value)}.")
    return None


def _body(data: dict[str, Any], reasons: list[str]) -> bytes:
    """The body as bytes: given as bytes, as text (UTF-8), or as strict base64 in ``body_base64``."""
    body = data.get("body")
    if body is None and data.get("body_base64") is not None:
        encoded = data["body_base64"]
        try:
            if not isinstance(encoded, str):
                raise TypeError(kind(encoded))
            # line breaks are allowed (Spark's base64 writes MIME lines of 76); nothing else
            return base64.b64decode("".join(encoded.split()), validate=True)
        except (TypeError, ValueError) as error:  # binascii.Error is a ValueError
            reasons.append(f"body_base64 must be base64 text ({error}).")
            return b""
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    reasons.append(f"body must be text or bytes, got {kind(body)}.")
    return b""


def derived_id(destination: object, due_us: int | None, body: bytes, headers: str | None) -> str:
    """The same row always gets the same id: a re-run never schedules a second copy."""
    digest = hashlib.sha256()
    for part in (str(destination), str(due_us), headers or "", body.hex()):
        digest.update(part.encode())
        digest.update(b"\x00")
    return str(uuid.uuid5(_NAMESPACE, digest.hexdigest()))


def _json_line(line: str | bytes) -> dict[str, Any]:
    try:
        data = read_json(line.decode() if isinstance(line, bytes) else line)
    except UnicodeDecodeError as error:
        return {
            "destination": None,
            "due_at": None,
            "_error": f"line is not UTF-8 text (byte {error.object[error.start]:#04x} at {error.start})",
        }
    except (ValueError, RecursionError) as error:  # not JSON, or nested too deeply to read
        return {
            "destination": None,
            "due_at": None,
            "message_id": None,
            "headers": None,
            "_error": f"line is not JSON ({error})",
        }
    if not isinstance(data, dict):
        return {"destination": None, "due_at": None, "_error": "line is not a JSON object"}
    if "id" in data and "message_id" not in data:
        data["message_id"] = data.pop("id")
    return data


def check_json(data: dict[str, Any], endpoint: str | None) -> Checked:
    if "_error" in data:
        return Record(endpoint or "", "", None, None, None, b"", 0), data["_error"]
    return check_row(data, endpoint)


def file_kind(url: str) -> tuple[str, str] | None:
    """('parquet'|'jsonl', path) for a file URL, None for a database URL."""
    scheme, _, rest = url.partition(":")
    if scheme in ("parquet", "jsonl"):
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ConfigurationError(f"{url!r} names no path; e.g. parquet:/data/timeouts.")
        return scheme, path
    return None


# -- records as Arrow-backed DataFrames: bounded chunks, no pickled Python objects ---------------

#: Rows per Arrow batch a task hands over: bounds a task's memory whatever the batch size.
CHUNK_ROWS = 10_000
#: The columns of a record frame: a :class:`Record`, its group, and ``problem`` (why it cannot be
#: stored; null when it can, or when nobody asked).
RECORD_SCHEMA = (
    "endpoint string, message_id string, destination string, due_us long, headers string, "
    "body binary, failure_count int, extra string, group string, problem string"
)
_NAMES = [f.split()[0] for f in RECORD_SCHEMA.split(", ")]


def _arrow_types() -> list[Any]:
    import pyarrow as pa

    return [pa.string()] * 3 + [pa.int64(), pa.string(), pa.binary(), pa.int32()] + [pa.string()] * 3


def arrow_chunks(pairs: Iterable[Checked]) -> Iterator[Any]:
    """Checked records as Arrow record batches of at most :data:`CHUNK_ROWS` rows."""
    import pyarrow as pa

    from duetime.bulk.records import group_of

    types = _arrow_types()

    def batch(chunk: list[Checked]) -> Any:
        columns: list[list[Any]] = [[r[i] for r, _ in chunk] for i in range(8)]
        columns.append([group_of(r) for r, _ in chunk])
        columns.append([why for _, why in chunk])
        return pa.RecordBatch.from_arrays(
            [pa.array(c, type=t) for c, t in zip(columns, types, strict=True)], names=_NAMES
        )

    for chunk in chunked(pairs, CHUNK_ROWS):
        yield batch(chunk)


def unchecked_batch(endpoint: str, rows: Sequence[Sequence[Any]]) -> Any:
    """Rows whose columns are already a record's, message_id … extra then the group (as a
    database computes them), as one Arrow record batch with no problem column: no record object
    per row (an export spent two thirds of its Python time building and taking those apart)."""
    import pyarrow as pa

    types = _arrow_types()
    columns = list(zip(*rows, strict=True)) if rows else [()] * 8
    arrays = [pa.array([endpoint] * len(rows), type=types[0])]
    arrays += [pa.array(c, type=t) for c, t in zip(columns, types[1:9], strict=True)]
    arrays.append(pa.nulls(len(rows), type=types[9]))
    return pa.RecordBatch.from_arrays(arrays, names=_NAMES)


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size``: a stream of any length in bounded memory."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def checked_of(batches: Iterable[Any]) -> Iterator[Checked]:
    """Arrow batches of a record frame back as checked records, a batch at a time."""
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in (*Record._fields, "problem")]
        for values in zip(*columns, strict=True):
            body = values[5]
            yield (
                Record(
                    values[0] or "",
                    values[1] or "",
                    values[2],
                    values[3],
                    values[4],
                    b"" if body is None else bytes(body),
                    int(values[6] or 0),
                    values[7],
                ),
                values[8],
            )


def record_frame(spark: Any, work: Sequence[Any], produce: Callable[[Any], Iterable[Checked]]) -> Any:
    """A record frame with one task per item of ``work``, each streaming ``produce(item)`` to
    Spark in Arrow chunks (a whole batch never sits in Python lists)."""
    return batch_frame(spark, work, lambda item: arrow_chunks(produce(item)))


def batch_frame(spark: Any, work: Sequence[Any], produce: Callable[[Any], Iterable[Any]]) -> Any:
    """A record frame with one task per item of ``work``, each streaming the Arrow record batches
    (:data:`RECORD_SCHEMA`) that ``produce(item)`` gives."""
    items = list(work)
    seeds = spark.createDataFrame(
        spark.sparkContext.parallelize([(i,) for i in range(len(items))], max(1, len(items))), "item int"
    )

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from produce(items[index])

    return seeds.mapInArrow(run, RECORD_SCHEMA)


def per_partition(frame: Any, action: Callable[[int, Iterator[Checked]], Any], schema: str) -> list[Any]:
    """Run ``action(partition number, its checked records)`` on every partition of a record frame;
    the rows it returns (tuples matching ``schema``) are collected on the driver."""
    return per_partition_batches(frame, lambda number, batches: action(number, checked_of(batches)), schema)


def per_partition_batches(frame: Any, action: Callable[[int, Iterator[Any]], Any], schema: str) -> list[Any]:
    """:func:`per_partition` handing ``action`` the partition's Arrow batches as they come."""
    import pyarrow as pa

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        number = 0 if context is None else context.partitionId()
        rows = list(action(number, batches))
        names = [f.split()[0] for f in schema.split(", ")]
        yield pa.RecordBatch.from_pylist(
            [dict(zip(names, r, strict=True)) for r in rows], schema=_arrow(schema)
        )

    return [tuple(r) for r in frame.mapInArrow(run, schema).collect()]


def _arrow(schema: str) -> Any:
    import pyarrow as pa

    kinds = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "boolean": pa.bool_()}
    return pa.schema([(name, kinds[kind]) for name, kind in (f.split() for f in schema.split(", "))])


def file_rows(spark: Any, path: str, fmt: str) -> int:
    """How many records the files hold, without checking any: a Parquet count reads only the
    files' footers; a JSON Lines file is one record a line. Call it after
    :func:`~duetime.bulk.hadoopfs.input_files`, which refuses a path with no files."""
    from duetime.bulk.hadoopfs import quiet, unreadable

    try:
        with quiet(spark):
            return int((spark.read.parquet(path) if fmt == "parquet" else spark.read.text(path)).count())
    except Exception as error:  # Py4J's and Spark's errors alike: a file of another format
        raise ConfigurationError(unreadable(path, fmt, error)) from None


def check_batch_rows(rows: int) -> None:
    """``--batch-rows``: small enough that a task's transaction stays short, large enough that
    Spark's per-task cost does not dominate."""
    if not 100 <= rows <= 5_000_000:
        raise ConfigurationError("--batch-rows must be between 100 and 5,000,000.")


def partitions_for(rows: int, partition_rows: int) -> int:
    """How many tasks share ``rows``: about ``partition_rows`` each, at least one."""
    return max(1, -(-rows // partition_rows))


def by_row_count(frame: Any, partitions: int) -> Any:
    """A record frame spread over ``partitions`` tasks by a hash of each message id.

    Why not the reader's own splits: a Parquet file written as one large row group is one task
    however many rows it holds, and where the reader splits files depends on the cluster's cores
    and settings. A file migration ledgers what it wrote by partition number, so a run resumed
    on another cluster must find the same rows under the same number: the hash of the id (derived
    from the row's content when the files have none) and a count taken from the files are the
    same wherever the run goes on.
    """
    if partitions == 1:  # every row in partition 0 wherever it runs, without a shuffle
        return frame.coalesce(1)
    return frame.repartition(partitions, "message_id")


@contextmanager
def kept(frame: Any) -> Iterator[Any]:
    """``frame`` computed once, kept on the executors' disks while the job reads it again.

    A job asks a record frame more than once (the endpoints whose tables the driver creates
    first, then the rows to write, then the rejects), and each ask ran every row through Python
    again: the check, a shuffle, and for a caller's DataFrame its whole lineage. Disk, not
    memory: a data set of any size fits, and a lost executor's share is computed again."""
    from pyspark import StorageLevel

    held = frame.persist(StorageLevel.DISK_ONLY)
    try:
        yield held
    finally:
        held.unpersist()


def checked_files(
    spark: Any, path: str, fmt: str, endpoint: str | None, partitions: int | None = None
) -> Any:
    """A record frame read from Parquet or JSON Lines files, through Spark's readers; with
    ``partitions``, spread over that many tasks by :func:`by_row_count`."""
    frame = _checked_files(spark, path, fmt, endpoint)
    return frame if partitions is None else by_row_count(frame, partitions)


def file_endpoints(spark: Any, path: str, fmt: str, endpoint: str | None) -> list[str]:
    """The endpoints the files name (a row's own, else ``endpoint``), read by Spark alone: one
    column of Parquet, one field of each JSON line, no row through Python.

    Every row's endpoint, not only those of rows that pass the check (which would need the
    checked rows, kept on disk between two passes: 5 s of a 1M-row import's 11 s of JVM time).
    An endpoint whose every row is rejected so gets an empty store table; its rows are still
    rejected and counted. A name no endpoint may have is left out: its rows' check rejects them,
    and so is a JSON line's endpoint that is not text (``"endpoint": 5`` is a reason, not the
    endpoint "5"): see :func:`_given_as_text`."""
    from pyspark.sql import functions as F

    if fmt == "parquet":
        files = spark.read.parquet(path)
        if dict(files.dtypes).get("endpoint") not in ("string", "binary"):  # none, or each a reason
            return [endpoint] if endpoint else []
        named = F.col("endpoint").cast("string")  # binary: text without Parquet's annotation
    else:
        files = spark.read.text(path)
        named = F.get_json_object(F.col("value"), "$.endpoint")
    chosen = F.coalesce(F.when(named != "", named), F.lit(endpoint))
    found = files.select(chosen.alias("endpoint")).distinct().collect()
    names = {str(r[0]) for r in found if r[0] and _endpoint_problem(str(r[0])) is None}
    if fmt == "jsonl":  # the fallback endpoint is the caller's word, whatever the lines say
        names = _given_as_text(files, named, names - {endpoint}) | names & {endpoint}
    return sorted(names)


def file_destinations(spark: Any, path: str, fmt: str, limit: int = 1000) -> tuple[list[str], bool]:
    """The destinations the files name (at most ``limit``, and whether there are more), read as
    :func:`file_endpoints` reads the endpoints: one column of Parquet, one field of each JSON line.
    For the warning about destinations no queue is declared for, before a job stores anything."""
    from pyspark.sql import functions as F

    if fmt == "parquet":
        files = spark.read.parquet(path)
        if dict(files.dtypes).get("destination") not in ("string", "binary"):
            return [], False
        named = F.col("destination").cast("string")
    else:
        files = spark.read.text(path)
        named = F.get_json_object(F.col("value"), "$.destination")
    found = files.select(named.alias("d")).where(F.col("d") != "").distinct().limit(limit + 1).collect()
    names = sorted(str(r[0]) for r in found if r[0])
    return names[:limit], len(names) > limit


def _given_as_text(lines: Any, named: Any, names: set[str]) -> set[str]:
    """Those of ``names`` that some JSON line gives as text.

    Spark's JSON functions turn any value into text, so ``"endpoint": 5`` reads as "5"; only a
    name that reads as a number or a boolean can be such a value, and only the lines naming one
    are parsed again, into a variant that knows the value's JSON type (parsing every line so
    doubled the endpoints' pass)."""
    from pyspark.sql import functions as F

    doubtful = [name for name in names if _NUMBER_OR_BOOLEAN.fullmatch(name)]
    if not doubtful:
        return names
    given = F.schema_of_variant(F.variant_get(F.try_parse_json(F.col("value")), "$.endpoint", "variant"))
    texts = lines.where(named.isin(doubtful) & (given == "STRING")).select(named).distinct().collect()
    return names - set(doubtful) | {str(r[0]) for r in texts}


def _checked_files(spark: Any, path: str, fmt: str, endpoint: str | None) -> Any:
    from pyspark.sql import functions as F

    if fmt == "parquet":
        return checked_frame(spark.read.parquet(path), endpoint)
    if fmt != "jsonl":
        raise ConfigurationError(f"Unknown file format {fmt!r}; use parquet or jsonl.")

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        lines = (line for b in batches for line in b.column("value").to_pylist())
        return arrow_chunks(check_json(_json_line(line), endpoint) for line in lines)

    # Bytes, not text: Spark's reader passes a line that is not UTF-8 through as it is, and
    # Arrow's text column would fail the whole task on it; here it is that line's reason.
    return (
        spark.read.text(path)
        .select(F.col("value").cast("binary").alias("value"))
        .mapInArrow(run, RECORD_SCHEMA)
    )


def checked_frame(df: Any, endpoint: str | None) -> Any:
    """A record frame from any DataFrame with the accepted columns: the rows Arrow can vouch
    for as they are (:func:`split_plainly_fine`), the rest checked in Python."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            fine, rest = split_plainly_fine(batch, endpoint, _endpoint_fine)
            if fine is not None:
                yield plainly_fine_batch(fine)
            if rest.num_rows:
                yield from arrow_chunks(checked_rows(python_rows(rest), endpoint))

    return normalize(df).mapInArrow(run, RECORD_SCHEMA)


def python_rows(batch: Any) -> list[dict[str, Any]]:
    """An Arrow batch's rows as dicts for :func:`check_row`.

    Parquet does not check that a string column holds UTF-8, and Arrow decoding such a value
    failed the whole task (a stack trace, the import stopped). A column like that is read as
    bytes instead, each value that is UTF-8 as its text: a value that is not is then its row's
    reason ("message id is not UTF-8 text."), by the rule for binary columns."""
    try:
        return list(batch.to_pylist())
    except UnicodeDecodeError:
        columns = [_text_or_bytes(column) for column in batch.columns]
        return [dict(zip(batch.schema.names, values, strict=True)) for values in zip(*columns, strict=True)]


def _text_or_bytes(column: Any) -> list[Any]:
    import pyarrow as pa

    try:
        return list(column.to_pylist())
    except UnicodeDecodeError:
        raw = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
        return [_decoded(value) for value in raw.to_pylist()]


def _decoded(value: bytes | None) -> str | bytes | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value


def _endpoint_fine(name: str) -> bool:
    return _endpoint_problem(name) is None


def plainly_fine_batch(columns: Sequence[Any]) -> Any:
    """A record frame's batch of records no check found a problem with, from their columns in
    :class:`Record`'s order and their groups (their problem column is null)."""
    import pyarrow as pa

    types = _arrow_types()
    count = len(columns[0])
    arrays = [column.cast(kind) for column, kind in zip(columns, types, strict=False)]
    arrays += [pa.nulls(count, kind) for kind in types[len(columns) :]]
    return pa.RecordBatch.from_arrays(arrays, names=_NAMES)
