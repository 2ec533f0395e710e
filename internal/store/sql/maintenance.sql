-- Statement family: maintenance. The reaper (expired claims, await deadlines) and the GC sweep
-- (finished instances, gate reconciliation, rate-limit buckets). Every sweep claims its rows with
-- FOR UPDATE SKIP LOCKED (or NO KEY UPDATE) in a fixed order, so any number of nodes may run it at
-- once: sweepers never wait on each other, never deadlock, and never process a row twice.
--
-- Leases and deadlines are compared with the database clock only (now()), never with a time
-- computed on a worker, so clock skew between nodes cannot release a live claim early.

-- The settings of a transaction of the library's own of several statements, local to it: the
-- maintenance ones (ReleaseExpired, ReconcileGates, the bulk upgrade's batches) and the client's
-- operations (Cancel, Retry, a Bulk batch, writing a schedule), none of which runs a caller's code
-- inside. The server ends the session of a process that stops between two of its statements for
-- longer than $1 (a process paused, a stalled VM, a CLI suspended in its terminal), rolling it
-- back. Without it, the rows and gate counters it had locked stayed locked for as long as the
-- process was stopped, and every other node's reaper, reconciler, gated picks and outcome commits
-- waited on them and timed out, again and again (TestOwnTxOfAStoppedWorkerEnds,
-- TestBulkBatchOfAStoppedClientEnds). A shorter bound the session already has (the role's)
-- stays (TestOwnTxKeepsAShorterIdleBound). Locks: none.
-- name: own_tx_settings
SELECT pg_catalog.set_config('idle_in_transaction_session_timeout',
         CASE WHEN s.raw::interval > interval '0' AND s.raw::interval < $1::text::interval THEN s.raw
              ELSE $1::text END, true)
FROM (SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout') AS raw) AS s;

-- Release expired claims: the reaper's sweep ($2 NULL: every claim whose lease has run out)
-- and a starting scheduler's reclaim of its dead predecessor ($2 the worker-id prefix shared
-- with the predecessor: only claims of that prefix, once their last heartbeat is older than $3 ms
-- allows, i.e. locked_until < now() + $3; a live worker with the same prefix keeps its leases
-- fresher than that, so a name collision can never release a live claim). Other nodes' expired
-- claims are the reaper's: a node that runs no reaper releases nothing but its own.
--
-- A lost claim is not the step's fault: the release gives its attempt back and counts a recovery
-- (recoveries, reset with attempt when the instance moves on). The row becomes available again,
-- or, past $4 recoveries of its current step, failed; either way the error history says the
-- lease was lost, and under which attempt. A gate slot it held is credited back; a child that
-- fails here settles its parent's join like any finished child (outcome_settle).
--
-- Locks: candidate rows FOR NO KEY UPDATE SKIP LOCKED in id order: concurrent sweepers on many
-- nodes never wait on each other, never deadlock, and never release the same row twice. The
-- lock re-checks the WHERE clause on the newest row version, so a claim whose outcome committed
-- meanwhile is not touched.
--
-- $1 limit, $2 worker-id prefix or NULL, $3 staleness slack in ms, $4 the recoveries a step may
-- have (ReaperConfig.MaxRecoveries).

-- name: release_expired
WITH expired AS (
  SELECT id, locked_by, concurrency_key, concurrency_shard
  FROM {schema}.instances
  WHERE status = 'executing'
    AND (CASE WHEN $2::text IS NULL THEN locked_until < now()
              ELSE starts_with(locked_by, $2::text)
                   AND locked_until < now() + $3::bigint * interval '1 millisecond' END)
  ORDER BY id
  LIMIT $1
  FOR NO KEY UPDATE SKIP LOCKED
), rel AS (
UPDATE {schema}.instances AS i
SET status       = (CASE WHEN i.recoveries >= $4::integer THEN 'failed' ELSE 'available' END)::{schema}.status,
    attempt      = greatest(i.attempt - 1, 0),
    recoveries   = i.recoveries + 1,
    scheduled_at = now(),
    locked_by    = NULL,
    locked_until = NULL,
    errors       = (CASE WHEN jsonb_array_length(coalesce(i.errors, '[]'::jsonb)) >= 20
                         THEN i.errors - 0
                         ELSE coalesce(i.errors, '[]'::jsonb) END)
                   || jsonb_build_array(jsonb_build_object(
                        'at', now(), 'step', i.step, 'attempt', i.attempt, 'kind', 'lease',
                        'error', 'lease expired: worker ' || expired.locked_by || ' stopped heartbeating'
                                 || CASE WHEN i.recoveries >= $4::integer
                                         THEN '; recovery ' || (i.recoveries + 1) || ' of this step, past the limit of ' || $4::integer
                                         ELSE '' END)),
    finalized_at = CASE WHEN i.recoveries >= $4::integer THEN now() END,
    concurrency_shard = NULL,
    updated_at   = now()
FROM expired
WHERE i.id = expired.id
  AND i.status = 'executing'
RETURNING i.id, i.queue, i.machine, i.step, i.attempt, i.status::text AS status, i.parent_id
), credited AS (
  -- The gate slots the released executions held go back to their shards, locked in key order by
  -- the sub-select (see outcome_credit).
  UPDATE {schema}.gates AS g
  SET held = greatest(g.held - c.n, 0)
  FROM (SELECT l.key, l.shard, x.n
        FROM (SELECT e.concurrency_key AS key, e.concurrency_shard AS shard, count(*)::integer AS n
              FROM expired AS e JOIN rel ON rel.id = e.id
              WHERE e.concurrency_shard IS NOT NULL
              GROUP BY 1, 2) AS x
        JOIN {schema}.gates AS l ON l.key = x.key AND l.shard = x.shard
        ORDER BY l.key, l.shard
        FOR NO KEY UPDATE OF l) AS c
  WHERE g.key = c.key AND g.shard = c.shard
), finished AS (
  SELECT parent_id FROM rel WHERE status = 'failed' AND parent_id IS NOT NULL
), settled AS (
{{outcome_settle}}
)
SELECT false, id, queue, machine, step, attempt, status FROM rel
UNION ALL
SELECT true, id, queue, '', '', 0, 'available' FROM settled WHERE woke;

-- Await deadlines: wake parked instances whose deadline has passed (the reaper's sweep; the test
-- kit's FireTimeouts passes a horizon to fire them all). A wake, not a failure: attempt is
-- untouched, and the woken step sees no awaited signal (unless one arrived meanwhile).
--
-- Locks: due rows FOR NO KEY UPDATE SKIP LOCKED, soonest deadline first: concurrent sweepers
-- never wait on each other; a row being signalled right now is skipped (the signal wakes it).
--
-- $1 limit, $2 horizon in ms. Returns the woken rows.

-- name: fire_await_deadlines
WITH due AS (
  SELECT id
  FROM {schema}.instances
  WHERE status = 'awaiting'
    AND await_deadline <= now() + $2::bigint * interval '1 millisecond'
  ORDER BY await_deadline, id
  LIMIT $1
  FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.instances AS i
SET status = 'available', scheduled_at = now(), await_deadline = NULL, updated_at = now()
FROM due
WHERE i.id = due.id
  AND i.status = 'awaiting'
RETURNING i.id, i.queue, i.machine, i.step;

-- Runnable rows written in the database's future: the server's clock stepped back since (time
-- sync correcting a clock that ran ahead), so the due times it gave them lie ahead of the new
-- clock by as much as it went back, and a row that was due at once would wait that long. The
-- reaper that sees the clock go back makes the rows that were due when last written due now,
-- as overdue as they were then (due time less the write's time, counted back from now()). A row
-- not yet due at its write is left as it is: its due time may be one the caller named, which
-- counted back would come early, so it comes late instead, by as much as the clock went back;
-- so do parked rows' await deadlines. Ahead means more than a minute past the clock as it reads
-- now (clock_timestamp(): no row that committed can have been written after it).
--
-- Reads the ids in (@after, @upto] by primary key (the caller walks the table range by range).
-- Locks: the rows it re-dates, FOR NO KEY UPDATE SKIP LOCKED in id order, re-checked on their
-- newest version (a row a pick claims or a cancel ends meanwhile is not touched; sweepers never
-- re-date a row twice). Returns the queue of each row it re-dated.

-- name: redate_future
WITH ahead AS (
  SELECT id
  FROM {schema}.instances
  WHERE id > @after AND id <= @upto
    AND status = 'available' AND scheduled_at <= updated_at
    AND updated_at > clock_timestamp() + interval '1 minute'
  ORDER BY id
  FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.instances AS i
SET scheduled_at = now() - (i.updated_at - i.scheduled_at),
    updated_at   = now()
FROM ahead
WHERE i.id = ahead.id
  AND i.status = 'available' AND i.scheduled_at <= i.updated_at
  AND i.updated_at > clock_timestamp() + interval '1 minute'
RETURNING i.queue;

-- The database's clock, as the reaper reads it at each sweep to notice a step back, and the
-- highest instance id (where a re-dating walk ends; one descent of the primary key). No locks.
-- name: reaper_clock
SELECT now(), coalesce((SELECT max(id) FROM {schema}.instances), 0);

-- Gate reconciliation (the GC sweep).
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

-- GC of finished instances (the GC sweep).
--
-- Finished rows (done, failed, cancelled) are kept for a retention period after finalized_at
-- (Client.Get, Await, deduplication scopes that include finished instances, the operator's
-- queries), then deleted. One statement deletes at most a batch, chosen through the
-- instances_finalized index in (finalized_at, id) order: it reads O(batch) index entries, never
-- the whole table, however many rows are finished.
--
-- Within one sweep the caller pages with a keyset cursor ((finalized_at, id) of the last row the
-- previous batch deleted): each batch starts its index scan where the previous one stopped, so it
-- never steps over the entries of rows the sweep already deleted (dead until vacuum removes them)
-- or over the rows it has to keep (children a live parent still needs). The cost of a batch stays
-- the same from the first batch of a sweep to the last.
--
-- Signals: the inbox of a deleted instance goes with it (signals.instance_id is ON DELETE
-- CASCADE). A terminal outcome already cleared it; the cascade takes whatever is left.
--
-- Children: a parent's join step reads the children of its latest wave (pick.sql loads them when
-- join_due is set, and a retried join reads them again). So a finished child is deleted only when
-- its parent is finished or gone, or the child belongs to an older wave than the parent's latest
-- (no join reads an older wave again). A live parent's current wave stays until the parent
-- finishes (and then ages out like any row).
--
-- Locks: the rows it deletes, FOR UPDATE SKIP LOCKED in (finalized_at, id) order, the index's
-- order. Concurrent sweepers on several nodes never wait on each other, never deadlock and never
-- delete a row twice: a row another sweeper holds is skipped (and deleted by that sweeper), a row
-- another sweeper deleted is gone from this statement's snapshot or skipped while its delete is
-- uncommitted. FOR UPDATE (not NO KEY UPDATE) because a delete needs it; it conflicts with the
-- FOR KEY SHARE of a signal insert's foreign-key check, so a finished row being signalled right
-- now (the delivery then stores nothing: the target is finished) is left for the next sweep. The
-- parent check reads the parent row without locking it: a parent seen live keeps its children for
-- this sweep; a parent seen finished never runs a join again.
--
-- One machine at a time (@machine), under that machine's retention (@retention_ms), through
-- instances_finished_by_machine: a machine's sweep reads its own rows only, so it costs the same
-- whatever the other machines keep. @after_at, @after_id the cursor ('-infinity', 0 to start);
-- @batch. Returns how many rows it deleted and the cursor after them (NULL when it deleted none).

-- name: gc_instances
WITH doomed AS (
  SELECT i.id, i.finalized_at
  FROM {schema}.instances AS i
  WHERE i.status IN ('done', 'failed', 'cancelled')
    -- The machine as a range of one value and a row comparison, not an equality: with an
    -- equality the planner drops the machine from the order and may read instances_finalized,
    -- through every other machine's rows, in a generic plan that does not know how many the
    -- machine has. As written, only instances_finished_by_machine gives the order.
    AND i.machine >= @machine AND i.machine <= @machine
    AND (i.machine, i.finalized_at, i.id) > (@machine::text, @after_at::timestamptz, @after_id::bigint)
    AND i.finalized_at < now() - @retention_ms::bigint * interval '1 millisecond'
    AND (i.parent_id IS NULL
         OR NOT EXISTS (SELECT 1 FROM {schema}.instances AS p
                        WHERE p.id = i.parent_id
                          AND p.status IN ('available', 'executing', 'awaiting', 'joining')
                          AND (i.parent_wave IS NULL OR p.spawn_wave IS NULL
                               OR i.parent_wave >= p.spawn_wave)))
  ORDER BY i.machine, i.finalized_at, i.id
  LIMIT @batch
  FOR UPDATE OF i SKIP LOCKED
), gone AS (
  -- By primary key, as an array: a join here could become a merge join over the whole primary
  -- key in a prepared statement's generic plan.
  DELETE FROM {schema}.instances AS i
  WHERE i.id = ANY (ARRAY(SELECT id FROM doomed))
  RETURNING i.id
), last AS (
  SELECT finalized_at, id FROM doomed ORDER BY finalized_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM gone), (SELECT finalized_at FROM last), (SELECT id FROM last);

-- The machines that have finished rows, by a skip scan of instances_finished_by_machine: one
-- index probe per machine, however many rows each has. No locks.
-- name: gc_machines
WITH RECURSIVE m(machine) AS (
  (SELECT machine FROM {schema}.instances
   WHERE status IN ('done', 'failed', 'cancelled') ORDER BY machine LIMIT 1)
  UNION ALL
  SELECT (SELECT i.machine FROM {schema}.instances AS i
          WHERE i.status IN ('done', 'failed', 'cancelled') AND i.machine > m.machine
          ORDER BY i.machine LIMIT 1)
  FROM m WHERE m.machine IS NOT NULL
)
SELECT machine FROM m WHERE machine IS NOT NULL;

-- The retentions machines declare (migration 4's retention table). No locks.
-- name: retention_list
SELECT machine, retention_ms FROM {schema}.retention;

-- A client's machines at Start: @set, @ms (parallel) the machines that declare a retention,
-- @unset the ones that keep the default. The last client to start decides. Row locks on those
-- machines' rows, in machine order (two clients starting at once never deadlock).
-- name: retention_set
WITH s AS (
  INSERT INTO {schema}.retention AS r (machine, retention_ms, set_by)
  SELECT m, ms, @by FROM unnest(@set::text[], @ms::bigint[]) AS u(m, ms) ORDER BY m
  ON CONFLICT (machine) DO UPDATE SET retention_ms = excluded.retention_ms, set_by = excluded.set_by, set_at = now()
  RETURNING 1
)
DELETE FROM {schema}.retention WHERE machine = ANY(@unset::text[]);

-- Rate-limit buckets (the GC sweep, the reaper's report).

-- Prune buckets that carry no information: idle so long that they have been full for @full_ms
-- (a missing bucket is a full one). Full by the slowest rate and the largest burst the bucket
-- may be read with: the rate and burst it was last written with, and, for a limit configured
-- here, the configured ones (a limit slowed since the last write has not refilled by its old
-- rate). A bucket of a limit this node does not configure is judged by what it was written with
-- alone, and never pruned for being unknown here: nodes may configure different limits (a
-- rolling deploy adding one), and pruning a drained bucket would hand a full burst to the nodes
-- that use it. A removed limit's buckets refill by their own rate and are pruned then. Full for
-- a while, not just full: a pick takes a missing bucket as full at its transaction's start
-- (now()), which comes before its snapshot; a bucket pruned the moment it refilled, between a
-- pick's now() and its snapshot, would be full to that pick too early, by the refill in between.
-- @full_ms is far longer than that gap. Bounded per statement.
-- Locks: the buckets it deletes, FOR UPDATE SKIP LOCKED in key order (a bucket a pick is writing
-- is left for the next sweep; sweepers never wait on each other).
-- @r_names, @r_rates, @r_bursts: the configured limits; @full_ms: how long a bucket must have
-- been full. Returns how many it deleted.

-- name: gc_buckets
WITH stale AS (
  SELECT b.key
  FROM {schema}.buckets AS b
  LEFT JOIN unnest(@r_names::text[], @r_rates::double precision[], @r_bursts::double precision[]) AS rc(name, rate, burst)
    ON rc.name = split_part(b.key, ':', 1)
  WHERE b.tokens + least(b.rate, coalesce(rc.rate, b.rate)) * (extract(epoch FROM now() - b.updated_at) - @full_ms::bigint / 1000.0)
        >= greatest(b.burst, coalesce(rc.burst, b.burst))
  ORDER BY b.key
  LIMIT 1000
  FOR UPDATE OF b SKIP LOCKED
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

-- Fold the finished counts (finished_counts, which the triggers on instances append to) into one
-- row per (queue, status), dropping the ones that sum to zero. The sums are the same before and
-- after in every snapshot: the rows are deleted and their sums inserted in one statement.
-- Locks: the rows it deletes (their writers never update them, so no writer waits). A fold that
-- runs beside another waits for it on the rows both see, then skips those (gone by then); the
-- rows the other inserted are not in its snapshot, so nothing is counted twice or lost.
-- Returns how many rows it folded.

-- name: fold_finished_counts
WITH folded AS (
  DELETE FROM {schema}.finished_counts
  RETURNING queue, status, n
), summed AS (
  INSERT INTO {schema}.finished_counts (queue, status, n)
  SELECT queue, status, sum(n) FROM folded
  GROUP BY queue, status
  HAVING sum(n) <> 0
)
SELECT count(*) FROM folded;
