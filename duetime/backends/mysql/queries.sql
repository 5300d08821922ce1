-- MariaDB / MySQL queries. {table} is the backquoted table; times are BIGINT microseconds, UTC.

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS duetime_schema (
    component VARCHAR(250) NOT NULL PRIMARY KEY,
    version INT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- name: create_store_table
CREATE TABLE IF NOT EXISTS {table} (
    message_id VARCHAR(250) NOT NULL PRIMARY KEY,
    destination VARCHAR(200) NOT NULL,
    due_at BIGINT NOT NULL,
    headers LONGTEXT NOT NULL,
    body LONGBLOB NOT NULL,
    failure_count INT NOT NULL DEFAULT 0,
    claim_token CHAR(32) NULL,
    claimed_until BIGINT NULL,
    group_key VARCHAR(200) NULL,
    KEY duetime_due (due_at, message_id),
    KEY duetime_claim (claim_token, claimed_until),
    KEY duetime_destination (destination, due_at),
    KEY duetime_group (group_key),
    KEY duetime_failing (failure_count)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- The columns of a table of the store's name: one that lacks duetime's is another program's.
-- name: table_columns
SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s;

-- Schema version 2: a table of version 1 gets the group key on `duetime setup`.
-- name: has_group_column
SELECT COUNT(*) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'group_key';

-- Counting what failed reads this key, not every row: added to an older table in place, while
-- it is written (InnoDB builds it online).
-- name: has_failing_key
SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME = 'duetime_failing';

-- name: add_failing_key
ALTER TABLE {table} ADD KEY duetime_failing (failure_count), ALGORITHM=INPLACE, LOCK=NONE;

-- A column added last changes only the table's definition (no rows are rewritten); the key is
-- built while the table is written.
-- name: add_group_column
ALTER TABLE {table} ADD COLUMN group_key VARCHAR(200) NULL, ALGORITHM=INSTANT;

-- name: has_group_key
SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME = 'duetime_group';

-- name: add_group_key
ALTER TABLE {table} ADD KEY duetime_group (group_key), ALGORITHM=INPLACE, LOCK=NONE;

-- How long a set-up's change waits for the table's lock (seconds): a change queued behind a
-- long transaction holds up every writer that comes after it, so it gives way and tries again.
-- name: brief_lock_waits
SET SESSION lock_wait_timeout = 1;

-- name: usual_lock_waits
SET SESSION lock_wait_timeout = DEFAULT;

-- name: delete_group_unclaimed
DELETE FROM {table} WHERE group_key = %s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %s) LIMIT %s;

-- name: setup_lock
SELECT GET_LOCK('duetime_setup', 60);

-- name: setup_unlock
SELECT RELEASE_LOCK('duetime_setup');

-- name: record_version
INSERT INTO duetime_schema (component, version) VALUES (%s, %s)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version));

-- name: read_version
SELECT version FROM duetime_schema WHERE component = %s;

-- name: insert
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
VALUES (%s, %s, %s, %s, %s, %s, %s);

-- A tick of a recurring schedule, stored unless its id is there (duetime.backends._schedules).
-- name: insert_new
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
VALUES (%s, %s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE message_id = message_id;

-- The index is forced: when most rows are due (a backlog, a fresh table) the optimizer would
-- rather scan the table and sort, and FOR UPDATE then locks every due row, not the LIMIT's
-- few, so every other claimer skips them all and finds nothing: dispatchers take turns.
-- name: select_due_for_claim
SELECT message_id, destination, due_at, headers, body, failure_count, group_key
FROM {table} FORCE INDEX (duetime_due)
WHERE due_at <= %s AND (claim_token IS NULL OR claimed_until <= %s)
ORDER BY due_at, message_id
LIMIT %s
FOR UPDATE SKIP LOCKED;

-- The earliest unclaimed due time and the earliest claim's end, in one round trip: asked alone,
-- or at the end of a claim's own transaction (its rows claimed already, so left out as unclaimed).
-- name: next_times
SELECT (SELECT due_at FROM {table} WHERE claim_token IS NULL ORDER BY due_at, message_id LIMIT 1),
       (SELECT MIN(claimed_until) FROM {table} WHERE claim_token IS NOT NULL);

-- name: delete
DELETE FROM {table} WHERE message_id = %s;

-- name: increment_failure
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL WHERE message_id = %s;

-- name: increment_failure_until
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL, due_at = %s
WHERE message_id = %s;

-- name: release
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE message_id IN %s;

-- name: get
SELECT message_id, destination, due_at, headers, body, failure_count, group_key FROM {table}
WHERE message_id = %s;

-- name: delete_unclaimed
DELETE FROM {table} WHERE message_id = %s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %s);

