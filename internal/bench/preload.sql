-- The benchmark's set-up (gendurable bench --preload): finished rows, to measure how the engine
-- behaves with a large table behind the backlog. The runtime never runs this.
-- Locks: only the inserted rows.
-- $1 how many, $2 machine, $3 queue.
INSERT INTO {schema}.instances (machine, step, queue, status, state, max_attempts, attempt, finalized_at, result)
SELECT $2, 'perform', $3, 'done', '{}'::jsonb, 1, 1, now(), 'null'::jsonb
FROM generate_series(1, $1::bigint);
