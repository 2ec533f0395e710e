-- Statement family: inspection (the test kit, the CLI, the demo). Read-only, no locks.

-- $1 id.
-- name: get_instance
SELECT id, machine, step, queue, status::text, priority, attempt, max_attempts, recoveries, scheduled_at,
       coalesce(locked_by, ''), locked_until, state, result, errors, coalesce(correlation_key, ''),
       await_names, await_deadline, parent_id, inserted_at, updated_at, finalized_at, path, machine_version, upgrades
FROM {schema}.instances
WHERE id = $1;

-- Instances by status, optionally for one queue ($1 NULL: all).
-- name: count_by_status
SELECT status::text, count(*)
FROM {schema}.instances
WHERE $1::text IS NULL OR queue = $1
GROUP BY status;

-- Queues that have rows due within $1 ms (the test kit's Drain): the runnable rows, untagged and
-- tagged (each in its index).
-- name: runnable_queues
SELECT queue FROM {schema}.instances
WHERE status = 'available' AND fair_tag IS NULL AND scheduled_at <= now() + $1::bigint * interval '1 millisecond'
UNION
SELECT queue FROM {schema}.instances
WHERE status = 'available' AND fair_tag IS NOT NULL AND scheduled_at <= now() + $1::bigint * interval '1 millisecond'
ORDER BY queue;

-- Why failed instances failed: the last error of each, counted.
-- name: failure_reasons
SELECT coalesce(errors -> -1 ->> 'error', '(no error recorded)'), count(*)
FROM {schema}.instances
WHERE status = 'failed'
GROUP BY 1
ORDER BY 2 DESC, 1;

-- The inspection API (Client.QueueStats, Client.Stuck, Client.Inspect): operators' tools, the
-- CLI, dashboards and metric collectors call these on tables of millions of rows, often on a
-- timer. Each says what it reads and what that costs. Locks: none (plain reads, each in its own
-- snapshot).

-- Available rows by queue: how many, how many are due now, and how long the longest-waiting due
-- one has been due (microseconds, by the database clock). Reads only the two partial indexes of
-- available rows (instances_ready_untagged and instances_ready_tagged), which hold queue and
-- scheduled_at: index-only scans (heap visits only for pages vacuum has not marked all-visible),
-- O(available rows). Executing, parked and finished rows, however many, are not read.
-- name: queue_stats_available
SELECT queue, sum(n)::bigint, sum(due)::bigint,
       coalesce((extract(epoch FROM now() - min(oldest)) * 1000000)::bigint, 0)
FROM (SELECT queue, count(*) AS n, count(*) FILTER (WHERE scheduled_at <= now()) AS due,
             min(scheduled_at) FILTER (WHERE scheduled_at <= now()) AS oldest
      FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NULL
      GROUP BY queue
      UNION ALL
      SELECT queue, count(*), count(*) FILTER (WHERE scheduled_at <= now()),
             min(scheduled_at) FILTER (WHERE scheduled_at <= now())
      FROM {schema}.instances WHERE status = 'available' AND fair_tag IS NOT NULL
      GROUP BY queue) AS a
GROUP BY queue;

-- Executing rows by queue. Reads instances_executing, the partial index of claimed rows, and
-- visits each one's heap tuple for its queue: O(executing rows), which the workers' concurrency
-- bounds.
-- name: queue_stats_executing
SELECT queue, count(*)
FROM {schema}.instances
WHERE status = 'executing'
GROUP BY queue;

-- Parked rows by queue and status, for @statuses (a subset of awaiting, joining). Reads
-- instances_parked, the partial index of parked rows, and visits each one's heap tuple for its
-- queue and status: O(parked rows), which the live work bounds, not the history.
-- name: queue_stats_parked
SELECT queue, status::text, count(*)
FROM {schema}.instances
WHERE status IN ('awaiting', 'joining')
  AND status::text = ANY(@statuses::text[])
GROUP BY queue, status;

-- Finished rows by queue and status, for @statuses (a subset of done, failed, cancelled): the
-- sums of finished_counts, which the triggers on instances keep as rows finish, are retried or
-- deleted, and which GC folds to one row per (queue, status) every sweep. O(rows written since
-- the last fold): a few per queue and status, plus one per statement that finished rows since.
-- name: queue_stats_finished
SELECT queue, status::text, sum(n)::bigint
FROM {schema}.finished_counts
WHERE status::text = ANY(@statuses::text[])
GROUP BY queue, status
HAVING sum(n) <> 0;

-- Available rows (due or not) whose rate limit no configuration in @r_names names: no pick of
-- this client admits them. Reads instances_rate_waiting (available rows with a rate limit) and
-- their heap tuples: O(rate-limited available rows). Grouped by queue and the limit's name.
-- name: stuck_unknown_rate_limits
SELECT queue, split_part(rate_limit, ':', 1), count(*), min(scheduled_at), min(id)
FROM {schema}.instances
WHERE status = 'available' AND rate_limit IS NOT NULL
  AND NOT (split_part(rate_limit, ':', 1) = ANY(@r_names::text[]))
GROUP BY 1, 2;

-- Available rows (due or not) whose (machine, step) is not among this client's registered
-- (@machines, @steps) pairs, in @queues (empty: every queue). The third column is the unknown
-- step of a known machine, '' for an unknown machine. Reads the two indexes of available rows
-- (untagged and tagged) and each row's heap tuple (machine and step are in no index of available
-- rows): O(available rows in those queues).
-- name: stuck_unknown_machines
SELECT i.queue,
       i.machine,
       CASE WHEN i.machine = ANY(@machines::text[]) THEN i.step ELSE '' END,
       count(*), min(i.scheduled_at), min(i.id)
