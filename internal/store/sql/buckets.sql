-- Statement family: rate-limit bucket maintenance (the maintenance sweep).

-- Prune buckets that carry no information: idle so long that they have refilled (a missing
-- bucket is a full one), or of a limit no longer configured. Bounded per statement.
-- Locks: the buckets it deletes, FOR UPDATE SKIP LOCKED in key order (a bucket a pick is writing
-- is left for the next sweep; sweepers never wait on each other).
-- @r_names: the configured limits. Returns how many it deleted.

-- name: gc_buckets
WITH stale AS (
  SELECT key
  FROM {schema}.buckets AS b
  WHERE NOT (split_part(b.key, ':', 1) = ANY(@r_names::text[]))
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
-- Read-only. @r_names: the configured limits. Returns each unknown limit and its rows.

-- name: rate_unknown
SELECT split_part(rate_limit, ':', 1), count(*)
FROM {schema}.instances
WHERE status = 'available' AND rate_limit IS NOT NULL
  AND NOT (split_part(rate_limit, ':', 1) = ANY(@r_names::text[]))
GROUP BY 1
ORDER BY 1;
