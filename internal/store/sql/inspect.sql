-- Statement family: inspection (the test kit, the CLI, the demo). Read-only, no locks.

-- $1 id.
-- name: get_instance
SELECT id, machine, step, queue, status::text, priority, attempt, max_attempts, scheduled_at,
       coalesce(locked_by, ''), locked_until, state, result, errors, coalesce(correlation_key, ''),
       await_names, await_deadline, parent_id, inserted_at, updated_at, finalized_at
FROM {schema}.instances
WHERE id = $1;

-- Instances by status, optionally for one queue ($1 NULL: all).
-- name: count_by_status
SELECT status::text, count(*)
FROM {schema}.instances
WHERE $1::text IS NULL OR queue = $1
GROUP BY status;

-- Queues that have rows due within $1 ms (the test kit's Drain).
-- name: runnable_queues
SELECT DISTINCT queue
FROM {schema}.instances
WHERE status = 'available' AND scheduled_at <= now() + $1::bigint * interval '1 millisecond'
ORDER BY queue;

-- Why failed instances failed: the last error of each, counted.
-- name: failure_reasons
SELECT coalesce(errors -> -1 ->> 'error', '(no error recorded)'), count(*)
FROM {schema}.instances
WHERE status = 'failed'
GROUP BY 1
ORDER BY 2 DESC, 1;
