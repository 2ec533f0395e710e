-- Statement family: leases. A claim's lease (kept alive by the heartbeat) and a runner's gate
-- lease (a block of gate slots it admits its own claims against).
--
-- Leases are compared with the database clock only (now()), never with a time computed on a
-- worker, so clock skew between nodes cannot reclaim a live claim early.

-- Heartbeat: extend the leases of every claim a client holds, in one statement per interval,
-- and report the claims it no longer holds, and those it holds for an instance paused on its own
-- (a prefetched row whose step has not begun is then handed back instead of run).
--
-- Locks: the owned rows are locked FOR NO KEY UPDATE SKIP LOCKED in id order, so the heartbeat
-- never waits: a row it skips is being committed by its outcome at that moment (or read by a
-- foreign-key check, which does not conflict). The final SELECT reads the statement's snapshot
-- without locks: a claim is reported lost only if the row is no longer executing under that
-- token, never merely because it was skipped.
--
-- $1 ids, $2 claim tokens, $3 lease in ms. Returns (id, lost): the lost claims (true), and the
-- held claims of paused instances (false).

-- name: heartbeat
WITH mine AS (
  SELECT u.id, u.owner FROM unnest($1::bigint[], $2::text[]) AS u(id, owner)
), lockable AS (
  SELECT i.id
  FROM {schema}.instances AS i
  JOIN mine ON mine.id = i.id AND mine.owner = i.locked_by -- the token implies executing
  ORDER BY i.id
  FOR NO KEY UPDATE OF i SKIP LOCKED
), extended AS (
  UPDATE {schema}.instances AS i
  SET locked_until = now() + $3::bigint * interval '1 millisecond'
  FROM lockable
  WHERE i.id = lockable.id
  RETURNING i.id
)
SELECT mine.id, i.id IS NULL AS lost
FROM mine
LEFT JOIN {schema}.instances AS i ON i.id = mine.id AND i.locked_by = mine.owner
WHERE i.id IS NULL OR i.paused_at IS NOT NULL;


-- Backing a heartbeat's verdict that claims are lost (Store.ConfirmLost): a write, the client's
-- own registry row seen again, so that its commit waits as every write's does, for the WAL flush
-- and for the synchronous standbys. The heartbeat above writes nothing when none of its claims is
-- held, and its commit then waits for nothing: on a server that is not the primary the standbys
-- follow (an old primary restarted read-write after a failover, before it is demoted), its "lost"
-- would be acted on. (A transaction that is only given an id writes no WAL and waits for no
-- standby.) Locks the client's own nodes row; a row deleted meanwhile is not written, and the
-- verdict then stands unconfirmed, as it did before.
-- name: heartbeat_confirm
UPDATE {schema}.nodes SET seen_at = now() WHERE id = $1;

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
