"""Migrating NServiceBus's own timeout storage, written as NServiceBus writes it (from
NServiceBus's published source and documentation): TimeoutData tables as NServiceBus.Persistence.Sql's
create scripts make them, with rows as its persister writes them, the MSMQ transport's delayed
store, and the timeout migration tool's rules."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiormq
import pytest

from duetime import TransactionMode
from duetime.bulk.migrate import MigrationSpec, migrate
from duetime.bulk.preview import preview
from duetime.bulk.records import to_header_infos
from duetime.bulk_interfaces import SqlDatabase
from duetime.errors import ConfigurationError
from duetime.nservicebus_wire import EMPTY_GUID, to_wire
from duetime.registry import open_sql_database, open_sync_store
from tests.bulk.conftest import count
from tests.bulk.test_migrate import store_rows
from tests.services import RABBITMQ, mariadb_database, postgres_schema, require

ENDPOINT = "Shipping.Policy"
PREFIX = "Shipping_Policy_"  # P3: the endpoint name with '.' replaced by '_', plus '_'
TABLE = f"{PREFIX}TimeoutData"


def create_timeoutdata_as_nservicebus(db: SqlDatabase) -> None:
    """The table and indexes of Persistence.Sql's Create_PostgreSql.sql / Create_MySql.sql (P1, P2)."""
    with db.session() as conn:
        db.ensure_schema(conn)
        if db.dialect == "postgres":
            db.execute(
                conn,
                f'create table if not exists {db.qualified(TABLE)} ("Id" uuid not null, '
                '"Destination" character varying(200), "SagaId" uuid, "State" bytea, "Time" timestamp, '
                '"Headers" text, "PersistenceVersion" character varying(23), primary key ("Id"))',
            )
            for suffix, column in (("TimeIdx", "Time"), ("SagaIdx", "SagaId")):
                db.execute(
                    conn,
                    f'create index if not exists "{TABLE}_{suffix}" on {db.qualified(TABLE)} '
                    f'using btree ("{column}" asc nulls last)',
                )
        else:
            db.execute(
                conn,
                f"create table if not exists `{TABLE}` (Id varchar(38) not null, Destination nvarchar(200), "
                "SagaId varchar(38), State longblob, Time datetime, Headers json not null, "
                "PersistenceVersion varchar(23) not null, primary key (Id), index Index_SagaId (SagaId), "
                "index Index_Time (Time)) default charset=ascii",
            )


def persister_row(
    message_id: str,
    due: datetime,
    *,
    destination: str = "Shipping.Orders",
    saga: str = EMPTY_GUID,
    **extra: Any,
) -> tuple[Any, ...]:
    """A row as TimeoutPersister.Add writes it (P4): a GUID id, the body as State, the UTC time
    without a zone, Newtonsoft's indented JSON headers (null values written), the persistence version."""
    headers = {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.ReplyToAddress": ENDPOINT,
        "NServiceBus.EnclosedMessageTypes": "Shipping.PolicyTimeout, Shipping",
        "NServiceBus.Timeout.Expire": to_wire(due),
        "NServiceBus.Timeout.RouteExpiredTimeoutTo": destination,
        **extra,
    }
    return (
        str(uuid.uuid4()),
        destination,
        saga,
        b'{"policy": 1}',
        due.replace(tzinfo=None),
        json.dumps(headers, indent=2),
        "6.6.5.0",
    )


