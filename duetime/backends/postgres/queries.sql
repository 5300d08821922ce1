-- PostgreSQL queries. {table} is the quoted "schema"."<endpoint>.delayed" table; {queues} and
-- {messages} are the queue transport's tables in the same schema. Parameters are psycopg's %(name)s.

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS {schema_table} (
    component text PRIMARY KEY,
    version integer NOT NULL
);

-- name: advisory_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: create_store_table
CREATE TABLE IF NOT EXISTS {table} (
    message_id varchar(250) PRIMARY KEY,
    destination varchar(200) NOT NULL,
    due_at timestamptz NOT NULL,
    headers json NOT NULL,
    body bytea NOT NULL,
    failure_count integer NOT NULL DEFAULT 0,
    claim_token uuid,
    claimed_until timestamptz,
    group_key varchar(200)
);

-- Schema version 2 (tables of version 1 get the column on `duetime setup`).
-- name: has_group_column
SELECT 1 FROM pg_attribute
WHERE attrelid = %(regclass)s::regclass AND attname = 'group_key' AND NOT attisdropped;

-- name: table_columns
SELECT attname FROM pg_attribute WHERE attrelid = %(regclass)s::regclass AND attnum > 0 AND NOT attisdropped;

-- name: add_group_column
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS group_key varchar(200);

-- name: create_store_group_index
CREATE INDEX IF NOT EXISTS {index_group} ON {table} (group_key) WHERE group_key IS NOT NULL;