FROM (SELECT queue, machine, step, scheduled_at, id FROM {schema}.instances
      WHERE status = 'available' AND fair_tag IS NULL
      UNION ALL
      SELECT queue, machine, step, scheduled_at, id FROM {schema}.instances
      WHERE status = 'available' AND fair_tag IS NOT NULL) AS i
WHERE (cardinality(@queues::text[]) = 0 OR i.queue = ANY(@queues::text[]))
  AND NOT EXISTS (SELECT 1 FROM unnest(@machines::text[], @steps::text[]) AS k(machine, step)
                  WHERE k.machine = i.machine AND k.step = i.step)
GROUP BY 1, 2, 3;

-- Parked instances whose await deadline has passed (the reaper has not woken them yet). Reads
-- instances_await_deadline from its start up to now(): O(overdue rows).
-- name: stuck_overdue_awaits
SELECT queue, machine, count(*), min(await_deadline), min(id)
FROM {schema}.instances
WHERE status = 'awaiting' AND await_deadline IS NOT NULL AND await_deadline < now()
GROUP BY 1, 2;

-- One instance, a page of its inbox and a page of its children, in one statement (one snapshot).
-- The row by primary key. The inbox through signals_instance (instance_id, id): its size counts
-- the instance's index entries, O(inbox); the page is a range scan after @inbox_after, O(page).
-- The children through instances_parent (parent_id, parent_wave): the counts by status and the
-- page each read every child (the page keeps the @children_limit lowest ids above
-- @children_after), O(children), at most Config.MaxChildren per wave.
-- name: inspect_instance
SELECT i.id, i.machine, i.step, i.queue, i.status::text, i.priority, i.attempt, i.max_attempts, i.recoveries,
       i.scheduled_at, coalesce(i.locked_by, ''), i.locked_until, i.state, i.result, i.errors,
       coalesce(i.correlation_key, ''), i.await_names, i.await_deadline, i.parent_id,
       i.inserted_at, i.updated_at, i.finalized_at, i.path, i.machine_version, i.upgrades,
       (SELECT count(*) FROM {schema}.signals AS s WHERE s.instance_id = i.id),
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', p.id, 'name', p.name, 'payload', p.payload,
                                                     'at', p.inserted_at) ORDER BY p.id), '[]')
        FROM (SELECT s.id, s.name, s.payload, s.inserted_at
              FROM {schema}.signals AS s
              WHERE s.instance_id = i.id AND s.id > @inbox_after
              ORDER BY s.id
              LIMIT @inbox_limit) AS p),
       (SELECT coalesce(jsonb_object_agg(n.status, n.count), '{}')
        FROM (SELECT c.status::text AS status, count(*) AS count
              FROM {schema}.instances AS c
              WHERE c.parent_id = i.id
              GROUP BY c.status) AS n),
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', p.id, 'machine', p.machine, 'step', p.step,
                                                     'queue', p.queue, 'status', p.status,
                                                     'attempt', p.attempt, 'wave', p.parent_wave,
                                                     'error', p.errors -> -1 ->> 'error',
                                                     'updated_at', p.updated_at) ORDER BY p.id), '[]')
        FROM (SELECT c.id, c.machine, c.step, c.queue, c.status, c.attempt, c.parent_wave, c.errors,
                     c.updated_at
              FROM {schema}.instances AS c
              WHERE c.parent_id = i.id AND c.id > @children_after
              ORDER BY c.id
              LIMIT @children_limit) AS p),
       i.paused_at
FROM {schema}.instances AS i
WHERE i.id = @id;

-- Instances finished in the last @window_ms milliseconds (database clock), by queue and terminal
-- status: the dashboard's throughput. Locks: none (a plain read). Reads instances_finalized (finalized_at, id) from
-- now() - window to its end, and visits each entry's heap tuple for its queue and status:
-- O(rows finished in the window), whatever the size of the table (1 minute of 10,000 steps/s
-- is 600,000 visits: keep the window short). Rows that GC deleted within the window are not
-- counted (GC.Retention is at least Lease, so only a retention shorter than the window loses any).
-- name: throughput
SELECT queue, status::text, count(*)
FROM {schema}.instances
WHERE status IN ('done', 'failed', 'cancelled')
  AND finalized_at >= now() - @window_ms::bigint * interval '1 millisecond'
GROUP BY 1, 2;
