-- Statement family: explain (Client.Explain): why one instance is not running now. Read-only,
-- no locks; the caller runs them in one REPEATABLE READ transaction, so that they see one
-- snapshot. Each reads a handful of rows by an index.

-- The instance, what pauses it, and the database's time. By primary key (and the pauses' key).
-- name: explain_row
SELECT i.status::text, i.queue, i.machine, i.step, i.priority, i.scheduled_at, i.attempt,
       i.errors -> -1 ->> 'error', coalesce((i.errors -> -1 ->> 'attempt')::int, 0), i.await_names,
       i.await_deadline, i.pending_children, i.spawn_wave, coalesce(i.locked_by, ''), i.locked_until,
       i.updated_at, i.paused_at, i.concurrency_key, i.rate_limit, i.weight, i.machine_version, i.fair_key, now(),
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
SELECT least(b.burst, b.tokens + b.rate * {{bucket_refill(b)}}), b.rate, b.burst
FROM {schema}.buckets AS b WHERE b.key = @key;

-- The due rows of a queue ahead of a row in the pick's order, up to 10,000, and how many of them
-- are of another fairness key than the row's: the due rows of more urgent priorities, and at its
-- priority the tagged rows before it in tag order, or, for a row without a tag, the untagged due
-- rows before it in time order (the fair scan places an untagged row near the head of the tagged
-- ones, where it cannot be counted exactly: they are left out). Ranges of instances_ready_tagged
-- and instances_ready_untagged.
-- name: explain_ahead
SELECT count(*), count(*) FILTER (WHERE a.fair_key IS DISTINCT FROM me.fair_key)
FROM {schema}.instances AS me,
LATERAL (
  SELECT y.fair_key FROM (
    (SELECT u.fair_key
     FROM generate_series(1, 9) AS p(priority),
     LATERAL ((SELECT x.fair_key FROM {schema}.instances AS x
               WHERE x.status = 'available' AND x.queue = me.queue AND x.priority = p.priority::smallint
                 AND x.fair_tag IS NOT NULL AND x.paused_at IS NULL
               LIMIT 10000)
              UNION ALL
              (SELECT x.fair_key FROM {schema}.instances AS x
               WHERE x.status = 'available' AND x.queue = me.queue AND x.priority = p.priority::smallint
                 AND x.fair_tag IS NULL AND x.scheduled_at <= now() AND x.paused_at IS NULL
               LIMIT 10000)) AS u
     WHERE p.priority < me.priority)
    UNION ALL
    (SELECT x.fair_key FROM {schema}.instances AS x
     WHERE me.fair_tag IS NOT NULL AND x.status = 'available' AND x.queue = me.queue AND x.priority = me.priority
       AND x.fair_tag IS NOT NULL AND x.paused_at IS NULL
       AND (x.fair_tag, x.scheduled_at, x.id) < (me.fair_tag, me.scheduled_at, me.id)
     LIMIT 10000)
    UNION ALL
    (SELECT x.fair_key FROM {schema}.instances AS x
     WHERE me.fair_tag IS NULL AND x.status = 'available' AND x.queue = me.queue AND x.priority = me.priority
       AND x.fair_tag IS NULL AND x.scheduled_at <= now() AND x.paused_at IS NULL
       AND (x.scheduled_at, x.id) < (me.scheduled_at, me.id)
     LIMIT 10000)
  ) AS y
  LIMIT 10000) AS a
WHERE me.id = @id;