-- A row a dispatcher holds locked is in flight: skipped, not waited for.
-- Every statement that picks up to N rows with SKIP LOCKED and changes them picks them once, in
-- a MATERIALIZED CTE: as a subquery the planner may scan it again for each row it joins (a
-- nested loop), and a scan again skips the rows this statement has changed already (locked by
-- it) and picks others, so more than N were changed (a one-row move took two on PostgreSQL 15).
-- name: delete_group_unclaimed
WITH chosen AS MATERIALIZED (
    SELECT message_id FROM {table}
    WHERE group_key = %(group)s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %(now)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {table} AS t USING chosen WHERE t.message_id = chosen.message_id;

-- name: create_store_due_index
CREATE INDEX IF NOT EXISTS {index_due} ON {table} (due_at, message_id);

-- name: create_store_claim_index
CREATE INDEX IF NOT EXISTS {index_claim} ON {table} (claimed_until) WHERE claim_token IS NOT NULL;

-- name: create_store_destination_index
CREATE INDEX IF NOT EXISTS {index_destination} ON {table} (destination, due_at);

-- The planner keeps the share of up to 500 destinations (100 by default), which is what `stats`
-- shows per destination of a store too large to count (destination_statistics).
-- name: destination_statistics_target
ALTER TABLE {table} ALTER COLUMN destination SET STATISTICS 500;

-- name: create_store_failing_index
CREATE INDEX IF NOT EXISTS {index_failing} ON {table} (due_at) WHERE failure_count > 0;

-- name: record_version
INSERT INTO {schema_table} (component, version) VALUES (%(component)s, %(version)s)
ON CONFLICT (component) DO UPDATE SET version = greatest({schema_table}.version, excluded.version);

-- name: read_version
SELECT version FROM {schema_table} WHERE component = %(component)s;

-- name: insert_notify
WITH stored AS (
    INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
    VALUES (%(message_id)s, %(destination)s, %(due_at)s, %(headers)s, %(body)s, %(failure_count)s,
            %(group_key)s)
    RETURNING due_at
)
SELECT pg_notify(%(channel)s, %(payload)s) FROM stored;

-- Several messages in one statement (one round trip, its own transaction), their NOTIFY with
-- them: a shared commit's round of single schedules. Arrays go as binary parameters.
-- name: insert_many_notify
WITH stored AS (
    INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
    SELECT u.message_id, u.destination, u.due_at, u.headers::json, u.body, u.failure_count, u.group_key
    FROM unnest(%(ids)b::text[], %(destinations)b::text[], %(due)b::timestamptz[], %(headers)b::text[],
                %(bodies)b::bytea[], %(failures)b::int[], %(groups)b::text[])
         AS u(message_id, destination, due_at, headers, body, failure_count, group_key)
    RETURNING 1
)
SELECT pg_notify(%(channel)s, %(payload)s) WHERE (SELECT count(*) FROM stored) > 0;

-- The ticks of a recurring schedule, stored unless their ids are there (duetime.backends._schedules).
-- name: insert_new
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
SELECT u.message_id, u.destination, u.due_at, u.headers::json, u.body, u.failure_count, u.group_key
FROM unnest(%(ids)b::text[], %(destinations)b::text[], %(due)b::timestamptz[], %(headers)b::text[],
            %(bodies)b::bytea[], %(failures)b::int[], %(groups)b::text[])
     AS u(message_id, destination, due_at, headers, body, failure_count, group_key)
ON CONFLICT (message_id) DO NOTHING;

-- name: copy_in
COPY {table} (message_id, destination, due_at, headers, body, failure_count, group_key) FROM STDIN;

-- name: notify
SELECT pg_notify(%(channel)s, %(payload)s);

-- What both claims end with (not a statement of its own: claim_due and lock_due take it in as
-- {claimed_and_next}, after their CTE `c` of the claimed rows): for a batch shorter than `limit`,
-- the next due time left once claimed, in the same statement (one round trip; see
-- duetime.interfaces.ClaimsWithNextDue). The statement's snapshot still sees the rows it claims
-- as they were, so the earliest unclaimed row and the earliest lease end leave them out by id
-- (the caller counts a new lease itself), and also the rows this store holds locked (`ours`).
-- Each row carries the two times (NULL for a full batch: not read); with no row claimed the
-- result is one row of NULLs and the two times. No ORDER BY (the caller sorts): a lock claim
-- runs with sorting off, and a sort the planner must still make is costed past the JIT
-- threshold (245 ms of compiling a claim of 100, measured).
-- name: claimed_and_next
left_after AS (
    SELECT (
        SELECT due_at FROM {table}
        WHERE (SELECT count(*) FROM c) < %(limit)s
              AND claim_token IS NULL AND message_id <> ALL(ARRAY(SELECT message_id FROM c))
              AND message_id <> ALL(%(ours)s::text[])
        ORDER BY due_at, message_id LIMIT 1
    ) AS first, (
        SELECT min(claimed_until) FROM {table}
        WHERE (SELECT count(*) FROM c) < %(limit)s
              AND claim_token IS NOT NULL AND message_id <> ALL(ARRAY(SELECT message_id FROM c))
    ) AS expiry
)
SELECT c.message_id, c.destination, c.due_at, c.headers, c.body, c.failure_count, c.group_key,
       l.first, l.expiry
FROM left_after AS l LEFT JOIN c ON true

-- The rows a claim or a move takes ({due_rows}, written once): the oldest due by %(at)s that no
-- claim holds (or whose claim lapsed), at most %(limit)s, locked, skipping any another
-- transaction holds.
-- name: due_rows
SELECT message_id FROM {table}
    WHERE due_at <= %(at)s AND (claim_token IS NULL OR claimed_until <= %(at)s)
    ORDER BY due_at, message_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED

-- A lease claim, and the next due time (claimed_and_next).
-- name: claim_due
WITH chosen AS MATERIALIZED (
    {due_rows}
), c AS (
    UPDATE {table} AS t SET claim_token = %(token)s, claimed_until = %(until)s
    FROM chosen
    WHERE t.message_id = chosen.message_id
    RETURNING t.message_id, t.destination, t.due_at, t.headers::text AS headers, t.body, t.failure_count,
              t.group_key
), {claimed_and_next};

-- A lock claim: the same rows as claim_due, locked by a transaction the caller keeps open, and
-- the next due time (claimed_and_next).
-- name: lock_due
WITH c AS (
    SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key FROM {table}
    WHERE due_at <= %(at)s AND (claim_token IS NULL OR claimed_until <= %(at)s)
    ORDER BY due_at, message_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), {claimed_and_next};

-- The rows come back in due order (a DELETE's own RETURNING has none): the queues get them so.
-- name: take_due
WITH chosen AS MATERIALIZED (
    {due_rows}
), taken AS (
    DELETE FROM {table} AS t
    USING chosen
    WHERE t.message_id = chosen.message_id
    RETURNING t.message_id, t.destination, t.due_at, t.headers::text, t.body, t.failure_count, t.group_key
)
SELECT * FROM taken ORDER BY due_at, message_id;

-- An exactly-once move in one statement (one transaction, one round trip): the due rows are
-- locked, and when SQL alone can forward every one of them they are deleted, copied into their
-- queues with `duetime-due-at` spliced into the stored headers text (the rule of
-- duetime.message.outgoing_headers_json), and their queues' receivers woken; the same statement
-- reads the next due time, leaving out the rows it deletes (its snapshot still holds them).
-- A row only Python can forward (a destination with no queue, an NServiceBus timeout, headers
-- that are not a bare JSON object, a due time before 1970) leaves the batch untouched and is
-- counted in `strays`: the caller then moves that batch row by row. The result is one row per
-- moved message, or one row of NULLs with the counts when none moved. A move made ahead
-- (%(until)s later than %(at)s) also takes what comes due by %(until)s, each visible in its queue
-- at its due time (by the server's clock, which every receive asks), rounded up to a whole
-- %(step)s microseconds since the epoch (the lateness budget; 0: not rounded), in integers, as
-- duetime.clock.handed_over_at does.
-- name: move_due_at_once
WITH due AS MATERIALIZED (
    SELECT d.message_id,
           d.due_at >= '1970-01-01T00:00:00Z'
           AND left(d.headers::text, 1) = '{{' AND right(d.headers::text, 1) = '}}'
           AND strpos(d.headers::text, '"NServiceBus.Timeout.Expire"') = 0
           AND d.destination IN (SELECT name FROM {queues}) AS plain
    FROM {table} AS d
    WHERE d.due_at <= %(until)s AND (d.claim_token IS NULL OR d.claimed_until <= %(at)s)
    ORDER BY d.due_at, d.message_id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
), strays AS (
    SELECT count(*) FILTER (WHERE NOT plain) AS strays FROM due
), taken AS (
    DELETE FROM {table} AS t
    USING due
    WHERE t.message_id = due.message_id AND (SELECT strays FROM strays) = 0
    RETURNING t.message_id, t.destination, t.due_at, t.headers::text AS headers, t.body
), sent AS (
    INSERT INTO {messages} (queue, message_id, headers, body, visible_at)
    SELECT destination, message_id,
           (CASE headers WHEN '{{}}' THEN '{{' ELSE left(headers, -1) || ',' END
            || '"duetime-due-at":"' || to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
            || CASE to_char(due_at AT TIME ZONE 'UTC', 'US') WHEN '000000' THEN ''
                    ELSE '.' || to_char(due_at AT TIME ZONE 'UTC', 'US') END
            || '+00:00"}}')::json,
           body,
           greatest(clock_timestamp(), CASE WHEN %(step)s > 0
               THEN due_at + mod(%(step)s - mod((extract(epoch FROM due_at) * 1000000)::bigint, %(step)s),
                                 %(step)s) * interval '1 microsecond'
               ELSE due_at END)
    FROM taken
    ORDER BY due_at, message_id
), woken AS (
    SELECT pg_notify(%(channel)s, d.destination) FROM (SELECT DISTINCT destination FROM taken) AS d
), left_after AS (
    SELECT (
        SELECT due_at FROM {table}
        WHERE claim_token IS NULL AND message_id <> ALL(ARRAY(SELECT message_id FROM taken))
        ORDER BY due_at, message_id LIMIT 1
    ) AS first, (
        SELECT min(claimed_until) FROM {table} WHERE claim_token IS NOT NULL
    ) AS expiry
)
SELECT t.message_id, t.destination, t.due_at,
       CASE WHEN strpos(t.headers, '"traceparent"') > 0 THEN t.headers END,
       s.strays, l.first, l.expiry
FROM strays AS s CROSS JOIN left_after AS l LEFT JOIN taken AS t ON true
WHERE (SELECT count(*) FROM woken) >= 0;

-- The earliest unclaimed message, leaving out those this store holds locked itself (a batch
-- being sent: the dispatcher asks while it sends), and the earliest end of a lease; one round trip.
-- name: next_times
SELECT (
    SELECT due_at FROM {table} WHERE claim_token IS NULL AND message_id <> ALL(%(ours)b::text[])
    ORDER BY due_at, message_id LIMIT 1
), (
    SELECT min(claimed_until) FROM {table} WHERE claim_token IS NOT NULL
);

-- The earliest unclaimed message no transaction holds (KEY SHARE: the lightest lock that
-- conflicts with a claim's FOR UPDATE). Taking it writes WAL and commits with a flush, so it is
-- asked only when the earliest message is due already (only a due row can be held).
-- name: next_unlocked
SELECT due_at FROM {table} WHERE claim_token IS NULL ORDER BY due_at, message_id LIMIT 1
FOR KEY SHARE SKIP LOCKED;

-- name: delete_many
DELETE FROM {table} WHERE message_id = ANY(%(ids)b);

-- name: stored_ids
SELECT message_id FROM {table} WHERE message_id = ANY(%(ids)b);

-- name: increment_failure
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL
WHERE message_id = %(id)s;

-- name: increment_failure_until
UPDATE {table} SET failure_count = failure_count + 1, claim_token = NULL, claimed_until = NULL,
due_at = %(due_at)s
WHERE message_id = %(id)s;

-- name: release_many
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE message_id = ANY(%(ids)b);

-- name: get
SELECT message_id, destination, due_at, headers::text, body, failure_count, group_key FROM {table}
WHERE message_id = %(id)s;

-- A row a dispatcher holds locked is in flight too: skipped, not waited for.
-- name: delete_unclaimed
DELETE FROM {table} WHERE message_id = %(id)s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %(now)s)
AND message_id IN (SELECT message_id FROM {table} WHERE message_id = %(id)s FOR UPDATE SKIP LOCKED);

-- name: reschedule_unclaimed
UPDATE {table} SET due_at = %(due_at)s, claim_token = NULL, claimed_until = NULL
WHERE message_id = %(id)s AND (claim_token IS NULL OR claim_token = {held} OR claimed_until <= %(now)s)
AND message_id IN (SELECT message_id FROM {table} WHERE message_id = %(id)s FOR UPDATE SKIP LOCKED);

-- A waiting message's content in place (duetime.interfaces.IfExists); never under a claim, even
-- one that lapsed (its dispatcher may still be sending, and would remove the new content when it
-- is done), and a row a dispatcher holds locked is skipped. Run after replace_lock, in its
-- transaction.
-- name: replace_lock
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: replace_unclaimed
UPDATE {table} SET destination = %(destination)s, due_at = %(due_at)s, headers = %(headers)s,
    body = %(body)s, failure_count = %(failure_count)s, group_key = %(group_key)s
WHERE message_id = %(message_id)s AND (claim_token IS NULL OR claim_token = {held})
AND message_id IN (SELECT message_id FROM {table} WHERE message_id = %(message_id)s FOR UPDATE SKIP LOCKED);

-- name: estimate_rows
SELECT reltuples::bigint FROM pg_class WHERE oid = %(regclass)s::regclass;

-- The destinations' shares as ANALYZE last sampled them, and how many there are (negative: a
-- fraction of the rows).
-- name: destination_statistics
SELECT most_common_vals::text::text[], most_common_freqs, n_distinct FROM pg_stats
WHERE schemaname = %(schema)s AND tablename = %(table)s AND attname = 'destination';

-- name: count_group
SELECT count(*) FROM {table} WHERE group_key = %(group)s;

-- The server's own time: due times and claims are compared with it, not the host's clock.
-- name: server_time
SELECT clock_timestamp();

-- name: count_due
SELECT count(*) FROM {table} WHERE due_at <= %(at)s;

-- name: count_claimed
SELECT count(*) FROM {table} WHERE claim_token IS NOT NULL AND claim_token <> {held} AND claimed_until > %(at)s;

-- name: count_held
SELECT count(*) FROM {table} WHERE claim_token = {held} AND claimed_until > %(at)s;

-- name: count_failing
SELECT count(*) FROM {table} WHERE failure_count > 0;

-- The destinations holding the most, and (on each row) how many the table holds in all: one scan
-- for both (two scans of a few hundred thousand rows took over a second on a busy machine).
-- name: count_by_destination
SELECT destination, n, sum(n) OVER () FROM (
    SELECT destination, count(*) AS n FROM {table} GROUP BY destination
) AS d ORDER BY n DESC LIMIT 1000;

-- Asked only when count_by_destination came back full: how many destinations there are.
-- name: count_destinations
SELECT count(DISTINCT destination) FROM {table};

-- name: create_queues_table
CREATE TABLE IF NOT EXISTS {queues} (
    name varchar(200) PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- name: create_messages_table
CREATE TABLE IF NOT EXISTS {messages} (
    seq bigserial PRIMARY KEY,
    queue varchar(200) NOT NULL,
    message_id varchar(250) NOT NULL,
    headers json NOT NULL,
    body bytea NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    receipt uuid,
    delivery_count integer NOT NULL DEFAULT 0
);

-- name: create_messages_index
CREATE INDEX IF NOT EXISTS {index_ready} ON {messages} (queue, visible_at, seq);

-- Messages no receiver has taken yet, by id: how a store finds one moved ahead of its due time
-- (a cancel of it is refused: it is being delivered). Received ones leave the index.
-- name: create_messages_waiting_index
CREATE INDEX IF NOT EXISTS {index_waiting} ON {messages} (message_id) WHERE delivery_count = 0;

-- name: moved_ahead
SELECT EXISTS (
    SELECT 1 FROM {messages}
    WHERE message_id = %(message_id)s AND delivery_count = 0 AND visible_at > clock_timestamp()
);

-- name: declare_queue
INSERT INTO {queues} (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING;

-- name: existing_queues
SELECT name FROM {queues} WHERE name = ANY(%(names)s);

-- name: list_queues
SELECT q.name, (SELECT count(*) FROM {messages} m WHERE m.queue = q.name) FROM {queues} q ORDER BY q.name;

-- name: enqueue
INSERT INTO {messages} (queue, message_id, headers, body) VALUES (%s, %s, %s, %s);

-- Arrays go as binary parameters (%()b): in text form psycopg escapes every element with a
-- regular expression, which cost more than the statement for a batch of 100.
-- The NOTIFY (one per queue, sent at commit) wakes receivers waiting on the queue channel.
-- name: enqueue_declared
WITH sent AS (
    INSERT INTO {messages} (queue, message_id, headers, body)
    SELECT u.queue, u.message_id, u.headers::json, u.body
    FROM unnest(%(queues)b::text[], %(ids)b::text[], %(headers)b::text[], %(bodies)b::bytea[])
         WITH ORDINALITY AS u(queue, message_id, headers, body, n)
    WHERE u.queue IN (SELECT name FROM {queues})
    ORDER BY u.n
    RETURNING message_id, queue
), woken AS (
    SELECT pg_notify(%(channel)s, d.queue) FROM (SELECT DISTINCT queue FROM sent) AS d
)
SELECT message_id FROM sent WHERE (SELECT count(*) FROM woken) >= 0;

-- name: notify_queues
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q;

-- A receive, which first acknowledges what the consumer handled since its last one (`done`; the
-- arrays are empty when there is none): one statement, one round trip. The rows it deletes are
-- left out of what it takes (a row whose receipt ran out could be both; one statement must not
-- change a row twice). Its last column says in how many seconds the queue's next message not
-- visible now becomes visible (one moved ahead of its due time, or one whose receipt runs out
-- then; NULL: none), so that a receiver that took all there was sleeps until then at most. The
-- result is one row per message taken, or one row of NULLs but that when none was.
-- name: receive
WITH acknowledged AS (
    DELETE FROM {messages} AS m
    USING unnest(%(seqs)s::bigint[], %(receipts)s::uuid[]) AS a(seq, receipt)
    WHERE m.seq = a.seq AND m.receipt = a.receipt
), chosen AS MATERIALIZED (
    SELECT seq FROM {messages}
    WHERE queue = %(queue)s AND visible_at <= clock_timestamp() AND seq <> ALL(%(seqs)s::bigint[])
    ORDER BY visible_at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE {messages} AS m
    SET visible_at = clock_timestamp() + %(visibility)s, receipt = %(token)s,
        delivery_count = delivery_count + 1
    FROM chosen AS c
    WHERE m.seq = c.seq
    RETURNING m.seq, m.queue, m.message_id, m.headers::text AS headers, m.body, m.delivery_count
), later AS (
    SELECT extract(epoch FROM (
        SELECT min(visible_at) FROM {messages}
        WHERE queue = %(queue)s AND visible_at > clock_timestamp() AND seq <> ALL(%(seqs)s::bigint[])
    ) - clock_timestamp())::float8 AS visible_in
)
SELECT t.seq, t.queue, t.message_id, t.headers, t.body, t.delivery_count, l.visible_in
FROM later AS l LEFT JOIN taken AS t ON true;

-- name: receive_by_id
UPDATE {messages} AS m
SET visible_at = clock_timestamp() + %(visibility)s, receipt = %(token)s, delivery_count = delivery_count + 1
FROM (
    SELECT seq FROM {messages}
    WHERE queue = %(queue)s AND message_id = ANY(%(message_ids)b) AND visible_at <= clock_timestamp()
    FOR UPDATE SKIP LOCKED
) AS c
WHERE m.seq = c.seq
RETURNING m.seq, m.queue, m.message_id, m.headers::text, m.body, m.delivery_count;

-- name: acknowledge
-- A whole batch in one statement (one transaction, one round trip): the consumer's drain rate.
DELETE FROM {messages} AS m
USING unnest(%(seqs)b::bigint[], %(receipts)b::uuid[]) AS a(seq, receipt)
WHERE m.seq = a.seq AND m.receipt = a.receipt;

-- name: peek
SELECT seq, queue, message_id, headers::text, body, delivery_count FROM {messages}
WHERE queue = %(queue)s ORDER BY seq LIMIT %(limit)s;

-- name: depth
SELECT count(*) FROM {messages} WHERE queue = %(queue)s;

-- Live dispatchers (duetime.live_dispatchers): one row per dispatcher, refreshed every few seconds.
-- name: create_presence_table
CREATE TABLE IF NOT EXISTS {presence} (
    endpoint varchar(200) NOT NULL,
    dispatcher_id varchar(250) NOT NULL,
    seen_at timestamptz NOT NULL,
    info json NOT NULL,
    PRIMARY KEY (endpoint, dispatcher_id)
);

-- name: beat
INSERT INTO {presence} (endpoint, dispatcher_id, seen_at, info)
VALUES (%(endpoint)s, %(id)s, %(seen)s, %(info)s)
ON CONFLICT (endpoint, dispatcher_id) DO UPDATE SET seen_at = excluded.seen_at, info = excluded.info;

-- name: presences
SELECT info::text FROM {presence} WHERE endpoint = %(endpoint)s;

-- name: forget
DELETE FROM {presence} WHERE endpoint = %(endpoint)s AND seen_at < %(before)s;

-- API keys (duetime.api_keys): one row per name, the secret's hash and never the secret.
-- name: create_api_key_table
CREATE TABLE IF NOT EXISTS {api_keys} (
    endpoint varchar(200) NOT NULL,
    name varchar(64) NOT NULL,
    info json NOT NULL,
    PRIMARY KEY (endpoint, name)
);

-- name: key_insert
INSERT INTO {api_keys} (endpoint, name, info) VALUES (%(endpoint)s, %(name)s, %(info)s)
ON CONFLICT (endpoint, name) DO NOTHING;

-- name: key_update
UPDATE {api_keys} SET info = %(info)s WHERE endpoint = %(endpoint)s AND name = %(name)s;

-- name: key_records
SELECT info::text FROM {api_keys} WHERE endpoint = %(endpoint)s ORDER BY name;

-- Named records (webhook endpoints, duetime.webhooks): one row per endpoint, kind and name.
-- name: create_record_table
CREATE TABLE IF NOT EXISTS {records} (
    endpoint varchar(200) NOT NULL,
    kind varchar(32) NOT NULL,
    name varchar(100) NOT NULL,
    info json NOT NULL,
    PRIMARY KEY (endpoint, kind, name)
);

-- name: record_insert
INSERT INTO {records} (endpoint, kind, name, info) VALUES (%(endpoint)s, %(kind)s, %(name)s, %(info)s)
ON CONFLICT (endpoint, kind, name) DO NOTHING;

-- name: record_update
UPDATE {records} SET info = %(info)s WHERE endpoint = %(endpoint)s AND kind = %(kind)s AND name = %(name)s;

-- name: record_delete
DELETE FROM {records} WHERE endpoint = %(endpoint)s AND kind = %(kind)s AND name = %(name)s;

-- name: records
SELECT info::text FROM {records} WHERE endpoint = %(endpoint)s AND kind = %(kind)s ORDER BY name;

-- The audit trail (duetime.audit): a range of its entries' names (time, then id), from the
-- primary key's index (the names hold digits, T, Z, '.', '-' and hex: every collation sorts
-- them as bytes do); its old entries forgotten in one statement.
-- name: audit_newest
SELECT info::text FROM {records}
WHERE endpoint = %(endpoint)s AND kind = 'audit' AND name > %(above)s AND name < %(below)s
ORDER BY name DESC LIMIT %(limit)s;

-- name: audit_oldest
SELECT info::text FROM {records}
WHERE endpoint = %(endpoint)s AND kind = 'audit' AND name > %(above)s AND name < %(below)s
ORDER BY name LIMIT %(limit)s;

-- name: audit_prune
DELETE FROM {records} WHERE endpoint = %(endpoint)s AND kind = 'audit' AND name < %(below)s;

-- A compare-and-set (flow control's shared state, duetime.limits): the text as written (json
-- keeps it), or the insert of a first one; what is there when it does not hold.
-- name: record_swap
UPDATE {records} SET info = %(new)s
WHERE endpoint = %(endpoint)s AND kind = %(kind)s AND name = %(name)s AND info::text = %(old)s;

-- name: record_get
SELECT info::text FROM {records} WHERE endpoint = %(endpoint)s AND kind = %(kind)s AND name = %(name)s;

-- A message a flow-control limit holds back: no claim's, hidden from claims until claimed_until.
-- name: hold
UPDATE {table} AS t SET claim_token = {held}, claimed_until = h.until
FROM unnest(%(ids)s::text[], %(untils)s::timestamptz[]) AS h (id, until) WHERE t.message_id = h.id;

-- Every held message claimable again (a limit changed, a destination resumed).
-- name: release_held
UPDATE {table} SET claim_token = NULL, claimed_until = NULL WHERE claim_token = {held};

-- Rotation (duetime keys rotate): a message's content as it is, locked, if no dispatcher holds
-- it (one whose row a dispatcher has locked is skipped, not waited for), and its content sealed
-- again with the primary key.
-- name: reseal_look
SELECT message_id, headers::text, body FROM {table}
WHERE message_id = ANY(%(ids)s) AND (claim_token IS NULL OR claim_token = {held})
FOR UPDATE SKIP LOCKED;

-- name: reseal
UPDATE {table} AS t SET headers = c.headers::json, body = c.body
FROM unnest(%(ids)s::text[], %(headers)s::text[], %(bodies)s::bytea[]) AS c(id, headers, body)
WHERE t.message_id = c.id;

-- Recurring schedules (duetime.backends._schedules): a row per schedule, compare-and-set on version.
-- name: create_schedule_table
CREATE TABLE IF NOT EXISTS {schedules} (
    endpoint varchar(200) NOT NULL,
    schedule_id varchar(200) NOT NULL,
    definition text NOT NULL,
    planned_until timestamptz,
    version bigint NOT NULL,
    PRIMARY KEY (endpoint, schedule_id)
);

-- name: create_schedule_plan_index
CREATE INDEX IF NOT EXISTS {index_schedules_plan} ON {schedules} (endpoint, planned_until)
WHERE planned_until IS NOT NULL;

-- name: schedule_insert
INSERT INTO {schedules} (endpoint, schedule_id, definition, planned_until, version)
VALUES (%(endpoint)s, %(id)s, %(definition)s, %(planned_until)s, 0)
ON CONFLICT (endpoint, schedule_id) DO NOTHING;

-- Many rows in one statement, each only at the version it was read; the ones written come back.
-- Rows are locked in id order, and one another planner holds is skipped (it is planning it):
-- two planners never wait on each other in a circle.
-- name: schedule_update
WITH u AS (
    SELECT * FROM unnest(%(ids)b::text[], %(versions)b::bigint[], %(definitions)b::text[],
                         %(untils)b::timestamptz[]) AS u(schedule_id, version, definition, planned_until)
), mine AS (
    SELECT s.schedule_id FROM {schedules} AS s JOIN u ON s.schedule_id = u.schedule_id AND s.version = u.version
    WHERE s.endpoint = %(endpoint)s ORDER BY s.schedule_id FOR UPDATE OF s SKIP LOCKED
)
UPDATE {schedules} AS s SET definition = u.definition, planned_until = u.planned_until, version = s.version + 1
FROM u JOIN mine ON mine.schedule_id = u.schedule_id
WHERE s.endpoint = %(endpoint)s AND s.schedule_id = u.schedule_id AND s.version = u.version
RETURNING s.schedule_id;

-- name: schedule_get
SELECT schedule_id, definition, planned_until, version FROM {schedules}
WHERE endpoint = %(endpoint)s AND schedule_id = %(id)s;

-- name: schedule_page
SELECT schedule_id, definition, planned_until, version FROM {schedules}
WHERE endpoint = %(endpoint)s AND schedule_id > %(after)s ORDER BY schedule_id COLLATE "C" LIMIT %(limit)s;

-- name: schedules_to_plan
SELECT schedule_id, definition, planned_until, version FROM {schedules}
WHERE endpoint = %(endpoint)s AND planned_until IS NOT NULL AND planned_until <= %(until)s
ORDER BY planned_until LIMIT %(limit)s;

-- name: schedule_delete
DELETE FROM {schedules} WHERE endpoint = %(endpoint)s AND schedule_id = %(id)s;

-- ---------------------------------------------------------------------------------------------
-- Whole batches of store rows (duetime.backends.postgres.bulk_rows), in the caller's transaction.
-- {{rows}} and {{taken}} (doubled: filled in after {table}) are the caller's statements giving
-- store rows as c0..c6: id, destination, due time in µs since 1970 (bigint), headers as JSON text,
-- body, failure count, group; {{due}} is bulk_rows.timestamptz_sql("c2"). Parameters: the caller's %s.

-- name: bulk_copy
COPY {table} (message_id, destination, due_at, headers, body, failure_count, group_key) FROM STDIN (FORMAT BINARY)

-- name: bulk_create_incoming
CREATE TEMP TABLE IF NOT EXISTS duetime_bulk_in (
    c0 text, c1 text, c2 bigint, c3 text, c4 bytea, c5 integer, c6 text
) ON COMMIT DROP

-- name: bulk_empty_incoming
TRUNCATE duetime_bulk_in

-- name: bulk_copy_incoming
COPY duetime_bulk_in FROM STDIN (FORMAT BINARY)

-- name: bulk_insert_selected
INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
SELECT c0, c1, {{due}}, c3::json, c4, c5, c6 FROM ({{rows}}) AS s (c0, c1, c2, c3, c4, c5, c6)
ON CONFLICT (message_id) DO NOTHING RETURNING message_id

-- Moved in one statement: {{taken}} deletes rows from where they were and returns them. The answer:
-- how many were taken, how many stored (the same, or the caller rolls back) and the earliest due.
-- name: bulk_move
WITH moved AS ({{taken}}),
ins AS (
    INSERT INTO {table} (message_id, destination, due_at, headers, body, failure_count, group_key)
    SELECT c0, c1, {{due}}, c3::json, c4, c5, c6 FROM moved RETURNING 1
)
SELECT (SELECT COUNT(*) FROM moved), (SELECT COUNT(*) FROM ins), (SELECT MIN(c2) FROM moved)

-- Which of the ids {{ids}} selects (a column named id) the table holds already.
-- name: bulk_ids_present
SELECT s.id FROM ({{ids}}) AS s JOIN {table} AS t ON t.message_id = s.id

-- Taking rows out of a table a bulk job reads (a store's, or another layout's it migrates) and
-- putting them back when the job aborts (duetime.backends.postgres.bulk_rows: source_rows, take_sql):
-- {{where}} picks the rows, {{returning}} is what each gives back, {{key}} the key column,
-- {{columns}} a row's columns and {{marks}} a %s for each of them or of the keys.

-- name: bulk_take
DELETE FROM {table} WHERE {{where}} RETURNING {{returning}}

-- name: bulk_take_keys
DELETE FROM {table} WHERE {{key}} IN ({{marks}})

-- name: bulk_put_back
INSERT INTO {table} ({{columns}}) VALUES ({{marks}})
