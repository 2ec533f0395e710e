-- Statement family: operator actions (cancel, retry). Rare, so they favour plainness over round
-- trips: each runs as a few statements in one transaction that first locks the instance row.
--
-- Locks: op_lock takes the instance's row lock FOR NO KEY UPDATE and waits for it (an operator's
-- action waits for an outcome being committed on the row, then sees its result; under READ
-- COMMITTED the locking read returns the newest version). Every later statement of the action
-- touches that row, its gate counter, its parent and its inbox, in the same order as an outcome
-- does (the row, then the gate counter, then the parent), so an action and the committers cannot
-- deadlock.

-- $1 id. The row as it is now, locked, with its parent's status (read, not locked).
-- name: op_lock
SELECT i.status::text, i.machine, i.step, i.queue, i.concurrency_key, i.concurrency_shard, i.parent_id,
       (SELECT p.status::text FROM {schema}.instances AS p WHERE p.id = i.parent_id)
FROM {schema}.instances AS i
WHERE i.id = $1
FOR NO KEY UPDATE OF i;

-- Cancel: a live instance becomes terminal. A claim is cleared with it, so the running step's
-- late outcome no longer matches its fence and is dropped (outcome.stale); its gate slot is
-- credited by op_credit. The error history says who cancelled and why.
-- $1 id, $2 reason.
-- name: op_cancel
UPDATE {schema}.instances
SET status            = 'cancelled',
    locked_by         = NULL,
    locked_until      = NULL,
    concurrency_shard = NULL,
    await_deadline    = NULL,
    errors            = (CASE WHEN jsonb_array_length(coalesce(errors, '[]'::jsonb)) >= 20
                              THEN errors - 0
                              ELSE coalesce(errors, '[]'::jsonb) END)
                        || jsonb_build_array(jsonb_build_object(
                             'at', now(), 'step', step, 'attempt', attempt, 'kind', 'cancel', 'error', $2::text)),
    finalized_at      = now(),
    updated_at        = now()
WHERE id = $1
  AND status IN ('available', 'executing', 'awaiting', 'joining');

-- The gate slot a cancelled execution held goes back to its shard.
-- $1 key, $2 shard.
-- name: op_credit
UPDATE {schema}.gates
SET held = greatest(held - 1, 0)
WHERE key = $1 AND shard = $2;

-- A cancelled child settles its parent's join like any finished child (see outcome_settle): the
-- last one makes a joining parent runnable.
-- $1 parent id. Returns the parent's queue and whether it woke.
-- name: op_settle
UPDATE {schema}.instances
SET pending_children = pending_children - 1,
    status           = CASE WHEN pending_children = 1 THEN 'available'::{schema}.status ELSE status END,
    scheduled_at     = CASE WHEN pending_children = 1 THEN now() ELSE scheduled_at END,
    updated_at       = now()
WHERE id = $1
  AND status = 'joining'
RETURNING queue, status = 'available';

-- A finished instance's inbox goes with it.
-- $1 id.
-- name: op_purge_inbox
DELETE FROM {schema}.signals WHERE instance_id = $1;

-- Retry: a failed or cancelled instance becomes runnable again at step $2 with fresh attempts;
-- its state and error history stay. It joins its queue's fair order as a row due now without a
-- tag (a row cancelled before it ran keeps the tag it had, which must not bring it forward).
-- $1 id, $2 step.
-- name: op_retry
UPDATE {schema}.instances
SET status        = 'available',
    step          = $2,
    attempt       = 0,
    recoveries    = 0,
    scheduled_at  = now(),
    result        = NULL,
    await_names   = NULL,
    await_deadline = NULL,
    finalized_at  = NULL,
    fair_tag      = NULL,
    updated_at    = now()
WHERE id = $1
  AND status IN ('failed', 'cancelled');

-- Retry's other conflict: children of the instance still live. A parent cancelled (or failed)
-- while it joined would run its join step at once if retried, reading those children
-- unfinished, and they would settle nothing when they finish. Read-only (instances_parent).
-- $1 id. Returns how many.
-- name: op_live_children
SELECT count(*) FROM {schema}.instances
WHERE parent_id = $1 AND status IN ('available', 'executing', 'awaiting', 'joining');

-- Retry's conflict: a live instance of the same machine that holds the retried instance's
-- correlation key (inserted after it finished). Retrying would make two live instances with one
-- key, which the unique index refuses. Read-only.
-- $1 id. Returns the holder's id.
-- name: op_key_holder
SELECT o.id
FROM {schema}.instances AS i
JOIN {schema}.instances AS o ON o.machine = i.machine AND o.correlation_key = i.correlation_key
WHERE i.id = $1
  AND o.id <> i.id
  AND o.status IN ('available', 'executing', 'awaiting', 'joining')
LIMIT 1;
