-- SQLite queries for the store ({table} is the quoted table name) and the queue transport.
-- Times are integer microseconds since the Unix epoch, UTC.

-- name: create_schema_table
CREATE TABLE IF NOT EXISTS duetime_schema (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);

-- name: create_store_table
CREATE TABLE IF NOT EXISTS {table} (
    message_id TEXT NOT NULL PRIMARY KEY,
    destination TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    failure_count INTEGER NOT NULL DEFAULT 0,
    claim_token TEXT,
    claimed_until INTEGER,
    group_key TEXT
);

-- Schema version 2 (tables of version 1 get the column on `duetime setup`).
-- name: add_group_column
ALTER TABLE {table} ADD COLUMN group_key TEXT;

-- name: store_columns
SELECT name FROM pragma_table_info(:table);

-- name: create_store_group_index
CREATE INDEX IF NOT EXISTS {index_group} ON {table} (group_key) WHERE group_key IS NOT NULL;

-- name: delete_group_unclaimed
DELETE FROM {table} WHERE message_id IN (
    SELECT message_id FROM {table} WHERE group_key = ? AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= ?) LIMIT ?
);

-- name: create_store_due_index
CREATE INDEX IF NOT EXISTS {index_due} ON {table} (due_at, message_id);

-- name: create_store_claim_index
CREATE INDEX IF NOT EXISTS {index_claim} ON {table} (claimed_until) WHERE claim_token IS NOT NULL;

-- name: create_store_destination_index
CREATE INDEX IF NOT EXISTS {index_destination} ON {table} (destination, due_at);

-- Counting what failed reads this, not every row (a million rows of bodies took a second).
-- name: create_store_failing_index
CREATE INDEX IF NOT EXISTS {index_failing} ON {table} (due_at) WHERE failure_count > 0;

-- name: record_version
INSERT INTO duetime_schema (component, version) VALUES (?, ?)
ON CONFLICT (component) DO UPDATE SET version = max(version, excluded.version);

-- name: read_version
SELECT version FROM duetime_schema WHERE component = ?;

-- name: insert
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- A tick of a recurring schedule, stored unless its id is there (duetime.backends._schedules).
-- name: insert_new
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING;

-- name: claim_due
UPDATE {table} SET claim_token = :token, claimed_until = :until
WHERE message_id IN (
    SELECT message_id FROM {table}
    WHERE due_at <= :at AND (claim_token IS NULL OR claimed_until <= :at)
    ORDER BY due_at, message_id
    LIMIT :limit
)
RETURNING message_id, destination, due_at, headers, body, failure_count, group_key;

-- name: select_due_unclaimed
SELECT message_id, destination, due_at, headers, body, failure_count, group_key FROM {table}
WHERE due_at <= :at AND (claim_token IS NULL OR claimed_until <= :at)
ORDER BY due_at, message_id
LIMIT :limit;

-- The exactly-once move into a queue in the same file, done by SQLite without a Python object per
-- message: first the rows' identities (for the outcome) and whether any needs Python (an
-- NServiceBus timeout, headers not stored as a JSON object, a due time before 1970), then, when
-- none does, the same rows copied into the queue with `duetime-due-at` spliced into their headers
-- exactly as message.outgoing_headers_json does, then deleted. In one write transaction the three
-- statements see the same rows. (Braces are doubled: {table} is filled in by str.format.)
-- A move made ahead (:until later than :at) also takes what comes due by :until; each such row
-- becomes visible in its queue at its due time (every receive asks `visible_at <= now`), rounded
-- up to a whole :step (the lateness budget, in microseconds; 0: not rounded).
-- name: move_due_look
SELECT message_id, destination, due_at,
       CASE WHEN instr(headers, '"traceparent"') THEN headers END,
       due_at < 0 OR substr(headers, 1, 1) <> '{{' OR substr(headers, -1, 1) <> '}}'
           OR instr(headers, '"NServiceBus.Timeout.Expire"') > 0
FROM {table}
WHERE due_at <= :until AND (claim_token IS NULL OR claimed_until <= :at)
ORDER BY due_at, message_id
LIMIT :limit;

