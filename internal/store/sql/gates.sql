-- Statement family: gate reconciliation (the maintenance sweep).
--
-- Gate counters are exact as long as every execution that debited a slot is credited back, which
-- every outcome and the reaper do in their own statements, and every lease gives back its unused
-- slots when it ends. The reconciler is the safety net: it sets each counter to the truth (the
-- executing rows that hold its slots, plus at most the slots of the shard's live leases, whose
-- unused part only their runners know), brings each shard's capacity in line with the
-- configuration, removes the leases that expired (their runners stopped renewing them) and
-- counters that no configured gate owns or that a smaller shard count left behind once they hold
-- nothing. A shard a larger shard count adds needs no row: a missing counter is a full one.
--
-- It runs in one transaction of three statements. The first locks the counters that look wrong
-- (FOR UPDATE SKIP LOCKED, in key order: a counter a pick or an outcome is changing right now is
-- left for the next sweep, and sweepers never wait on each other). The second locks those
-- counters' expired leases the same way: a lease a pick is admitting against right now holds
-- FOR KEY SHARE and is skipped (it counts as live until the next sweep); a lease locked here can
-- be used by no pick any more, and every pick that used it has committed. The third computes the
-- truth with a fresh snapshot, taken after all the locks: every claim that debited one of these
-- counters, or was admitted against one of the locked leases, has committed, and no new one can
-- land before this commits. It removes the locked leases and counts the others as live.
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
), leased AS (
  SELECT key, shard, sum(slots)::integer AS slots, bool_or(expires_at < now()) AS expired
  FROM {schema}.gate_leases
  GROUP BY 1, 2
)
SELECT g.key, g.shard
FROM {schema}.gates AS g
LEFT JOIN truth AS t ON t.key = g.key AND t.shard = g.shard
LEFT JOIN leased AS l ON l.key = g.key AND l.shard = g.shard
LEFT JOIN cfg ON cfg.name = split_part(g.key, ':', 1)
WHERE g.held < coalesce(t.n, 0)
   OR g.held > coalesce(t.n, 0) + coalesce(l.slots, 0)
   OR l.expired
   OR cfg.name IS NULL
   OR g.shard >= cfg.shards
   OR g.capacity <> cfg.lim / cfg.shards + CASE WHEN g.shard < cfg.lim % cfg.shards THEN 1 ELSE 0 END
ORDER BY g.key, g.shard
FOR UPDATE OF g SKIP LOCKED;

-- The locked counters' expired leases, locked in (key, shard, owner) order, skipping those a pick
-- holds. @keys, @shards: the counters the first statement locked.
-- name: reconcile_gates_leases
SELECT gl.key, gl.shard, gl.owner
FROM {schema}.gate_leases AS gl
WHERE (gl.key, gl.shard) IN (SELECT * FROM unnest(@keys::text[], @shards::smallint[]))
  AND gl.expires_at < now()
ORDER BY gl.key, gl.shard, gl.owner
FOR UPDATE SKIP LOCKED;

-- @keys, @shards: the counters the first statement locked; @x_keys, @x_shards, @x_owners: the
-- expired leases the second locked. Returns how many counters it repaired and how many it
-- removed (expired leases removed count as repairs of their counter).
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
), expired AS (
  SELECT * FROM unnest(@x_keys::text[], @x_shards::smallint[], @x_owners::text[]) AS x(key, shard, owner)
), dropped AS (
  DELETE FROM {schema}.gate_leases AS gl
  USING expired AS x
  WHERE gl.key = x.key AND gl.shard = x.shard AND gl.owner = x.owner
  RETURNING gl.key, gl.shard
), leased AS (
  -- The slots of the leases that stay.
  SELECT gl.key, gl.shard, sum(gl.slots)::integer AS slots
  FROM {schema}.gate_leases AS gl
  WHERE (gl.key, gl.shard) IN (SELECT l.key, l.shard FROM locked AS l)
    AND (gl.key, gl.shard, gl.owner) NOT IN (SELECT x.key, x.shard, x.owner FROM expired AS x)
  GROUP BY 1, 2
), truth AS (
  SELECT l.key, l.shard,
         coalesce(h.n, 0) AS n,
         coalesce(ls.slots, 0) AS leased,
         cfg.name IS NULL OR l.shard >= cfg.shards AS retired,
         CASE WHEN cfg.name IS NOT NULL
              THEN cfg.lim / cfg.shards + CASE WHEN l.shard < cfg.lim % cfg.shards THEN 1 ELSE 0 END END AS cap
  FROM locked AS l
  LEFT JOIN held AS h ON h.key = l.key AND h.shard = l.shard
  LEFT JOIN leased AS ls ON ls.key = l.key AND ls.shard = l.shard
  LEFT JOIN cfg ON cfg.name = split_part(l.key, ':', 1)
), removed AS (
  DELETE FROM {schema}.gates AS g
  USING truth AS t
  WHERE g.key = t.key AND g.shard = t.shard AND t.retired AND t.n = 0 AND t.leased = 0
  RETURNING 1
), repaired AS (
  -- held stays where it is if it lies between the executions and the executions plus the live
  -- leases' slots, and is brought to the nearer end otherwise.
  UPDATE {schema}.gates AS g
  SET held = greatest(t.n, least(g.held, t.n + t.leased)),
      capacity = greatest(coalesce(t.cap, g.capacity), greatest(t.n, least(g.held, t.n + t.leased)))
  FROM truth AS t
  WHERE g.key = t.key AND g.shard = t.shard
    AND NOT (t.retired AND t.n = 0 AND t.leased = 0)
    AND (g.held <> greatest(t.n, least(g.held, t.n + t.leased))
         OR g.capacity <> greatest(coalesce(t.cap, g.capacity), greatest(t.n, least(g.held, t.n + t.leased))))
  RETURNING 1
)
SELECT (SELECT count(*) FROM repaired) + (SELECT count(*) FROM dropped), (SELECT count(*) FROM removed);

