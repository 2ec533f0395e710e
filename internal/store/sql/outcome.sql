-- Statement family: outcomes.
--
-- One statement applies the outcomes of many steps at once (group commit): parallel arrays, one
-- element per outcome, joined to the instance rows by id. Every row is fenced by its claim: it is
-- updated only while it still holds the exact claim token the worker got from its pick (a token
-- is present exactly while the row is executing: the instances_claim constraint). A row whose
-- claim ran out and was reclaimed (by the reaper or another node) does not match, is left
-- untouched, and is missing from the result: the caller reports it as stale and drops it. So a
-- late commit can never rewind a row, overwrite a newer owner's progress, or repeat a side
-- effect (consuming signals, clearing an inbox).
--
-- Locks: the UPDATE takes the row lock (FOR NO KEY UPDATE strength: no key column changes) on
-- each matched row. Claim tokens are unique per pick, so two committers never contend for a
-- row; the heartbeat skips rows it finds locked (SKIP LOCKED), so it never waits on this
-- statement and the two cannot deadlock. A signal delivery holds the row lock from its first
-- statement to its commit, so it and an outcome of the same row are strictly ordered.
--
-- The caller sends apply_outcomes, then (in the same implicit transaction, one round trip)
-- purge_terminal_inboxes for the rows that finished with signals in their inbox (as of the pick)
-- and recheck_parked for the rows that parked; each of those runs with a snapshot taken after
-- apply_outcomes holds its row locks. apply_outcomes returns each applied row's signalled flag
-- as of its commit: a row that finished and received its first signal while its step ran is
-- purged by a follow-up statement.
--
-- Kinds: 1 next, 2 retry, 3 done, 4 failed, 5 released (claim handed back untouched: attempt
-- restored, no error recorded, due after the delay), 6 await (park on signal names, step = the
-- step to run on wake).
--
-- Progress (next, await) consumes exactly the awaited signals the step saw (its Ctx.Awaited):
-- ($12, $13) pairs of (instance id, signal id) from the pick's inbox load. Signals it saw but did
-- not await stay in the inbox (an instance can await them later); latecomers stay too. Retry and
-- released consume nothing.
--
-- $1 id, $2 claim token, $3 kind, $4 step (NULL keeps), $5 state JSON text (NULL keeps),
-- $6 delay ms (next, retry, released), $7 result JSON text (done), $8 error kind (NULL: none),
-- $9 error text, $10 await names joined by the unit separator U+001F (names are printable), $11 await timeout ms (NULL: none),
-- $12/$13 seen (instance id, signal id) pairs (apply_outcomes_consuming only).

-- fragment: outcome_input
u AS (
  SELECT *
  FROM unnest($1::bigint[], $2::text[], $3::smallint[], $4::text[], $5::text[],
              $6::bigint[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[])
       AS u(id, owner, kind, step, state, delay_ms, result, err_kind, err_msg, await_names, await_ms)
)

-- fragment: outcome_update
UPDATE {schema}.instances AS i
  SET status         = (CASE u.kind WHEN 3 THEN 'done' WHEN 4 THEN 'failed' WHEN 6 THEN 'awaiting'
                                    ELSE 'available' END)::{schema}.status,
      step           = coalesce(u.step, i.step),
      state          = coalesce(u.state::jsonb, i.state),
      attempt        = CASE u.kind WHEN 1 THEN 0 WHEN 6 THEN 0 WHEN 5 THEN greatest(i.attempt - 1, 0)
                                   ELSE i.attempt END,
      scheduled_at   = CASE WHEN u.kind IN (1, 2, 5)
                            THEN now() + u.delay_ms * interval '1 millisecond'
                            ELSE i.scheduled_at END,
      locked_by      = NULL,
      locked_until   = NULL,
      result         = CASE u.kind WHEN 3 THEN u.result::jsonb ELSE i.result END,
      errors         = CASE WHEN u.err_kind IS NULL THEN i.errors
                            ELSE (CASE WHEN jsonb_array_length(coalesce(i.errors, '[]'::jsonb)) >= 20
                                       THEN i.errors - 0
                                       ELSE coalesce(i.errors, '[]'::jsonb) END)
                                 || jsonb_build_array(jsonb_build_object(
                                      'at', now(), 'step', i.step, 'attempt', i.attempt,
                                      'kind', u.err_kind, 'error', u.err_msg))
                       END,
      -- Await names live until the woken step's outcome: a retry of that step still needs them.
      await_names    = CASE WHEN u.kind = 6 THEN string_to_array(u.await_names, E'\x1f')
                            WHEN u.kind IN (2, 5) THEN i.await_names
                            ELSE NULL END,
      await_deadline = CASE WHEN u.kind = 6 AND u.await_ms IS NOT NULL
                            THEN now() + u.await_ms * interval '1 millisecond' END,
      finalized_at   = CASE WHEN u.kind IN (3, 4) THEN now() END,
      updated_at     = now()
  FROM u
  WHERE i.id = u.id
    -- The token alone is the fence (no "status = 'executing'" here): that predicate would let
    -- the planner read the whole instances_executing index, dead entries and all, instead of
    -- looking the rows up by id.
    AND i.locked_by = u.owner
  RETURNING i.id, u.owner, i.signalled, u.kind

-- The outcome statement. The variant that also consumes the signals steps saw is used only for
-- batches where a step saw any; the plain one is the hot path.

-- name: apply_outcomes
WITH {{outcome_input}}
{{outcome_update}};

-- name: apply_outcomes_consuming
WITH {{outcome_input}}, upd AS (
  {{outcome_update}}
), consumed AS (
  DELETE FROM {schema}.signals AS s
  USING unnest($12::bigint[], $13::bigint[]) AS c(instance_id, signal_id), upd
  WHERE s.id = c.signal_id
    AND c.instance_id = upd.id
    AND upd.kind IN (1, 6)
)
SELECT id, owner, signalled, kind FROM upd;


-- The inboxes of instances that just finished: a terminal outcome clears the whole inbox,
-- latecomers included. A fresh snapshot (after apply_outcomes took the row locks) sees every
-- signal whose delivery committed before; a delivery after it finds the instance finished and
-- stores nothing. Only rows that really are finished are touched (an id whose outcome was stale
-- belongs to another owner).
-- Locks: the deleted signal rows.
-- $1 ids.

-- name: purge_terminal_inboxes
DELETE FROM {schema}.signals AS s
USING {schema}.instances AS i
WHERE s.instance_id = ANY($1::bigint[])
  AND i.id = s.instance_id
  AND i.status IN ('done', 'failed', 'cancelled');

-- The park's re-check: wake at once the instances that just parked but already have a signal
-- they await (one delivered while the step ran, after the pick's inbox load). With the delivery's
-- own flip (see signal.sql) this closes the lost-wakeup race under READ COMMITTED: whichever
-- takes the row lock second sees the other's committed work.
-- Locks: the row lock of each instance it wakes.
-- $1 ids. Returns the woken ids and their queues.

-- name: recheck_parked
UPDATE {schema}.instances AS i
SET status = 'available', scheduled_at = now(), updated_at = now()
WHERE i.id = ANY($1::bigint[])
  AND i.status = 'awaiting'
  AND EXISTS (SELECT 1 FROM {schema}.signals AS s
              WHERE s.instance_id = i.id AND s.name = ANY(i.await_names))
RETURNING i.id, i.queue;