-- name: move_due_enqueue
INSERT INTO duetime_queue_messages (queue, message_id, headers, body, enqueued_at, visible_at)
SELECT destination, message_id,
       CASE headers WHEN '{{}}' THEN '{{' ELSE substr(headers, 1, length(headers) - 1) || ',' END
       || '"duetime-due-at":"' || strftime('%Y-%m-%dT%H:%M:%S', due_at / 1000000, 'unixepoch')
       || CASE WHEN due_at % 1000000 THEN printf('.%06d', due_at % 1000000) ELSE '' END
       || '+00:00"}}',
       body, :now, max(due_at, :now, CASE WHEN :step > 0 THEN (due_at + :step - 1) / :step * :step ELSE 0 END)
FROM {table}
WHERE due_at <= :until AND (claim_token IS NULL OR claimed_until <= :at)
ORDER BY due_at, message_id
LIMIT :limit;

-- name: move_due_delete
DELETE FROM {table} WHERE message_id IN (
    SELECT message_id FROM {table}
    WHERE due_at <= :until AND (claim_token IS NULL OR claimed_until <= :at)
    ORDER BY due_at, message_id
    LIMIT :limit
);

-- name: next_unclaimed
SELECT due_at FROM {table} WHERE claim_token IS NULL ORDER BY due_at LIMIT 1;

-- name: next_claim_expiry
SELECT min(claimed_until) FROM {table} WHERE claim_token IS NOT NULL;

-- name: delete
DELETE FROM {table} WHERE message_id = ?;

-- The ids of a JSON array that are stored.
-- name: stored_ids
SELECT message_id FROM {table} WHERE message_id IN (SELECT value FROM json_each(?));

-- name: increment_failure
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL
WHERE message_id = ?;

-- name: increment_failure_until
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL, due_at = ?
WHERE message_id = ?;

-- name: release
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE message_id = ?;

-- name: get
SELECT message_id, destination, due_at, headers, body, failure_count, group_key, claim_token,
       claimed_until
FROM {table} WHERE message_id = ?;

-- name: delete_unclaimed
DELETE FROM {table} WHERE message_id = ? AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= ?);

-- name: reschedule_unclaimed
UPDATE {table} SET due_at = ?, claim_token = NULL, claimed_until = NULL
WHERE message_id = ? AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= ?);

-- A waiting message's content in place, in one statement (duetime.interfaces.IfExists); never
-- under a claim, even one that lapsed: its dispatcher may still be sending, and would remove the
-- new content when it is done.
-- name: replace_unclaimed
UPDATE {table} SET destination = ?, due_at = ?, headers = ?, body = ?, failure_count = ?,
    group_key = ?
WHERE message_id = ? AND (claim_token IS NULL OR claim_token = {held});

-- name: count_due
SELECT count(*) FROM {table} WHERE due_at <= :at;

-- name: count_group
SELECT count(*) FROM {table} WHERE group_key = ?;

-- Each count reads an index, never the rows (with their bodies).
-- name: count_total
SELECT count(*) FROM {table};

-- name: count_claimed
SELECT count(*) FROM {table} WHERE claim_token IS NOT NULL AND claim_token <> {held} AND claimed_until > :at;

-- name: count_held
SELECT count(*) FROM {table} WHERE claim_token = {held} AND claimed_until > :at;

-- name: count_failing
SELECT count(*) FROM {table} WHERE failure_count > 0;

-- name: count_by_destination
SELECT destination, count(*) FROM {table} GROUP BY destination ORDER BY count(*) DESC LIMIT 1000;

-- Asked only when count_by_destination came back full: how many destinations there are.
-- name: count_destinations
SELECT count(DISTINCT destination) FROM {table};

-- name: create_queues_table
CREATE TABLE IF NOT EXISTS duetime_queues (
    name TEXT NOT NULL PRIMARY KEY,
    created_at INTEGER NOT NULL
);

-- name: create_queue_messages_table
CREATE TABLE IF NOT EXISTS duetime_queue_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    enqueued_at INTEGER NOT NULL,
    visible_at INTEGER NOT NULL,
    receipt TEXT,
    delivery_count INTEGER NOT NULL DEFAULT 0
);

-- name: create_queue_messages_index
CREATE INDEX IF NOT EXISTS duetime_queue_messages_ready ON duetime_queue_messages (queue, visible_at, seq);

-- Messages no receiver has taken yet, by id: how a store finds one moved ahead of its due time
-- (a cancel of it is refused: it is being delivered). Received ones leave the index.
-- name: create_queue_messages_waiting_index
CREATE INDEX IF NOT EXISTS duetime_queue_messages_waiting ON duetime_queue_messages (message_id)
WHERE delivery_count = 0;

