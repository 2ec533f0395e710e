-- The benchmark's set-up (gendurable bench --preload, --preload-live): rows to measure how the
-- engine behaves with a large table behind the backlog. The runtime never runs this.
-- Locks: only the inserted rows.

-- Finished rows, counted in finished_counts by one row of their own instead of by the insert
-- trigger's call per row: the caller runs preload_finished_off, preload_finished,
-- preload_finished_count and preload_finished_on in one transaction, on the scenario's own schema
-- (the ALTERs lock the table, ACCESS EXCLUSIVE, until the commit). $1 how many, $2 machine, $3
-- queue.

-- name: preload_finished_off
ALTER TABLE {schema}.instances DISABLE TRIGGER instances_count_finished_insert;

-- name: preload_finished
INSERT INTO {schema}.instances (machine, step, queue, status, state, max_attempts, attempt, finalized_at, result)
SELECT $2, 'perform', $3, 'done', '{}'::jsonb, 1, 1, now(), 'null'::jsonb
FROM generate_series(1, $1::bigint);

-- name: preload_finished_count
INSERT INTO {schema}.finished_counts (queue, status, n) VALUES ($2, 'done', $1);

-- name: preload_finished_on
ALTER TABLE {schema}.instances ENABLE TRIGGER instances_count_finished_insert;

-- name: preload_live
-- Live rows no scenario runs: half parked on a signal, half scheduled a day ahead, of a machine
-- no benchmark client registers, in the scenario's queue (the pick must pass over them). $1 how
-- many, $2 machine, $3 queue.
INSERT INTO {schema}.instances (machine, step, queue, status, state, max_attempts, attempt, scheduled_at, await_names)
SELECT $2, 'wait', $3,
       (CASE WHEN g % 2 = 0 THEN 'awaiting' ELSE 'available' END)::{schema}.status,
       '{}'::jsonb, 3, CASE WHEN g % 2 = 0 THEN 1 ELSE 0 END,
       now() + interval '1 day',
       CASE WHEN g % 2 = 0 THEN ARRAY['never'] END
FROM generate_series(1, $1::bigint) AS g;