-- A change of a message no claim holds locks its row first, then changes it by id: an UPDATE's
-- count is of rows it changed (CLIENT.FOUND_ROWS is off), so a change to what is there already
-- (a reschedule to the same time, a replace with the same content) would count 0 and read as
-- "in flight".
-- name: lock_unclaimed
SELECT 1 FROM {table} WHERE message_id = %s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %s) FOR UPDATE;

-- name: reschedule
UPDATE {table} SET due_at = %s, claim_token = NULL, claimed_until = NULL WHERE message_id = %s;

-- A waiting message's content in place (duetime.interfaces.IfExists), never under a claim, even
-- one that lapsed: its dispatcher may still be sending, and would remove the new content.
-- name: lock_unheld
SELECT 1 FROM {table} WHERE message_id = %s AND (claim_token IS NULL OR claim_token = {held}) FOR UPDATE;

-- name: replace
UPDATE {table} SET destination = %s, due_at = %s, headers = %s, body = %s, failure_count = %s,
    group_key = %s
WHERE message_id = %s;

-- name: estimate_rows
SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s;

-- name: count_group
SELECT COUNT(*) FROM {table} WHERE group_key = %s;

-- name: count_total
SELECT COUNT(*) FROM {table};

-- The server's own time: due times and claims are compared with it, not the host's clock.
-- name: server_time
SELECT UTC_TIMESTAMP(6);

-- name: count_due
SELECT COUNT(*) FROM {table} WHERE due_at <= %s;

-- name: count_claimed
SELECT COUNT(*) FROM {table} WHERE claim_token IS NOT NULL AND claim_token <> {held} AND claimed_until > %s;

-- name: count_held
SELECT COUNT(*) FROM {table} WHERE claim_token = {held} AND claimed_until > %s;

-- name: count_failing
SELECT COUNT(*) FROM {table} WHERE failure_count > 0;

-- name: count_by_destination
SELECT destination, COUNT(*) FROM {table} GROUP BY destination ORDER BY COUNT(*) DESC LIMIT 1000;

-- Asked only when count_by_destination came back full: how many destinations there are.
-- name: count_destinations
SELECT COUNT(DISTINCT destination) FROM {table};

-- name: mark_claimed
UPDATE {table} SET claim_token = %s, claimed_until = %s WHERE message_id IN %s;

-- name: delete_many
DELETE FROM {table} WHERE message_id IN %s;

-- name: stored_ids
SELECT message_id FROM {table} WHERE message_id IN %s;

