-- Statement family: explain (Client.Explain): why one instance is not running now. Read-only,
-- no locks; the caller runs them in one REPEATABLE READ transaction, so that they see one
-- snapshot. Each reads a handful of rows by an index.

-- The instance, what pauses it, and the database's time. By primary key (and the pauses' key).
-- name: explain_row
SELECT i.status::text, i.queue, i.machine, i.step, i.priority, i.scheduled_at, i.attempt,
       i.errors -> -1 ->> 'error', coalesce((i.errors -> -1 ->> 'attempt')::int, 0), i.await_names,
       i.await_deadline, i.pending_children, i.spawn_wave, coalesce(i.locked_by, ''), i.locked_until,
       i.updated_at, i.paused_at, i.concurrency_key, i.rate_limit, i.weight, i.machine_version, now(),
       qp.reason, qp.paused_at, mp.reason, mp.paused_at
FROM {schema}.instances AS i
LEFT JOIN {schema}.pauses AS qp ON qp.kind = 'queue' AND qp.name = i.queue
LEFT JOIN {schema}.pauses AS mp ON mp.kind = 'machine' AND mp.name = i.machine
WHERE i.id = @id;

-- A parent's unfinished children of its latest wave: how many, and the first five ids
-- (instances_parent).
-- name: explain_children
SELECT count(*), (array_agg(id ORDER BY id))[1:5]
FROM {schema}.instances
WHERE parent_id = @id AND parent_wave = @wave AND status NOT IN ('done', 'failed', 'cancelled');

-- A concurrency key: its gate's slots held and capacity (the counters, by key), and up to five
-- instances running under it (executing rows, through instances_executing).
-- name: explain_gate
SELECT coalesce((SELECT sum(held) FROM {schema}.gates WHERE key = @key), 0),
       coalesce((SELECT sum(capacity) FROM {schema}.gates WHERE key = @key), 0),
       (SELECT count(*) FROM {schema}.instances WHERE status = 'executing' AND concurrency_key = @key),
       coalesce((SELECT (array_agg(id ORDER BY id))[1:5] FROM {schema}.instances
                 WHERE status = 'executing' AND concurrency_key = @key), '{}');

-- A rate limit's bucket as of now (refilled since its last write, up to its burst); no row: the
-- bucket was never used, or was pruned full.
-- name: explain_bucket
SELECT least(burst, tokens + rate * extract(epoch FROM now() - updated_at)), rate, burst
FROM {schema}.buckets WHERE key = @key;

-- The due rows of a queue ahead of a row in the pick's order, up to 10,000 (a range of
-- instances_pick).
-- name: explain_ahead
SELECT count(*) FROM (
  SELECT 1 FROM {schema}.instances AS a, {schema}.instances AS me
  WHERE me.id = @id AND a.status = 'available' AND a.queue = me.queue AND a.scheduled_at <= now()
    AND (a.priority, a.scheduled_at, a.id) < (me.priority, me.scheduled_at, me.id)
    AND a.paused_at IS NULL
  LIMIT 10000) AS ahead;