-- name: moved_ahead
SELECT EXISTS (
    SELECT 1 FROM duetime_queue_messages
    WHERE message_id = :message_id AND delivery_count = 0 AND visible_at > :now
);

-- name: declare_queue
INSERT INTO duetime_queues (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING;

-- name: queue_exists
SELECT 1 FROM duetime_queues WHERE name = ?;

-- name: list_queues
SELECT q.name, (SELECT count(*) FROM duetime_queue_messages m WHERE m.queue = q.name)
FROM duetime_queues q ORDER BY q.name;

-- name: enqueue
INSERT INTO duetime_queue_messages (queue, message_id, headers, body, enqueued_at, visible_at)
VALUES (?, ?, ?, ?, ?, ?);

-- Asked before a receive takes the write lock: a receiver wakes on every commit to the file
-- (the dispatcher's, other queues'), and taking the lock each time to find nothing held up those
-- writers (a reader never does, in WAL mode).
-- When the queue's first message is visible: at or before now, one is ready; later, a message
-- moved ahead of its due time, or one whose receipt runs out then (NULL: the queue is empty).
-- name: first_visible
SELECT min(visible_at) FROM duetime_queue_messages WHERE queue = :queue;

-- name: receive
UPDATE duetime_queue_messages
SET visible_at = :until, receipt = :token, delivery_count = delivery_count + 1
WHERE seq IN (
    SELECT seq FROM duetime_queue_messages
    WHERE queue = :queue AND visible_at <= :now
    ORDER BY visible_at, seq
    LIMIT :limit
)
RETURNING seq, queue, message_id, headers, body, delivery_count;

-- name: receive_by_id
UPDATE duetime_queue_messages
SET visible_at = :until, receipt = :token, delivery_count = delivery_count + 1
WHERE queue = :queue AND message_id IN (SELECT value FROM json_each(:message_ids)) AND visible_at <= :now
RETURNING seq, queue, message_id, headers, body, delivery_count;

-- name: acknowledge
DELETE FROM duetime_queue_messages WHERE seq = ? AND receipt = ?;

-- name: peek
SELECT seq, queue, message_id, headers, body, delivery_count FROM duetime_queue_messages
WHERE queue = ? ORDER BY seq LIMIT ?;

-- name: depth
SELECT count(*) FROM duetime_queue_messages WHERE queue = ?;

-- Live dispatchers (duetime.live_dispatchers): one row per dispatcher, refreshed every few seconds.
-- name: create_presence_table
CREATE TABLE IF NOT EXISTS duetime_dispatchers (
    endpoint TEXT NOT NULL,
    dispatcher_id TEXT NOT NULL,
    seen_at INTEGER NOT NULL,
    info TEXT NOT NULL,
    PRIMARY KEY (endpoint, dispatcher_id)
);

-- name: beat
INSERT INTO duetime_dispatchers (endpoint, dispatcher_id, seen_at, info) VALUES (?, ?, ?, ?)
ON CONFLICT (endpoint, dispatcher_id) DO UPDATE SET seen_at = excluded.seen_at, info = excluded.info;

-- name: presences
SELECT info FROM duetime_dispatchers WHERE endpoint = ?;

-- name: forget
DELETE FROM duetime_dispatchers WHERE endpoint = ? AND seen_at < ?;

-- API keys (duetime.api_keys): one row per name, the secret's hash and never the secret.
-- name: create_api_key_table
CREATE TABLE IF NOT EXISTS duetime_api_keys (
    endpoint TEXT NOT NULL,
    name TEXT NOT NULL,
    info TEXT NOT NULL,
    PRIMARY KEY (endpoint, name)
);

-- name: key_insert
INSERT OR IGNORE INTO duetime_api_keys (endpoint, name, info) VALUES (?, ?, ?);

-- name: key_update
UPDATE duetime_api_keys SET info = ? WHERE endpoint = ? AND name = ?;

-- name: key_records
SELECT info FROM duetime_api_keys WHERE endpoint = ? ORDER BY name;

-- Named records (webhook endpoints, duetime.webhooks): one row per endpoint, kind and name.
-- name: create_record_table
CREATE TABLE IF NOT EXISTS duetime_records (
    endpoint TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    info TEXT NOT NULL,
    PRIMARY KEY (endpoint, kind, name)
);

-- name: record_insert
INSERT OR IGNORE INTO duetime_records (endpoint, kind, name, info) VALUES (?, ?, ?, ?);

-- name: record_update
UPDATE duetime_records SET info = ? WHERE endpoint = ? AND kind = ? AND name = ?;

-- name: record_delete
DELETE FROM duetime_records WHERE endpoint = ? AND kind = ? AND name = ?;

-- name: records
SELECT info FROM duetime_records WHERE endpoint = ? AND kind = ? ORDER BY name;

-- name: record_get
SELECT info FROM duetime_records WHERE endpoint = ? AND kind = ? AND name = ?;

-- The audit trail (duetime.audit): a range of its entries' names (time, then id), from the
-- primary key's index; its old entries forgotten in one statement.
-- name: audit_newest
SELECT info FROM duetime_records WHERE endpoint = ? AND kind = 'audit' AND name > ? AND name < ?
ORDER BY name DESC LIMIT ?;

-- name: audit_oldest
SELECT info FROM duetime_records WHERE endpoint = ? AND kind = 'audit' AND name > ? AND name < ?
ORDER BY name LIMIT ?;

-- name: audit_prune
DELETE FROM duetime_records WHERE endpoint = ? AND kind = 'audit' AND name < ?;

-- A compare-and-set (flow control's shared state, duetime.limits).
-- name: record_swap
UPDATE duetime_records SET info = ? WHERE endpoint = ? AND kind = ? AND name = ? AND info = ?;

-- A message a flow-control limit holds back: no claim's, hidden from claims until claimed_until.
-- name: hold
UPDATE {table} SET claim_token = {held}, claimed_until = ? WHERE message_id = ?;

-- Every held message claimable again (a limit changed, a destination resumed).
-- name: release_held
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE claim_token = {held};

-- Rotation (duetime keys rotate): a message's content as it is, if no dispatcher holds it, and
-- its content sealed again with the primary key.
-- name: reseal_look
SELECT headers, body FROM {table} WHERE message_id = ? AND (claim_token IS NULL OR claim_token = {held});

-- name: reseal
UPDATE {table} SET headers = ?, body = ? WHERE message_id = ?;

-- Recurring schedules (duetime.backends._schedules): a row per schedule, compare-and-set on version.
-- name: create_schedule_table
CREATE TABLE IF NOT EXISTS duetime_schedules (
    endpoint TEXT NOT NULL,
    schedule_id TEXT NOT NULL,
    definition TEXT NOT NULL,
    planned_until INTEGER,
    version INTEGER NOT NULL,
    PRIMARY KEY (endpoint, schedule_id)
);

-- name: create_schedule_plan_index
CREATE INDEX IF NOT EXISTS duetime_schedules_plan ON duetime_schedules (endpoint, planned_until)
WHERE planned_until IS NOT NULL;

-- name: schedule_insert
INSERT INTO duetime_schedules (endpoint, schedule_id, definition, planned_until, version) VALUES (?, ?, ?, ?, 0)
ON CONFLICT (endpoint, schedule_id) DO NOTHING;

-- name: schedule_update
UPDATE duetime_schedules SET definition = ?, planned_until = ?, version = version + 1
WHERE endpoint = ? AND schedule_id = ? AND version = ?;

-- name: schedule_get
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules WHERE endpoint = ? AND schedule_id = ?;

-- name: schedule_page
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules
WHERE endpoint = ? AND schedule_id > ? ORDER BY schedule_id LIMIT ?;

-- name: schedules_to_plan
SELECT schedule_id, definition, planned_until, version FROM duetime_schedules
WHERE endpoint = ? AND planned_until IS NOT NULL AND planned_until <= ? ORDER BY planned_until LIMIT ?;

-- name: schedule_delete
DELETE FROM duetime_schedules WHERE endpoint = ? AND schedule_id = ?;

-- Whole batches of store rows (duetime.backends.sqlite.bulk_rows), in the caller's transaction;
-- {{marks}} (doubled: filled in after {table}) is one "?" per id.
-- name: bulk_existing_ids
SELECT message_id FROM {table} WHERE message_id IN ({{marks}});

-- Taking rows out of a table a bulk job migrates (a store's, or another layout's) and putting
-- them back when the job aborts (duetime.backends.sqlite.bulk_rows.source_rows): {{key}} is
-- the key column, {{columns}} a row's columns, {{marks}} a ? for each of them or of the keys.
-- name: bulk_take_keys
DELETE FROM {table} WHERE {{key}} IN ({{marks}});

-- name: bulk_put_back
INSERT INTO {table} ({{columns}}) VALUES ({{marks}});