-- Live dispatchers (duetime.live_dispatchers): one row per dispatcher, refreshed every few seconds.
-- name: create_presence_table
CREATE TABLE IF NOT EXISTS duetime_dispatchers (
    endpoint VARCHAR(200) NOT NULL,
    dispatcher_id VARCHAR(250) NOT NULL,
    seen_at BIGINT NOT NULL,
    info LONGTEXT NOT NULL,
    PRIMARY KEY (endpoint, dispatcher_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- name: beat
INSERT INTO duetime_dispatchers (endpoint, dispatcher_id, seen_at, info) VALUES (%s, %s, %s, %s)
ON DUPLICATE KEY UPDATE seen_at = VALUES(seen_at), info = VALUES(info);

-- name: presences
SELECT info FROM duetime_dispatchers WHERE endpoint = %s;

-- name: forget
DELETE FROM duetime_dispatchers WHERE endpoint = %s AND seen_at < %s;

-- API keys (duetime.api_keys): one row per name, the secret's hash and never the secret.
-- name: create_api_key_table
CREATE TABLE IF NOT EXISTS duetime_api_keys (
    endpoint VARCHAR(200) NOT NULL,
    name VARCHAR(64) NOT NULL,
    info LONGTEXT NOT NULL,
    PRIMARY KEY (endpoint, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- name: key_insert
INSERT IGNORE INTO duetime_api_keys (endpoint, name, info) VALUES (%s, %s, %s);

-- name: key_update
UPDATE duetime_api_keys SET info = %s WHERE endpoint = %s AND name = %s;

-- name: key_records
SELECT info FROM duetime_api_keys WHERE endpoint = %s ORDER BY name;

-- Named records (webhook endpoints, duetime.webhooks): one row per endpoint, kind and name.
-- name: create_record_table
CREATE TABLE IF NOT EXISTS duetime_records (
    endpoint VARCHAR(200) NOT NULL,
    kind VARCHAR(32) NOT NULL,
    name VARCHAR(100) NOT NULL,
    info LONGTEXT NOT NULL,
    PRIMARY KEY (endpoint, kind, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- name: record_insert
INSERT IGNORE INTO duetime_records (endpoint, kind, name, info) VALUES (%s, %s, %s, %s);

-- name: record_update
UPDATE duetime_records SET info = %s WHERE endpoint = %s AND kind = %s AND name = %s;

-- name: record_delete
DELETE FROM duetime_records WHERE endpoint = %s AND kind = %s AND name = %s;

-- name: records
SELECT info FROM duetime_records WHERE endpoint = %s AND kind = %s ORDER BY name;

-- The audit trail (duetime.audit): a range of its entries' names (time, then id), from the
-- primary key's index (the names hold digits, T, Z, '.', '-' and hex: every collation sorts
-- them as bytes do); its old entries forgotten in one statement.
-- name: audit_newest
SELECT info FROM duetime_records WHERE endpoint = %s AND kind = 'audit' AND name > %s AND name < %s
ORDER BY name DESC LIMIT %s;

-- name: audit_oldest
SELECT info FROM duetime_records WHERE endpoint = %s AND kind = 'audit' AND name > %s AND name < %s
ORDER BY name LIMIT %s;

-- name: audit_prune
DELETE FROM duetime_records WHERE endpoint = %s AND kind = 'audit' AND name < %s;

-- A compare-and-set (flow control's shared state, duetime.limits), byte for byte.
-- name: record_swap
UPDATE duetime_records SET info = %s
WHERE endpoint = %s AND kind = %s AND name = %s AND info COLLATE utf8mb4_bin = %s;

-- name: record_get
SELECT info FROM duetime_records WHERE endpoint = %s AND kind = %s AND name = %s;

-- A message a flow-control limit holds back: no claim's, hidden from claims until claimed_until.
-- name: hold
UPDATE {table} SET claim_token = {held}, claimed_until = %s WHERE message_id = %s;

-- Every held message claimable again (a limit changed, a destination resumed).
-- name: release_held
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE claim_token = {held};

-- Rotation (duetime keys rotate): a message's content as it is, locked, if no dispatcher holds
-- it (skipped, not waited for), and its content sealed again with the primary key.
-- name: reseal_look
SELECT message_id, headers, body FROM {table}
WHERE message_id IN %s AND (claim_token IS NULL OR claim_token = {held})
FOR UPDATE SKIP LOCKED;

-- name: reseal
UPDATE {table} SET headers = %s, body = %s WHERE message_id = %s;

-- Recurring schedules (duetime.backends._schedules): a row per schedule, compare-and-set on version.
-- name: create_schedule_table
CREATE TABLE IF NOT EXISTS duetime_schedules (
    endpoint VARCHAR(200) NOT NULL,
    schedule_id VARCHAR(200) NOT NULL,
    definition LONGTEXT NOT NULL,
    planned_until BIGINT NULL,
    version BIGINT NOT NULL,
    PRIMARY KEY (endpoint, schedule_id),
    KEY duetime_schedules_plan (endpoint, planned_until)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation};

-- name: schedule_insert
INSERT INTO duetime_schedules (endpoint, schedule_id, definition, planned_until, version)
VALUES (%s, %s, %s, %s, 0) ON DUPLICATE KEY UPDATE version = version;

-- name: schedule_update
UPDATE duetime_schedules SET definition = %s, planned_until = %s, version = version + 1
WHERE endpoint = %s AND schedule_id = %s AND version = %s;

-- name: schedule_get
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules
WHERE endpoint = %s AND schedule_id = %s;

-- name: schedule_page
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules
WHERE endpoint = %s AND schedule_id > %s ORDER BY schedule_id LIMIT %s;

-- name: schedules_to_plan
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules
WHERE endpoint = %s AND planned_until IS NOT NULL AND planned_until <= %s ORDER BY planned_until LIMIT %s;

-- name: schedule_delete
DELETE FROM duetime_schedules WHERE endpoint = %s AND schedule_id = %s;

-- Whole batches of store rows (duetime.backends.mysql.bulk_rows), in the caller's transaction;
-- {{values}} (doubled: filled in after {table}) is one "(%s, %s, %s, %s, %s, %s, %s)" per row.
-- name: bulk_insert_ignoring
INSERT IGNORE INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
VALUES {{values}} RETURNING message_id

-- Taking rows out of a table a bulk job migrates (a store's, or another layout's) and putting
-- them back when the job aborts (duetime.backends.mysql.bulk_rows.source_rows): {{key}} is
-- the key column, {{columns}} a row's columns, {{marks}} a %s for each of them or of the keys.
-- name: bulk_take_keys
DELETE FROM {table} WHERE {{key}} IN ({{marks}})

-- name: bulk_put_back
INSERT INTO {table} ({{columns}}) VALUES ({{marks}})
