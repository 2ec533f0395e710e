-- Statement family: claims (heartbeat, reaper, startup reclaim).
--
-- Leases are compared with the database clock only (now()), never with a time computed on a
-- worker, so clock skew between nodes cannot reclaim a live claim early.

-- Heartbeat: extend the leases of every claim a client holds, in one statement per interval,
-- and report the claims it no longer holds.
--
-- Locks: the owned rows are locked FOR NO KEY UPDATE SKIP LOCKED in id order, so the heartbeat
-- never waits: a row it skips is being committed by its outcome at that moment (or read by a
-- foreign-key check, which does not conflict). The final SELECT reads the statement's snapshot
-- without locks: a claim is reported lost only if the row is no longer executing under that
-- token, never merely because it was skipped.
--
-- $1 ids, $2 claim tokens, $3 lease in ms. Returns the ids of lost claims.

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
SELECT mine.id
FROM mine
WHERE NOT EXISTS (
  SELECT 1 FROM {schema}.instances AS i
  WHERE i.id = mine.id AND i.locked_by = mine.owner
);

-- Release expired claims: the reaper's sweep ($2 NULL: every claim whose lease has run out)
-- and a starting scheduler's reclaim of its dead predecessor ($2 the worker-id prefix shared
-- with the predecessor: only claims of that prefix, once their last heartbeat is older than $3 ms
-- allows, i.e. locked_until < now() + $3; a live worker with the same prefix keeps its leases
-- fresher than that, so a name collision can never release a live claim). Other nodes' expired
-- claims are the reaper's: a node that runs no reaper releases nothing but its own.
--
-- A released row becomes available again (the crashed try counts as an attempt) or, with no
-- attempts left, failed; either way the error history says the lease was lost. A gate slot it
-- held is credited back; a child that fails here settles its parent's join like any finished
-- child (outcome_settle).
--
-- Locks: candidate rows FOR NO KEY UPDATE SKIP LOCKED in id order: concurrent sweepers on many
-- nodes never wait on each other, never deadlock, and never release the same row twice. The
-- lock re-checks the WHERE clause on the newest row version, so a claim whose outcome committed
-- meanwhile is not touched.
--
-- $1 limit, $2 worker-id prefix or NULL, $3 staleness slack in ms.

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
SET status       = (CASE WHEN i.attempt >= i.max_attempts THEN 'failed' ELSE 'available' END)::{schema}.status,
    scheduled_at = now(),
    locked_by    = NULL,
    locked_until = NULL,
    errors       = (CASE WHEN jsonb_array_length(coalesce(i.errors, '[]'::jsonb)) >= 20
                         THEN i.errors - 0
                         ELSE coalesce(i.errors, '[]'::jsonb) END)
                   || jsonb_build_array(jsonb_build_object(
                        'at', now(), 'step', i.step, 'attempt', i.attempt, 'kind', 'lease',
                        'error', 'lease expired: worker ' || expired.locked_by || ' stopped heartbeating')),
    finalized_at = CASE WHEN i.attempt >= i.max_attempts THEN now() END,
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
