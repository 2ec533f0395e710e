-- Statement family: pictures (the dashboard's charts and machine pages, `gendurable machine`).
-- Read-only, no locks.

-- Instances finished per queue, minute and terminal status over the @minutes complete minutes
-- before the current one (database clock), and the current minute (unix minutes). Reads
-- instances_finalized over the window with a heap visit per entry: O(rows finished in it); the
-- dashboard counts the hour once, then only the minutes since its last count.
-- name: finished_by_minute
SELECT queue, (extract(epoch FROM date_trunc('minute', finalized_at)) / 60)::bigint, status::text, count(*)
FROM {schema}.instances
WHERE status IN ('done', 'failed', 'cancelled')
  AND finalized_at >= date_trunc('minute', now()) - @minutes::int * interval '1 minute'
  AND finalized_at < date_trunc('minute', now())
GROUP BY 1, 2, 3;

-- name: current_minute
SELECT (extract(epoch FROM date_trunc('minute', now())) / 60)::bigint;

-- @machine's live rows (step, status, path), read through the statuses' partial indexes
-- (instances_ready_untagged, instances_ready_tagged, instances_executing, instances_parked: one
-- arm each, as a list of statuses would match none of them and read the whole table) with a heap
-- visit each: O(live rows).
-- fragment: machine_live_rows
(SELECT step, status, path FROM {schema}.instances
 WHERE machine = @machine AND status = 'available' AND fair_tag IS NULL
 UNION ALL
 SELECT step, status, path FROM {schema}.instances
 WHERE machine = @machine AND status = 'available' AND fair_tag IS NOT NULL
 UNION ALL
 SELECT step, status, path FROM {schema}.instances WHERE machine = @machine AND status = 'executing'
 UNION ALL
 SELECT step, status, path FROM {schema}.instances
 WHERE machine = @machine AND status IN ('awaiting', 'joining'))

-- A machine's live instances by step and status (machine_live_rows).
-- name: machine_live
SELECT step, status::text, count(*)
FROM {{machine_live_rows}} AS l
GROUP BY 1, 2;

-- A machine's transitions, step to step, in the recorded paths of its live instances and of its
-- @sample most recently finished ones (instances_finished_by_machine, newest first). A live
-- instance's path ends at the step it is at. Returns each transition's count, and how many paths
-- were read and how many started at each first step (from = '').
-- name: machine_edges
WITH sampled AS (
  (SELECT coalesce(path, '{}') AS path, step, false AS live FROM {schema}.instances
   WHERE machine = @machine AND status IN ('done', 'failed', 'cancelled')
   ORDER BY finalized_at DESC, id DESC
   LIMIT @sample)
  UNION ALL
  SELECT coalesce(path, '{}'), step, true FROM {{machine_live_rows}} AS l
), seqs AS (
  SELECT CASE WHEN live AND (cardinality(path) = 0 OR path[cardinality(path)] <> step)
              THEN path || step ELSE path END AS seq
  FROM sampled
)
SELECT '' AS from_step, seq[1] AS to_step, count(*) FROM seqs WHERE cardinality(seq) > 0 GROUP BY 2
UNION ALL
SELECT s.seq[k], s.seq[k + 1], count(*)
FROM seqs AS s, generate_series(1, cardinality(s.seq) - 1) AS k
GROUP BY 1, 2;
