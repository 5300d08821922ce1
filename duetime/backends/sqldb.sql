-- Statements run through duetime.backends.sqldb.Database: the bulk jobs' state tables, the delivery log and
-- the NServiceBus source layouts. `Database.query(name)` fills in:
--   {runs} {batches} {staged} {ledger} {scheduled} {log}  the state tables, quoted and schema-qualified;
--   {key16} {key64} {key200} {key250} {text} {blob}      the dialect's column types;
--   {lock}                                               " FOR UPDATE", or nothing on SQLite;
--   anything else (a {table}, {marks} for an IN list)     from the caller.
-- A name with a dialect suffix (`name.postgres`, `name.mysql`, `name.sqlite`) wins over the plain
-- name for that dialect. Parameters are %s (sqlite3's ? is put in by Database.execute).

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: schema_exists.postgres
SELECT 1 FROM pg_namespace WHERE nspname=%s

-- name: table_exists.sqlite
SELECT 1 FROM sqlite_master WHERE type='table' AND name=%s

-- name: table_exists.postgres
SELECT 1 FROM information_schema.tables WHERE table_schema=%s AND table_name=%s

-- name: table_exists.mysql
SELECT 1 FROM information_schema.tables WHERE table_schema=DATABASE() AND table_name=%s

-- name: server_identity.postgres
SELECT system_identifier::text, current_database() FROM pg_control_system()

-- name: server_identity.mysql
SELECT @@hostname, @@port, @@datadir, DATABASE()

-- name: tables.sqlite
SELECT name FROM sqlite_master WHERE type='table'

-- name: tables.postgres
SELECT table_name FROM information_schema.tables WHERE table_schema=%s

-- name: tables.mysql
SELECT table_name FROM information_schema.tables WHERE table_schema=DATABASE()

-- ---------------------------------------------------------------------------------------------
-- The migration's runs and batches (in the source database) and the staged rows of each batch.

-- name: create_runs
CREATE TABLE IF NOT EXISTS {runs} (
    run_id {key64} PRIMARY KEY,
    job {key64} NOT NULL,
    generation INTEGER NOT NULL,
    status {key16} NOT NULL,
    spec {text} NOT NULL
)

-- name: create_batches
CREATE TABLE IF NOT EXISTS {batches} (
    run_id {key64} NOT NULL,
    batch INTEGER NOT NULL,
    endpoint {key200} NOT NULL,
    source_table {key250} NOT NULL,
    lower_key {key250},
    upper_key {key250},
    status {key16} NOT NULL,
    planned BIGINT NOT NULL,
    staged BIGINT,
    inserted BIGINT,
    put_back BIGINT,
    note {text},
    PRIMARY KEY (run_id, batch)
)

-- name: create_staged
CREATE TABLE IF NOT EXISTS {staged} (
    run_id {key64} NOT NULL,
    batch INTEGER NOT NULL,
    endpoint {key200} NOT NULL,
    message_id {key250} NOT NULL,
    destination {text},
    due_us BIGINT,
    headers {text},
    body {blob} NOT NULL,
    failure_count INTEGER NOT NULL,
    extra {text}
)

-- name: create_staged_index
CREATE INDEX duetime_bulk_staged_batch ON {staged} (run_id, batch)

-- name: staged_index_exists.postgres
SELECT 1 FROM pg_indexes WHERE schemaname=%s AND indexname='duetime_bulk_staged_batch'

-- name: staged_index_exists.mysql
SELECT 1 FROM information_schema.statistics
WHERE table_schema=DATABASE() AND table_name='duetime_bulk_staged' AND index_name='duetime_bulk_staged_batch'

-- name: staged_index_exists.sqlite
SELECT 1 FROM sqlite_master WHERE type='index' AND name='duetime_bulk_staged_batch'

-- name: latest_run
SELECT run_id, generation, status FROM {runs} WHERE job=%s ORDER BY generation DESC LIMIT 1

-- name: insert_run
INSERT INTO {runs} (run_id, job, generation, status, spec) VALUES (%s, %s, %s, 'running', %s)

-- name: set_run_status
UPDATE {runs} SET status=%s WHERE run_id=%s

-- name: insert_batch
INSERT INTO {batches} (run_id, batch, endpoint, source_table, lower_key, upper_key, status, planned)
VALUES (%s, %s, %s, %s, %s, %s, 'pending', %s)

-- name: batch_status
SELECT status FROM {batches} WHERE run_id=%s AND batch=%s{lock}

-- name: set_batch_staged
UPDATE {batches} SET status='staged', staged=%s WHERE run_id=%s AND batch=%s

-- name: set_batch_completed
UPDATE {batches} SET status='completed', inserted=%s, put_back=%s, note=%s WHERE run_id=%s AND batch=%s

-- name: set_batch_moved
UPDATE {batches} SET status='completed', staged=%s, inserted=%s, put_back=%s, note=%s WHERE run_id=%s AND batch=%s

-- name: set_batch_aborted
UPDATE {batches} SET status='aborted', put_back=%s WHERE run_id=%s AND batch=%s

-- name: batches_of_run
SELECT batch, endpoint, source_table, lower_key, upper_key, status, planned, staged, inserted, put_back, note
FROM {batches} WHERE run_id=%s ORDER BY batch

-- The rows of a run's batches in the given states ({marks}: one %s per state).
-- name: rows_in_states
SELECT COALESCE(SUM(planned), 0) FROM {batches} WHERE run_id=%s AND status IN ({marks})

-- PostgreSQL: a batch's rows in one statement from the source table into the staging table;
-- {taken} deletes them there and returns them as c0..c6 (duetime.backends.postgres.bulk_rows).
-- name: stage_taken.postgres
WITH moved AS ({taken})
INSERT INTO {staged} (run_id, batch, endpoint, message_id, destination, due_us, headers, body, failure_count, extra)
SELECT %s, %s, %s, c0, c1, c2, c3, c4, c5, c6 FROM moved

-- name: copy_staged.postgres
COPY {staged} (run_id, batch, endpoint, message_id, destination, due_us, headers, body, failure_count, extra)
FROM STDIN

-- name: insert_staged
INSERT INTO {staged} (run_id, batch, endpoint, message_id, destination, due_us, headers, body, failure_count, extra)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: staged_rows
SELECT endpoint, message_id, destination, due_us, headers, body, failure_count, extra
FROM {staged} WHERE run_id=%s AND batch=%s

-- name: staged_count
SELECT COUNT(*) FROM {staged} WHERE run_id=%s AND batch=%s

-- name: staged_rows_without_bodies
SELECT endpoint, message_id, destination, due_us, headers, NULL, failure_count, extra
FROM {staged} WHERE run_id=%s AND batch=%s

-- PostgreSQL: the staged rows {fine} cannot vouch for (usually none), to be checked in Python.
-- name: staged_rows_to_check.postgres
SELECT endpoint, message_id, destination, due_us, headers, NULL, failure_count, extra
FROM {staged} WHERE run_id=%s AND batch=%s AND NOT {fine}

-- How many rows each endpoint's table gets from a batch (those not left out), the earliest due.
-- name: staged_per_endpoint
SELECT endpoint, COUNT(*), MIN(due_us) FROM {staged}
WHERE run_id=%s AND batch=%s AND NOT (message_id = ANY(%s)) GROUP BY endpoint

-- name: delete_staged
DELETE FROM {staged} WHERE run_id=%s AND batch=%s

-- ---------------------------------------------------------------------------------------------
-- The target's ledger: one row per batch written, committed with the batch's messages.

-- name: create_ledger
CREATE TABLE IF NOT EXISTS {ledger} (
    run_id {key64} NOT NULL,
    batch INTEGER NOT NULL,
    inserted BIGINT NOT NULL,
    conflicts {text} NOT NULL,
    PRIMARY KEY (run_id, batch)
)

-- name: ledger_row
SELECT inserted, conflicts FROM {ledger} WHERE run_id=%s AND batch=%s

-- name: lock_ledger_row
SELECT 1 FROM {ledger} WHERE run_id=%s AND batch=%s FOR UPDATE

-- name: insert_ledger_row
INSERT INTO {ledger} (run_id, batch, inserted, conflicts) VALUES (%s, %s, %s, %s)

-- name: forget_run
DELETE FROM {ledger} WHERE run_id=%s

-- name: is_duetime_store
SELECT message_id, claim_token FROM {table} WHERE 1=0

-- An endpoint's staged rows of a batch as a store keeps them, but for the ids given (their problems),
-- for the store's bulk writer (duetime.backends.postgres.bulk_rows) in the same database. Only for
-- rows whose headers a store keeps as they are (records.store_ready); the group is duetime's own or
-- an NServiceBus SagaId (not the empty GUID), as records.group_of says.
-- name: staged_store_rows.postgres
SELECT message_id, destination, due_us, coalesce(headers, '{{}}'), body, failure_count, {group_of_extra}
FROM {staged} WHERE run_id=%s AND batch=%s AND endpoint=%s AND NOT (message_id = ANY(%s))

-- The same rows as staged_store_rows, for a store in another PostgreSQL database: one server's
-- COPY feeds the other's, in binary, so the types are exactly the store table's columns.
-- name: copy_staged_out.postgres
COPY (
    SELECT message_id::text, destination::text, {due_us_as_timestamptz}, coalesce(headers, '{{}}')::text, body, failure_count::int4,
           ({group_of_extra})::text
    FROM {staged} WHERE run_id=%s AND batch=%s AND endpoint=%s AND NOT (message_id = ANY(%s))
) TO STDOUT (FORMAT BINARY)

-- ---------------------------------------------------------------------------------------------
-- `bulk schedule`: the ids each job has stored, so a rerun stores none twice.

-- name: create_scheduled
CREATE TABLE IF NOT EXISTS {scheduled} (
    job {key64} NOT NULL,
    message_id {key250} NOT NULL,
    PRIMARY KEY (job, message_id)
)

-- name: claim_ids.postgres
INSERT INTO {scheduled} (job, message_id) SELECT %s, unnest(%s::text[]) ON CONFLICT DO NOTHING RETURNING message_id

-- {values} is one "(%s, %s)" per id.
-- name: claim_ids.mysql
INSERT IGNORE INTO {scheduled} (job, message_id) VALUES {values} RETURNING message_id

-- name: scheduled_ids
SELECT message_id FROM {scheduled} WHERE job=%s AND message_id IN ({marks})

-- name: insert_scheduled_id
INSERT INTO {scheduled} (job, message_id) VALUES (%s, %s)

-- The ids a job found waiting and replaces after this commit: its own again once replaced.
-- name: release_scheduled_ids
DELETE FROM {scheduled} WHERE job=%s AND message_id IN ({marks})

-- ---------------------------------------------------------------------------------------------
-- The delivery log (`duetime run --delivery-log URL`) and the report that reads it.

-- name: create_log
CREATE TABLE IF NOT EXISTS {log} (
    message_id {key250} NOT NULL,
    destination {key200} NOT NULL,
    due_us BIGINT NOT NULL,
    dispatched_us BIGINT NOT NULL,
    attempts INTEGER NOT NULL,
    outcome {key16} NOT NULL
)

-- name: insert_log
INSERT INTO {log} (message_id, destination, due_us, dispatched_us, attempts, outcome) VALUES (%s, %s, %s, %s, %s, %s)

-- The report reads the log in one scan (the table has no key to split it by without rescanning).
-- name: log_rows
SELECT due_us, dispatched_us, outcome FROM {log}

-- ---------------------------------------------------------------------------------------------
-- The NServiceBus tables the migration reads (created by tests and demos as NServiceBus would).

-- name: store_components
SELECT component FROM {table} WHERE component LIKE 'store:%%'

-- name: create_timeoutdata.postgres
CREATE TABLE IF NOT EXISTS {table} (
    "Id" uuid PRIMARY KEY, "Destination" varchar(200), "SagaId" uuid, "State" bytea, "Time" timestamp,
    "Headers" text, "PersistenceVersion" varchar(23) NOT NULL
)

-- name: create_timeoutdata.mysql
CREATE TABLE IF NOT EXISTS {table} (
    Id VARCHAR(36) PRIMARY KEY, Destination VARCHAR(200), SagaId VARCHAR(36), State LONGBLOB, Time DATETIME(6),
    Headers LONGTEXT, PersistenceVersion VARCHAR(23) NOT NULL
) DEFAULT CHARSET=utf8mb4

-- name: create_timeoutdata.sqlite
CREATE TABLE IF NOT EXISTS {table} (
    Id TEXT PRIMARY KEY, Destination TEXT, SagaId TEXT, State BLOB, Time TEXT, Headers TEXT,
    PersistenceVersion TEXT NOT NULL
)

-- name: create_msmq.postgres
CREATE TABLE IF NOT EXISTS {table} (
    "Id" varchar(250) PRIMARY KEY, "Destination" varchar(200), "State" bytea, "Time" timestamp,
    "Headers" bytea, "RetryCount" integer NOT NULL DEFAULT 0
)

-- name: create_msmq.mysql
CREATE TABLE IF NOT EXISTS {table} (
    Id VARCHAR(250) PRIMARY KEY, Destination VARCHAR(200), State LONGBLOB, Time DATETIME(6), Headers LONGBLOB,
    RetryCount INT NOT NULL DEFAULT 0
) DEFAULT CHARSET=utf8mb4

-- name: create_msmq.sqlite
CREATE TABLE IF NOT EXISTS {table} (
    Id TEXT PRIMARY KEY, Destination TEXT, State BLOB, Time TEXT, Headers BLOB, RetryCount INTEGER NOT NULL DEFAULT 0
)
