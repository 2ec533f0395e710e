-- Statement family: rate-limit buckets (the GC sweep, the reaper's report).

-- Prune buckets that carry no information: idle so long that they have refilled by the rate and
-- burst they were last written with (a missing bucket is a full one), or of a limit no longer
-- configured. A node that configures no rate limit at all (a maintenance node set up without
-- them) cannot tell a removed limit from one it was not told about: it prunes refilled buckets
-- only, so that it never resets a drained bucket of a live limit to full. (A removed limit's
-- buckets refill by their own rate and are pruned then.) Bounded per statement.
-- Locks: the buckets it deletes, FOR UPDATE SKIP LOCKED in key order (a bucket a pick is writing
-- is left for the next sweep; sweepers never wait on each other).
-- @r_names: the configured limits. Returns how many it deleted.

-- name: gc_buckets
WITH stale AS (
  SELECT key
  FROM {schema}.buckets AS b
  WHERE (cardinality(@r_names::text[]) > 0 AND NOT (split_part(b.key, ':', 1) = ANY(@r_names::text[])))
     OR b.tokens + b.rate * extract(epoch FROM now() - b.updated_at) >= b.burst
  ORDER BY key
  LIMIT 1000
  FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.buckets AS b
USING stale
WHERE b.key = stale.key;

-- Runnable rows waiting on a limit no configuration here names: they stall (the pick never
-- admits them) until a node that configures the limit picks them, or the limit is configured.
-- The reaper of a node that runs queues reports them. Read-only. @r_names: the configured limits. Returns each unknown limit and its rows.

-- name: rate_unknown
SELECT split_part(rate_limit, ':', 1), count(*)
FROM {schema}.instances
WHERE status = 'available' AND rate_limit IS NOT NULL
  AND NOT (split_part(rate_limit, ':', 1) = ANY(@r_names::text[]))
GROUP BY 1
ORDER BY 1;
