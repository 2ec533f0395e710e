-- Statement family: gate reconciliation (the maintenance sweep).
--
-- Gate counters are exact as long as every execution that debited a slot is credited back, which
-- every outcome and the reaper do in their own statements. The reconciler is the safety net: it
-- sets each counter to the truth (the executing rows that hold its slots), brings each shard's
-- capacity in line with the configuration, and removes counters that no configured gate owns
-- or that a smaller shard count left behind once they hold nothing. A shard a larger shard count
-- adds needs no row: a missing counter is a full one.
--
-- It runs in one transaction of two statements. The first locks the counters that look wrong
-- (FOR UPDATE SKIP LOCKED, in key order: a counter a pick or an outcome is changing right now is
-- left for the next sweep, and sweepers never wait on each other). The second computes the truth
-- with a fresh snapshot, taken after the locks: every claim that debited one of these counters has
-- committed (its debit held the lock until then), and no new debit can land before this commits.
--
-- @g_names, @g_limits, @g_shards: the gates configuration.

-- name: reconcile_gates_lock
WITH cfg AS (
  SELECT * FROM unnest(@g_names::text[], @g_limits::integer[], @g_shards::integer[]) AS c(name, lim, shards)
), truth AS (
  SELECT concurrency_key AS key, concurrency_shard AS shard, count(*)::integer AS n
  FROM {schema}.instances
  WHERE status = 'executing' AND concurrency_shard IS NOT NULL
  GROUP BY 1, 2
)
SELECT g.key, g.shard
FROM {schema}.gates AS g
LEFT JOIN truth AS t ON t.key = g.key AND t.shard = g.shard
LEFT JOIN cfg ON cfg.name = split_part(g.key, ':', 1)
WHERE g.held <> coalesce(t.n, 0)
   OR cfg.name IS NULL
   OR g.shard >= cfg.shards
   OR g.capacity <> cfg.lim / cfg.shards + CASE WHEN g.shard < cfg.lim % cfg.shards THEN 1 ELSE 0 END
ORDER BY g.key, g.shard
FOR UPDATE OF g SKIP LOCKED;

-- @keys, @shards: the counters the first statement locked. Returns how many it repaired and how
-- many it removed.
-- name: reconcile_gates_fix
WITH cfg AS (
  SELECT * FROM unnest(@g_names::text[], @g_limits::integer[], @g_shards::integer[]) AS c(name, lim, shards)
), locked AS (
  SELECT * FROM unnest(@keys::text[], @shards::smallint[]) AS l(key, shard)
), held AS (
  -- The executing rows holding the locked counters' slots, counted in one pass over the
  -- executing rows (there is no index by key and shard; see the schema).
  SELECT i.concurrency_key AS key, i.concurrency_shard AS shard, count(*)::integer AS n
  FROM {schema}.instances AS i
  WHERE i.status = 'executing' AND i.concurrency_shard IS NOT NULL
    AND (i.concurrency_key, i.concurrency_shard) IN (SELECT l.key, l.shard FROM locked AS l)
  GROUP BY 1, 2
), truth AS (
  SELECT l.key, l.shard,
         coalesce(h.n, 0) AS n,
         cfg.name IS NULL OR l.shard >= cfg.shards AS retired,
         CASE WHEN cfg.name IS NOT NULL
              THEN cfg.lim / cfg.shards + CASE WHEN l.shard < cfg.lim % cfg.shards THEN 1 ELSE 0 END END AS cap
  FROM locked AS l
  LEFT JOIN held AS h ON h.key = l.key AND h.shard = l.shard
  LEFT JOIN cfg ON cfg.name = split_part(l.key, ':', 1)
), removed AS (
  DELETE FROM {schema}.gates AS g
  USING truth AS t
  WHERE g.key = t.key AND g.shard = t.shard AND t.retired AND t.n = 0
  RETURNING 1
), repaired AS (
  UPDATE {schema}.gates AS g
  SET held = t.n,
      capacity = greatest(coalesce(t.cap, g.capacity), t.n)
  FROM truth AS t
  WHERE g.key = t.key AND g.shard = t.shard
    AND NOT (t.retired AND t.n = 0)
    AND (g.held <> t.n OR g.capacity <> greatest(coalesce(t.cap, g.capacity), t.n))
  RETURNING 1
)
SELECT (SELECT count(*) FROM repaired), (SELECT count(*) FROM removed);