-- Gate leases (see the schema). A runner whose batches are all of one gated key far from its
-- limit leases a block of slots of one shard and claims that key's rows against it (pick_leased):
-- no counter is read or written per pick, and an outcome gives its slot back to the lease, not
-- to the counter.
--
-- The lease: @want slots of the key's emptiest shard, only if that shard has at least
-- @want * @roomy free slots (a lease never takes a gate's last slots from the other runners, and
-- a key near its limit is admitted claim by claim). The debit is the pick's (an upsert that
-- applies only while the shard is still that roomy, on its newest row); the lease row is written
-- after it, in the same statement, and lives for @ttl ms unless renewed. Every lease has an
-- owner of its own (the runner's worker id and a sequence number), so its row is new. Returns
-- the shard, or no row.
-- Locks: the counter (like a pick's debit), then the new lease row.
-- @key, @lim, @shards (its gate), @owner, @want, @roomy, @ttl.

-- name: gate_lease
WITH shards AS (
  SELECT s.shard,
         @lim::integer / @shards::integer + CASE WHEN s.shard < @lim::integer % @shards::integer THEN 1 ELSE 0 END AS cap,
         coalesce((SELECT g.held FROM {schema}.gates AS g WHERE g.key = @key AND g.shard = s.shard), 0) AS held
  FROM generate_series(0, @shards::integer - 1) AS s(shard)
), best AS (
  SELECT shard::smallint AS shard, cap
  FROM shards
  WHERE cap - held >= @want::integer * @roomy::integer
  ORDER BY cap - held DESC, shard
  LIMIT 1
), debit AS (
  INSERT INTO {schema}.gates (key, shard, held, capacity)
  SELECT @key, b.shard, @want::integer, b.cap FROM best AS b
  ON CONFLICT (key, shard) DO UPDATE SET held = gates.held + EXCLUDED.held
    WHERE gates.held + EXCLUDED.held * @roomy::integer <= gates.capacity
  RETURNING shard
)
INSERT INTO {schema}.gate_leases (key, shard, owner, slots, expires_at)
SELECT @key, d.shard, @owner, @want::integer, now() + @ttl::bigint * interval '1 millisecond'
FROM debit AS d
RETURNING shard;

-- A lease's growth: @want more slots of its shard, debited from the counter, only if the lease is
-- still there and unexpired (a lease the reconciler removed is not re-created by growing it: its
-- runner's count of its free slots would outlive the slots themselves) and the shard still has
-- @want * @roomy free slots. Returns the lease's slots, or no row.
-- Locks: the lease row, then the counter (like gate_lease_release).
-- @key, @shard, @owner, @want, @roomy.

-- name: gate_lease_grow
WITH lease AS (
  SELECT 1
  FROM {schema}.gate_leases
  WHERE key = @key AND shard = @shard AND owner = @owner AND expires_at > now()
  FOR UPDATE
), debit AS (
  UPDATE {schema}.gates
  SET held = held + @want::integer
  WHERE key = @key AND shard = @shard AND EXISTS (SELECT 1 FROM lease)
    AND capacity - held >= @want::integer * @roomy::integer
  RETURNING 1
)
UPDATE {schema}.gate_leases
SET slots = slots + @want::integer
WHERE key = @key AND shard = @shard AND owner = @owner AND EXISTS (SELECT 1 FROM debit)
RETURNING slots;

-- The heartbeat's renewal of a runner's leases. Returns the leases it renewed: one it does not
-- return is gone (it expired and the reconciler removed it), and its runner stops using it.
-- Locks: the lease rows, in (key, shard, owner) order (the sub-select takes them after its
-- sort; a pick's FOR KEY SHARE does not conflict).
-- $1 keys, $2 shards, $3 owners, $4 ttl ms.

-- name: gate_lease_renew
UPDATE {schema}.gate_leases AS gl
SET expires_at = now() + $4::bigint * interval '1 millisecond'
FROM (SELECT l.key, l.shard, l.owner
      FROM {schema}.gate_leases AS l
      JOIN unnest($1::text[], $2::smallint[], $3::text[]) AS r(key, shard, owner)
        ON l.key = r.key AND l.shard = r.shard AND l.owner = r.owner
      ORDER BY l.key, l.shard, l.owner
      FOR NO KEY UPDATE OF l) AS r
WHERE gl.key = r.key AND gl.shard = r.shard AND gl.owner = r.owner
RETURNING gl.key, gl.shard, gl.owner;

-- The end of a lease: its row goes, and its unused slots (@unused) go back to the counter, only
-- if the row was still there (a lease the reconciler removed took its slots with it).
-- Locks: the lease row, then the counter (like an outcome's credit).
-- $1 key, $2 shard, $3 owner, $4 unused.

-- name: gate_lease_release
WITH gone AS (
  DELETE FROM {schema}.gate_leases
  WHERE key = $1 AND shard = $2 AND owner = $3
  RETURNING 1
)
UPDATE {schema}.gates
SET held = greatest(held - $4::integer, 0)
WHERE key = $1 AND shard = $2 AND EXISTS (SELECT 1 FROM gone);
