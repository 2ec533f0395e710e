-- Statement family: the pick.
--
-- One statement claims a batch of runnable rows of one queue in urgency order (priority, then
-- scheduled time, then id) and returns what the executor needs to run them.
--
-- Locks: the candidate rows are locked FOR NO KEY UPDATE SKIP LOCKED. SKIP LOCKED lets any number
-- of schedulers on any number of nodes pick from one queue without waiting on each other: a row
-- another pick (or a signal's wake, or an outcome) holds is simply not a candidate this time.
-- NO KEY UPDATE (not UPDATE) is enough for the claim/outcome mutual exclusion and is compatible
-- with the FOR KEY SHARE that foreign-key checks take on the row (a child's or a signal's insert
-- naming this row as its parent), so such an insert in flight never hides the row from the pick.
-- The UPDATE then turns the locked rows into claims: status executing, a claim token in
-- locked_by, a lease in locked_until (database clock), attempt + 1.
--
-- The same statement loads the inbox of every claimed row that ever received a signal (a
-- correlated subquery over signals_instance, skipped for the others), as of the statement's
-- snapshot: the step sees exactly these signals, and its progress consumes exactly the awaited
-- ones among them; a signal committed after this point is a latecomer and stays for the next
-- step.
--
-- For a parent whose join step is due (join_due), the same statement loads the children of its
-- latest wave: id, machine, status, result and last error, in id order.
--
-- $1 queue, $2 batch size, $3 claim token, $4 lease in ms,
-- $5 horizon in ms: rows scheduled up to now() + $5 are due (0 in production; the test kit's
--    Drain passes a large horizon to collapse delays).

-- name: pick
WITH candidates AS (
  SELECT id
  FROM {schema}.instances
  WHERE status = 'available'
    AND queue = $1
    AND scheduled_at <= now() + $5::bigint * interval '1 millisecond'
  ORDER BY priority, scheduled_at, id
  LIMIT $2
  FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE {schema}.instances AS i
SET status       = 'executing',
    attempt      = i.attempt + 1,
    locked_by    = $3,
    locked_until = now() + $4::bigint * interval '1 millisecond',
    updated_at   = now()
FROM candidates
WHERE i.id = candidates.id
RETURNING i.id, i.machine, i.step, i.state, i.attempt, i.max_attempts, i.priority,
          coalesce(i.correlation_key, ''), i.inserted_at, i.await_names, i.signalled IS TRUE,
          CASE WHEN i.signalled THEN
            (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'name', s.name, 'payload', s.payload,
                                                 'at', s.inserted_at) ORDER BY s.id)
             FROM {schema}.signals AS s WHERE s.instance_id = i.id)
          END,
          i.parent_id IS NOT NULL,
          CASE WHEN i.join_due THEN
            (SELECT jsonb_agg(jsonb_build_object('id', c.id, 'machine', c.machine, 'status', c.status,
                                                 'result', c.result, 'error', c.errors -> -1 ->> 'error')
                              ORDER BY c.id)
             FROM {schema}.instances AS c WHERE c.parent_id = i.id AND c.parent_wave = i.spawn_wave)
          END;