@pytest.fixture(params=["postgres", "mariadb"])
def legacy(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(source URL with the TimeoutData layout, a duetime store URL) in one real database."""
    with postgres_schema() if request.param == "postgres" else mariadb_database() as url:
        yield url + ("&" if "?" in url else "?") + "layout=timeoutdata", url


def insert(db: SqlDatabase, rows: list[tuple[Any, ...]]) -> None:
    with db.session() as conn:
        db.executemany(conn, f"INSERT INTO {db.qualified(TABLE)} VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)


def test_timeoutdata_migrates_as_the_migration_tool_would(spark: Any, legacy: tuple[str, str]) -> None:
    source, store = legacy
    db = open_sql_database(source)
    create_timeoutdata_as_nservicebus(db)
    cutoff = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)  # MySQL datetime: whole seconds
    saga = str(uuid.uuid4())
    rows = {
        "at-cutoff": persister_row("at-cutoff", cutoff, saga=saga),
        "before": persister_row("before", cutoff - timedelta(seconds=1)),
        "null-header": persister_row(
            "null-header", cutoff + timedelta(hours=1), **{"NServiceBus.OriginatingSagaType": None}
        ),
        "no-saga": persister_row("no-saga", cutoff + timedelta(hours=2)),
        "soon": persister_row("soon", datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)),
    }
    insert(db, list(rows.values()))
    # Preview: where each table goes, and what to know first
    found = preview(spark, source, cutoff=None)
    assert found.tables == [(TABLE, "Shipping_Policy")]
    assert any("--rename Shipping_Policy=Shipping.Policy" in w for w in found.warnings)
    assert any(w.startswith("1 timeouts of Shipping_Policy are due within 4 hours") for w in found.warnings)
    assert found.problem_total == 0  # the null header is no problem
    renamed = preview(spark, source, cutoff=cutoff, renames={"Shipping_Policy": ENDPOINT})
    assert renamed.tables == [(TABLE, ENDPOINT)] and not renamed.warnings  # nothing due soon after the cutoff
    assert renamed.total == 3
    with pytest.raises(ConfigurationError, match="--rename names \\['Shipping-Policy'\\]"):
        preview(spark, source, renames={"Shipping-Policy": ENDPOINT})
    # Migrate: the cutoff is inclusive, the null header moves, SagaId becomes the group
    spec = MigrationSpec(
        source, store, cutoff=cutoff, batch_rows=100, renames=(("Shipping_Policy", ENDPOINT),)
    )
    result = migrate(spark, spec)
    assert result.inserted == 3 and result.put_back == 0, result.notes
    moved = store_rows(store, ENDPOINT)  # what a dispatcher for the real endpoint sees
    by_nsb_id = {m.headers["NServiceBus.MessageId"]: m for m in moved.values()}
    assert set(by_nsb_id) == {"at-cutoff", "null-header", "no-saga"}
    assert by_nsb_id["at-cutoff"].due_at == cutoff
    assert by_nsb_id["at-cutoff"].message_id == rows["at-cutoff"][0]  # the TimeoutData Id
    assert by_nsb_id["at-cutoff"].group == saga
    assert by_nsb_id["no-saga"].group is None  # Guid.Empty is no saga
    assert "NServiceBus.OriginatingSagaType" not in by_nsb_id["null-header"].headers  # null: not carried
    assert by_nsb_id["null-header"].headers["NServiceBus.Timeout.Expire"] == to_wire(
        cutoff + timedelta(hours=1)
    )
    assert count(db, TABLE) == 2  # before the cutoff, and due soon: still with NServiceBus
    client = open_sync_store(store)
    client.initialize(ENDPOINT, TransactionMode.AT_LEAST_ONCE)
    assert client.cancel_group(saga) == 1  # ClearTimeouts of that saga now finds it
    client.close()


def test_the_msmq_transports_delayed_store_is_read_as_it_writes_it(spark: Any) -> None:
    """M1-M3: ``<endpoint>.timeouts`` by default, Headers the UTF-8 XML list of HeaderInfo (with
    .NET's byte order mark), the dispatch properties beside the headers."""
    with postgres_schema() as url:
        source = url + "&layout=msmq"
        db = open_sql_database(source)
        table = "Billing.timeouts"
        with db.session() as conn:
            db.ensure_schema(conn)
            db.execute(
                conn,
                f'CREATE TABLE {db.qualified(table)} ("Id" varchar(250) NOT NULL PRIMARY KEY, '
                '"Destination" varchar(200), "State" bytea, "Time" timestamp, "Headers" bytea NOT NULL, '
                '"RetryCount" integer NOT NULL DEFAULT 0)',
            )
            db.execute(conn, f'CREATE INDEX "Index_Time" ON {db.qualified(table)} ("Time")')
            due = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
            headers = {
                "NServiceBus.MessageId": "msmq-1",
                "NServiceBus.Timeouts.Properties.NServiceBus.Timeout.Destination": "Billing.Invoices",
                "NServiceBus.Timeouts.Properties.NServiceBus.Timeout.Expire": to_wire(due),
                "CorrId": "msmq-1\\1",
                "Text": "<&> ✓",
            }
            xml = b"\xef\xbb\xbf" + to_header_infos(headers).encode()
            db.execute(
                conn,
                f"INSERT INTO {db.qualified(table)} VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    "c7b3a1f2-0000-0000-0000-000000000001\\1234",
                    "Billing.Invoices",
                    b"body",
                    due.replace(tzinfo=None),
                    xml,
                    2,
                ],
            )
        found = preview(spark, source)
        assert found.tables == [(table, "Billing")] and found.problem_total == 0
        result = migrate(spark, MigrationSpec(source, url, batch_rows=100))
        assert result.inserted == 1
        [moved] = store_rows(url, "Billing").values()
        assert moved.message_id == "c7b3a1f2-0000-0000-0000-000000000001\\1234"  # M3: the MSMQ message id
        assert moved.destination == "Billing.Invoices" and moved.due_at == due and moved.failure_count == 2
        assert moved.headers == {"NServiceBus.MessageId": "msmq-1", "CorrId": "msmq-1\\1", "Text": "<&> ✓"}


def test_the_native_target_refuses_before_anything_moves_and_sends_what_nservicebus_sends(
    spark: Any, tmp_path: Path
) -> None:
    """T4: a destination without a queue, or a delay past the levels, stops the whole run in
    preview and before anything moves; what moves carries NServiceBus's message-id and properties."""
    require(RABBITMQ)
    with postgres_schema() as url:
        source = url + "&layout=timeoutdata"
        db = open_sql_database(source)
        create_timeoutdata_as_nservicebus(db)
        dest = f"Shipping.Orders-{uuid.uuid4().hex[:6]}"
        now = datetime.now(UTC)
        insert(db, [persister_row("ok", now + timedelta(seconds=3), destination=dest)])
        target = f"{RABBITMQ}?native=nsb-v2&ledger={tmp_path / 'ledger.db'}"
        asyncio.run(_declare(None))  # the topology as NServiceBus declares it
        found = preview(spark, source, target_url=target)
        assert len(found.target_problems) == 1 and f"{dest!r} has no queue" in found.target_problems[0]
        with pytest.raises(ConfigurationError, match=r"nothing was moved.*has no queue"):
            migrate(spark, MigrationSpec(source, target))
        assert count(db, TABLE) == 1
        asyncio.run(_declare(dest))
        insert(db, [persister_row("far", now + timedelta(days=365 * 9), destination=dest)])
        found = preview(spark, source, target_url=target)
        assert (
            len(found.target_problems) == 1
            and "longer than the native delays hold" in found.target_problems[0]
        )
        with pytest.raises(ConfigurationError, match="nothing was moved"):
            migrate(spark, MigrationSpec(source, target))
        assert count(db, TABLE) == 2
        with db.session() as conn:
            db.execute(
                conn,
                f'DELETE FROM {db.qualified(TABLE)} WHERE "Destination" = %s AND "Time" > %s',
                [dest, (now + timedelta(days=1)).replace(tzinfo=None)],
            )
        assert migrate(spark, MigrationSpec(source, target)).inserted == 1
        got = asyncio.run(_get(dest))
        assert got is not None
        props = got.header.properties
        assert props.message_id == "ok" and props.correlation_id == "ok"  # NServiceBus.MessageId (T4, R3)
        assert props.message_type == "Shipping.PolicyTimeout" and props.reply_to == ENDPOINT
        assert props.content_type == "application/octet-stream" and props.delivery_mode == 2
        assert isinstance(props.headers["NServiceBus.Transport.RabbitMQ.DelayInSeconds"], int)
        # T4: the stored headers untouched, plus DelayInSeconds (which the receiving transport
        # strips): no TimeSent of the migration, no RelatedToTimeoutId (the tool adds neither)
        stored = {
            k: v
            for k, v in json.loads(persister_row("ok", now, destination=dest)[5]).items()
            if v is not None
        }
        # RabbitMQ adds x-death and x-first-death-* as a delay level's queue passes the message
        # on: the broker's, there when the delay had not run out as the message was sent (a
        # migration done in under 3 s), not the migration's.
        arrived = {
            k: (v.decode() if isinstance(v, bytes) else v)
            for k, v in props.headers.items()
            if not k.startswith("x-")
        }
        assert "NServiceBus.RelatedToTimeoutId" not in arrived and "NServiceBus.TimeSent" not in arrived
        assert {k: arrived[k] for k in stored if k != "NServiceBus.Timeout.Expire"} == {
            k: v for k, v in stored.items() if k != "NServiceBus.Timeout.Expire"
        }
        assert set(arrived) - set(stored) == {
            "NServiceBus.Transport.RabbitMQ.DelayInSeconds",
            "duetime-due-at",
        }
        asyncio.run(_delete(dest))


async def _declare(queue: str | None) -> None:
    from duetime.backends.rabbitmq.native import NativeDelays
    from duetime.backends.rabbitmq.transport import RabbitMqTransport

    transport = RabbitMqTransport.from_url(RABBITMQ)
    if queue is None:
        await NativeDelays(transport, "nsb-v2").setup()
    else:
        await transport.declare_address(queue)
    await transport.close()


async def _get(queue: str) -> Any:
    connection = await aiormq.connect(RABBITMQ)
    channel = await connection.channel()
    try:
        for _ in range(100):
            got = await channel.basic_get(queue, no_ack=True)
            if got.body:
                return got
            await asyncio.sleep(0.1)
        return None
    finally:
        await connection.close()


async def _delete(queue: str) -> None:
    connection = await aiormq.connect(RABBITMQ)
    channel = await connection.channel()
    await channel.queue_delete(queue)
    await channel.exchange_delete(queue)
    await connection.close()


def test_without_a_cutoff_timeouts_before_2012_stay_as_the_migration_tool_leaves_them(
    spark: Any, legacy: tuple[str, str]
) -> None:
    """The tool's Program.cs takes ``Time >= 2012-01-01`` when no --cutoffTime is given (T3); the
    endpoint never sends older ones either. duetime moved them all, and delivered 2011's at once."""
    source, store = legacy
    db = open_sql_database(source)
    create_timeoutdata_as_nservicebus(db)
    old = persister_row("from-2011", datetime(2011, 6, 1, tzinfo=UTC))
    new = persister_row("next-week", (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0))
    insert(db, [old, new])
    renames = {"Shipping_Policy": ENDPOINT}
    found = preview(spark, source, renames=renames)
    assert found.total == 1
    assert any(
        w.startswith("1 timeouts are due before 2012-01-01 and stay where they are") for w in found.warnings
    )
    result = migrate(spark, MigrationSpec(source, store, batch_rows=100, renames=tuple(renames.items())))
    assert result.inserted == 1, result.notes
    moved = store_rows(store, ENDPOINT)
    assert [m.headers["NServiceBus.MessageId"] for m in moved.values()] == ["next-week"]
    assert count(db, TABLE) == 1  # 2011's stays with NServiceBus, as the tool leaves it
