-- Statement family: signals.
--
-- Delivery is one statement. Its UPDATE of the target row comes first: it takes the row lock
-- (waiting for an outcome or a park of that row in flight), re-reads the row's newest version,
-- and decides there, in its SET, whether this signal wakes a parked instance (status awaiting
-- and the name among await_names: back to available, due now). The flip is never decided in a
-- WHERE over an older snapshot: with the park's re-check (recheck_parked in outcome.sql) this is
-- what makes a signal racing a park unable to strand it. The signal is stored only for a live
-- target the UPDATE matched; a finished or missing target gets nothing stored and no row
-- returned (ErrNoTarget).
--
-- Locks: the target instance row (the UPDATE's lock, held to commit; the signal insert's
-- foreign-key check then needs nothing more), the new signal row.
--
-- $1 target id (NULL: by key), $2 machine, $3 correlation key, $4 name, $5 payload JSON text.
-- Returns the signal id, the instance id, whether this signal made it runnable, and its queue.

-- name: deliver_signal
WITH target AS (
  UPDATE {schema}.instances AS i
  SET status       = CASE WHEN i.status = 'awaiting' AND $4::text = ANY(i.await_names)
                          THEN 'available'::{schema}.status ELSE i.status END,
      scheduled_at = CASE WHEN i.status = 'awaiting' AND $4::text = ANY(i.await_names)
                          THEN now() ELSE i.scheduled_at END,
      signalled    = true,
      updated_at   = now()
  WHERE i.id = coalesce($1::bigint,
                        (SELECT k.id FROM {schema}.instances AS k
                         WHERE k.machine = $2::text AND k.correlation_key = $3::text
                           AND k.status IN ('available', 'executing', 'awaiting', 'joining')))
    AND i.status IN ('available', 'executing', 'awaiting', 'joining')
  -- A flip sets scheduled_at to this transaction's now(); nothing else does that to a live row.
  RETURNING i.id, i.queue, i.status = 'available' AND i.scheduled_at = now() AS woke
), stored AS (
  INSERT INTO {schema}.signals (instance_id, name, payload)
  SELECT id, $4::text, $5::text::jsonb FROM target
  RETURNING id, instance_id
)
SELECT stored.id, stored.instance_id, target.woke, target.queue
FROM stored JOIN target ON target.id = stored.instance_id;
